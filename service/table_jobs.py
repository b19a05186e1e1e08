"""Cost tables across workers: the missing entries of a table build, as RQ jobs.

::

    requester (a solve's horse)                                     every ``autopar worker``
    build_cost_tables ─ RQTableBuilder.build(batches) ─ enqueue ─> queue "{queue}:tables"
          ^                 │ polls the shared store for each batch's keys        │ build_table_batch()
          │                 │ steals batches still queued (LREM: one side wins)   │ computes, then writes
          │                 │ takes over a batch whose worker died                │ "cost:" + key entries
          └─ reads the store; computes whatever is still missing itself <─────────┘

Workers serve the tables queue before the plans queue (:func:`autopar_service.worker.make_worker`),
so a solve waiting for its tables is not stuck behind other solves.  Nothing is lost when a
worker dies mid-batch: a batch is done only when all of its keys are in the store; a started
batch whose worker's liveness key (:func:`~autopar_service.worker.alive_key`) has expired, or
whose job failed, is computed by the requester.  The requester also works: it takes queued
batches off the tail of the queue while the workers take them off the head, so with one
worker (the requester's own, busy with the solve) the build still completes.
Batch payloads are JSON (:func:`autopar.cost.remote_tables.compute_remote_batch`; no pickle).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, get_current_job
from rq.job import JobStatus as RQStatus
from rq.serializers import JSONSerializer

from autopar.cost.remote_tables import RemoteBatch, compute_remote_batch
from autopar.infra.progress import Deadline
from autopar_cache.base import PrefixedStore
from autopar_cache.errors import CacheUnavailable
from autopar_cache.redis_store import RedisStore, connect
from autopar_service.settings import Settings
from autopar_service.worker_keys import alive_key, tables_queue_name

__all__ = ["BATCH_FUNC", "COST_PREFIX", "RQTableBuilder", "build_table_batch"]

log = logging.getLogger("autopar.service.tables")

BATCH_FUNC = "autopar_service.table_jobs.build_table_batch"
COST_PREFIX = "cost:"
"""Where cost-table entries live in the shared store (under the store's own prefix)."""
POLL_S = 0.05
"""Pause between two looks at the batches when there is nothing to take, seconds."""
LOST_CHECK_S = 0.5
"""Pause between two looks for batches whose worker died, seconds."""
BATCH_TIMEOUT_S = 600
"""RQ's time-out of one batch job, seconds (a batch is a few seconds of work)."""


def build_table_batch(prefix: str, ttl_s: float | None, keys: list[str], payload: dict[str, Any]) -> int:
    """RQ entry point (a worker's horse): compute one batch and write its entries to the
    shared store under ``prefix``; returns how many."""
    from autopar_service.settings import load_settings

    rq_job = get_current_job()
    settings = load_settings()
    if rq_job is not None:
        client = rq_job.connection
    else:
        client = connect(str(settings.redis_url), socket_timeout_s=settings.redis_timeout_s)
    store = PrefixedStore(RedisStore(str(settings.redis_url), client=client), prefix, ttl_s)
    entries = compute_remote_batch(payload)
    store.put_many(dict(zip(keys, entries, strict=True)))
    return len(entries)


class RQTableBuilder:
    """:class:`autopar.cost.remote_tables.RemoteTableBuilder` on the RQ tables queue (module doc).

    ``help_out=False`` leaves every batch to the workers (the requester only waits, and
    computes the batches of workers that died): what a benchmark of 1 vs 2 workers wants."""

    def __init__(self, store: RedisStore, settings: Settings, *, help_out: bool = True) -> None:
        self.store = store
        self.client: redis.Redis = store.client
        self.settings = settings
        self.help_out = help_out
        self.queue = Queue(tables_queue_name(settings), connection=self.client, serializer=JSONSerializer)
        self.entries = PrefixedStore(store, COST_PREFIX, settings.cost_ttl_s)
        self.stats: dict[str, int] = {"batches": 0, "by_workers": 0, "by_requester": 0, "taken_over": 0}
        self.workers_seen: set[str] = set()
        """Names of the workers whose batches arrived."""
        self._unlisted_since: dict[str, float] = {}
        """When each queued batch was first seen in no list (dequeued, not started)."""
        self._next_lost_check = 0.0

    def build(self, batches: list[RemoteBatch], deadline: Deadline, progress: Callable[[int], None]) -> None:
        """Every batch built by a worker or here; when Redis fails meanwhile, what is not in
        is left to the caller, which builds it in this process (a cost table never fails a
        solve that could go on without Redis: the solve outlives an outage)."""
        try:
            self._build(batches, deadline, progress)
        except (redis.exceptions.RedisError, CacheUnavailable) as exc:
            what = type(exc).__name__
            log.warning("cost tables across workers stopped (%s): the rest are built here", what)

    def _build(self, batches: list[RemoteBatch], deadline: Deadline, progress: Callable[[int], None]) -> None:
        pending = {self._enqueue(b): b for b in batches}
        self.stats["batches"] += len(batches)
        done = 0
        while pending and not deadline.expired():
            for job_id in self._arrived(pending):
                done += len(pending.pop(job_id).keys)
                self.stats["by_workers"] += 1
                self.workers_seen.add(self._worker_of(job_id))
                progress(done)
            taken = self._take_one(pending)
            if taken is None:
                time.sleep(POLL_S)
                continue
            batch = pending.pop(taken)
            self.client.delete(Job.key_for(taken))  # its job record: nobody runs it now
            self.entries.put_many(dict(zip(batch.keys, compute_remote_batch(batch.payload), strict=True)))
            done += len(batch.keys)
            progress(done)
        for job_id in pending:  # out of time: the build computes the rest (and raises at its deadline)
            if self.queue.remove(job_id):
                self.client.delete(Job.key_for(job_id))

    def _enqueue(self, batch: RemoteBatch) -> str:
        job = self.queue.enqueue(
            BATCH_FUNC,
            COST_PREFIX,
            self.settings.cost_ttl_s,
            batch.keys,
            batch.payload,
            job_id=f"autopar-tables-{uuid.uuid4().hex}",
            job_timeout=BATCH_TIMEOUT_S,
            result_ttl=60,
            failure_ttl=600,
            description=f"autopar cost tables: {len(batch.keys)} {batch.payload['phase']} entries",
        )
        return str(job.id)

    def _arrived(self, pending: dict[str, RemoteBatch]) -> list[str]:
        """The batches all of whose keys are in the store."""
        names = {job_id: [self._name(k) for k in b.keys] for job_id, b in pending.items()}
        with self.client.pipeline(transaction=False) as pipe:
            for job_names in names.values():
                pipe.exists(*job_names)
            counts = pipe.execute()
        return [job_id for (job_id, n), c in zip(names.items(), counts, strict=True) if c == len(n)]

    def _worker_of(self, job_id: str) -> str:
        try:
            return str(Job.fetch(job_id, connection=self.client, serializer=JSONSerializer).worker_name)
        except NoSuchJobError:
            return "?"

    def _name(self, key: str) -> str:
        return self.store.prefix + COST_PREFIX + key

    def _take_one(self, pending: dict[str, RemoteBatch]) -> str | None:
        """A batch this process computes now: one still queued (taken off the queue's tail,
        only when helping out), else one whose worker died or whose job failed."""
        if self.help_out:
            for job_id in reversed(list(pending)):
                if self.queue.remove(job_id):  # LREM: the worker's dequeue and this never both win
                    self.stats["by_requester"] += 1
                    return job_id
        if time.monotonic() < self._next_lost_check:
            return None
        self._next_lost_check = time.monotonic() + LOST_CHECK_S
        for job_id, batch in pending.items():
            if self._lost(job_id, batch):
                log.warning("cost-table batch %s: its worker died; computing it here", job_id)
                self.stats["taken_over"] += 1
                return job_id
        return None

    def _lost(self, job_id: str, batch: RemoteBatch) -> bool:
        """Whether the batch will not arrive: its job failed, vanished, or ended without
        writing; or started on a worker that no longer renews its liveness key; or left
        the queue and has not started for ``worker_lost_after_s``."""
        try:
            job = Job.fetch(job_id, connection=self.client, serializer=JSONSerializer)
            status = job.get_status()
        except NoSuchJobError:
            return True
        if status == RQStatus.FINISHED:  # (it may have finished since the keys were looked at)
            return not self._arrived({job_id: batch})
        if status in (RQStatus.FAILED, RQStatus.STOPPED, RQStatus.CANCELED):
            return True
        if status == RQStatus.STARTED and job.worker_name:
            return not self.client.exists(alive_key(job.worker_name))
        # dequeued (BLPOP) by a worker that died before it marked the job started: in no list
        # (a live worker leaves that state within milliseconds)
        if self.client.lpos(self.queue.key, job_id) is not None:
            self._unlisted_since.pop(job_id, None)
            return False
        since = self._unlisted_since.setdefault(job_id, time.monotonic())
        return time.monotonic() - since > self.settings.worker_lost_after_s
