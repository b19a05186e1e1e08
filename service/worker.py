"""``autopar worker``: an RQ worker that survives Redis outages.

RQ's worker quits on the first Redis error outside its dequeue loop (while
monitoring a running job, or on the heartbeat after one), and once Redis comes
back without its data the worker is no longer registered, so ``/readyz``
reports no workers.  :class:`ResilientWorker` changes three things:

* a Redis error while a job runs is logged and the worker keeps waiting for its
  work horse (the horse retries saving its plan and the job's end for
  ``outage_grace_s``: a finished solve is not lost);
* every heartbeat re-registers the worker (``SADD``, idempotent), and an idle
  worker heartbeats every :data:`IDLE_HEARTBEAT_S` s, so ``/readyz`` is right
  within seconds of Redis returning;
* every heartbeat also renews a liveness key with a short TTL
  (``worker_alive_ttl_s``, :func:`alive_key`): RQ's own registration lives for
  about a minute after a SIGKILL, the liveness key for seconds, and ``/readyz``
  counts only workers whose key is there;
* reconnection backs off from 0.5 s to at most :data:`MAX_BACKOFF_S` s.

:func:`run_worker` restarts the work loop (new registration) should it still
end on a Redis error, and stops only on SIGTERM / SIGINT or in burst mode.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from redis.exceptions import RedisError
from rq import Queue, Worker, worker_registration
from rq.serializers import JSONSerializer
from rq.worker import WorkerStatus

from autopar_cache.redis_store import connect
from autopar_service.settings import Settings
from autopar_service.worker_keys import TABLES_QUEUE_SUFFIX, alive_key, tables_queue_name

__all__ = [
    "IDLE_HEARTBEAT_S",
    "MAX_BACKOFF_S",
    "ResilientWorker",
    "alive_key",
    "make_worker",
    "run_worker",
    "tables_queue_name",
]

log = logging.getLogger("autopar.service.worker")

IDLE_HEARTBEAT_S = 2
"""Longest blocking dequeue of an idle worker, s: also how soon it re-registers after an outage."""
MAX_BACKOFF_S = 4.0
"""Longest pause between two reconnection attempts, s."""


class ResilientWorker(Worker):
    """An RQ worker that rides out Redis outages (see the module docstring)."""

    max_connection_wait_time = MAX_BACKOFF_S
    alive_ttl_s: float = 10.0
    """TTL of the liveness key, seconds (``make_worker`` sets ``worker_alive_ttl_s``)."""

    @property
    def dequeue_timeout(self) -> int:
        return IDLE_HEARTBEAT_S

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        try:
            super().heartbeat(timeout, pipeline)
            worker_registration.register(self, pipeline)
            target = pipeline if pipeline is not None else self.connection
            target.set(alive_key(self.name), b"1", px=max(1, int(self.alive_ttl_s * 1000)))
        except RedisError as exc:
            if pipeline is not None:
                raise
            log.warning("worker %s: heartbeat failed (%s); retrying", self.name, exc)

    def execute_job(self, job: Any, queue: Any) -> None:
        """Cost-table batches (:mod:`autopar_service.table_jobs`) run in this process, as
        RQ's ``SimpleWorker`` runs jobs: they are short and pure, and this process's caches
        (boxing lowerings per mesh, op rules) stay warm from one batch to the next, where a
        forked horse starts cold every time.  Plans still run in a horse (isolation, the
        kill on a time-out).  A worker killed mid-batch loses nothing: its liveness key
        expires and the requester computes the batch (``RQTableBuilder``)."""
        if not queue.name.endswith(TABLES_QUEUE_SUFFIX):
            super().execute_job(job, queue)
            return
        self.heartbeat()
        execution = self.prepare_execution(job)
        self.perform_job(job, queue, execution)
        self.set_state(WorkerStatus.IDLE)

    def maintain_heartbeats(self, job: Any, execution: Any) -> None:
        try:
            super().maintain_heartbeats(job, execution)
        except RedisError as exc:
            log.warning("worker %s: Redis unavailable while job %s runs (%s)", self.name, job.id, exc)


def make_worker(settings: Settings, name: str | None = None) -> ResilientWorker:
    """A worker on the cost-table queue (:mod:`autopar_service.table_jobs`), then on
    ``settings.queue_name`` (JSON serializer, short heartbeats)."""
    # imported once in the parent so each horse forks warm: the planner, and the search that
    # it imports only when it solves
    import autopar_service.table_jobs  # noqa: F401  (its batches run in horses too)
    import autopar_solver.planner
    import autopar_solver.solve  # noqa: F401

    client = connect(str(settings.redis_url), socket_timeout_s=settings.redis_timeout_s)
    queue = Queue(settings.queue_name, connection=client, serializer=JSONSerializer)
    # cost-table batches first: a solve on another worker waits for them
    tables = Queue(tables_queue_name(settings), connection=client, serializer=JSONSerializer)
    worker = ResilientWorker(
        [tables, queue],
        connection=client,
        serializer=JSONSerializer,
        name=name,
        worker_ttl=max(10, int(3 * settings.worker_lost_after_s)),
        job_monitoring_interval=max(1, int(settings.heartbeat_interval_s)),
    )
    worker.alive_ttl_s = settings.worker_alive_ttl_s
    return worker


def _wait_for_redis(worker: Worker) -> None:
    delay = 0.5
    while True:
        try:
            worker.connection.ping()
            return
        except RedisError as exc:
            log.warning("worker %s: Redis unavailable (%s); retrying in %.1f s", worker.name, exc, delay)
            time.sleep(delay)
            delay = min(2 * delay, MAX_BACKOFF_S)


def _exit_now(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def run_worker(settings: Settings, name: str | None, *, burst: bool, log_level: str) -> None:
    """Work until stopped (SIGTERM / SIGINT) or, with ``burst``, until the queue is empty."""
    worker = make_worker(settings, name)
    while True:
        # between work loops (waiting for Redis) a signal stops at once; work() installs RQ's own
        signal.signal(signal.SIGTERM, _exit_now)
        signal.signal(signal.SIGINT, _exit_now)
        _wait_for_redis(worker)
        try:
            worker.connection.delete(worker.key)  # our own registration from before an outage
            worker.work(burst=burst, logging_level=log_level)
        except RedisError as exc:
            log.warning("worker %s: work loop ended on a Redis error (%s)", worker.name, exc)
        if burst or worker._shutdown_requested_date is not None:  # SIGTERM / SIGINT
            return
        log.warning("worker %s: restarting its work loop", worker.name)
        worker = make_worker(settings, worker.name)
