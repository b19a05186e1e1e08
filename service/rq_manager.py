"""The API's side of jobs with Redis: :class:`RQJobManager` enqueues jobs on the RQ queue, reports
their records, reconciles them with RQ's own status, cancels them, and reaps jobs whose worker
was lost (the janitor).  The worker's side, the job records and the diagram:
:mod:`autopar_service.rq_jobs`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError
from rq import Queue, Retry
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.job import JobStatus as RQStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.worker_registration import get_keys
from starlette.concurrency import run_in_threadpool

from autopar_cache.errors import CacheUnavailable
from autopar_cache.redis_store import RedisStore, connect_async, redact_url
from autopar_service.jobs import JobInfo, JobStatus
from autopar_service.rq_jobs import _PREFIX, SOLVE_FUNC, JobRecords, _finish, _requeued
from autopar_service.settings import Settings
from autopar_service.worker import alive_key

__all__ = ["RQJobManager"]

log = logging.getLogger("autopar.service.rq")

_SEEN_LIMIT = 10_000
"""Terminal jobs one API process remembers having reported (the oldest forgotten first)."""
RECONCILE_EVERY_S = 2.0
"""How often a followed job's record is completed with RQ's own view (a thread's work)."""


class _Watch:
    """One job followed for every waiter of :meth:`RQJobManager.wait`."""

    def __init__(self) -> None:
        self.info: JobInfo | None = None
        self.error: CacheUnavailable | None = None
        self.polled = False
        self.waiters = 0
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def fire(self) -> None:
        """Wake every waiter (each then waits on the next event)."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()


def _moved(before: JobInfo | None, after: JobInfo | None) -> bool:
    if before is None or after is None:
        return before is not after
    return (before.version, before.status) != (after.version, after.status)


class RQJobManager:
    """:class:`autopar_service.jobs.JobManager` on an RQ queue."""

    kind = "rq"

    def __init__(
        self,
        settings: Settings,
        store: RedisStore,
        on_terminal: Callable[[JobInfo], None] | None = None,
    ) -> None:
        if settings.redis_url is None:
            raise ValueError("RQJobManager needs settings.redis_url")
        self.settings = settings
        self.store = store
        self.client = store.client
        self.on_terminal = on_terminal
        self.records = JobRecords(self.client, settings.job_ttl_s)
        self.queue = Queue(settings.queue_name, connection=self.client, serializer=JSONSerializer)
        self.aclient = connect_async(
            settings.redis_url,
            socket_timeout_s=settings.redis_timeout_s,
            max_connections=settings.redis_max_connections,
        )
        """The asyncio client of :meth:`wait` (created here, connected on first use)."""
        self._watches: dict[str, _Watch] = {}
        self._janitor: asyncio.Task[None] | None = None
        self._seen_terminal: OrderedDict[str, None] = OrderedDict()
        """Terminal jobs this API process already reported to ``on_terminal`` (bounded)."""

    def _unavailable(self, what: str, exc: Exception) -> CacheUnavailable:
        return CacheUnavailable(
            "queue_unavailable",
            f"Redis at {redact_url(str(self.settings.redis_url))} failed during {what}: {exc}; "
            "jobs cannot be queued or tracked until it is back",
        )

    async def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return await run_in_threadpool(fn)
        except RedisError as exc:
            raise self._unavailable(what, exc) from None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._janitor = asyncio.create_task(self._janitor_loop(), name="autopar-janitor")

    async def close(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        for watch in list(self._watches.values()):
            if watch.task is not None:
                watch.task.cancel()
        with contextlib.suppress(RedisError, OSError):
            await self.aclient.aclose()

    async def _janitor_loop(self) -> None:
        # after a Redis outage, heartbeats written before it may have expired: give the
        # workers worker_lost_after_s of healthy Redis to beat again before reaping
        quiet_until = 0.0
        while True:
            await asyncio.sleep(self.settings.janitor_interval_s)
            try:
                if time.monotonic() >= quiet_until:
                    await run_in_threadpool(self.reap_lost)
                else:
                    await run_in_threadpool(self.client.ping)
            except RedisError as exc:
                log.warning("janitor: Redis unavailable: %s", exc)
                quiet_until = time.monotonic() + self.settings.worker_lost_after_s

    # ------------------------------------------------------------ API

    async def submit(self, job_id: str, payload: dict[str, Any], *, refresh: bool = False) -> JobInfo:
        info: JobInfo = await self._call("submit", lambda: self._submit(job_id, payload, refresh))
        return info

    def _submit(self, job_id: str, payload: dict[str, Any], refresh: bool) -> JobInfo:
        lock = self.client.lock(f"{_PREFIX}lock:submit:{job_id}", timeout=30, blocking_timeout=10)
        with lock:
            current = self._reconcile(job_id)
            if current is not None and not current.terminal:
                return current
            if current is not None and current.status is JobStatus.SUCCEEDED and not refresh:
                return current
            with contextlib.suppress(NoSuchJobError):
                Job.fetch(job_id, connection=self.client, serializer=JSONSerializer).delete()
            info = JobInfo(job_id)
            self.records.save(info)
            options = payload.get("options") or {}
            limit = float(options.get("time_limit_s", self.settings.default_time_limit_s))
            self.queue.enqueue(
                SOLVE_FUNC,
                job_id,
                {**payload, "refresh": refresh},
                job_id=job_id,
                job_timeout=int(limit + self.settings.job_timeout_margin_s) + 1,
                result_ttl=int(self.settings.job_ttl_s),
                failure_ttl=int(self.settings.job_ttl_s),
                retry=Retry(max=self.settings.job_retries) if self.settings.job_retries else None,
                description=f"autopar plan {job_id[:12]}",
            )
            return info

    async def get(self, job_id: str) -> JobInfo | None:
        info: JobInfo | None = await self._call("get", lambda: self._reconcile(job_id))
        if info is not None and info.terminal:
            self._observe(info)
        return info

    def _observe(self, info: JobInfo) -> None:
        """Report a job's end once per API process (the horse wrote it, not this process)."""
        if info.id in self._seen_terminal:
            return
        self._seen_terminal[info.id] = None
        while len(self._seen_terminal) > _SEEN_LIMIT:
            self._seen_terminal.popitem(last=False)
        if self.on_terminal is not None:
            self.on_terminal(info)

    def _reconcile(self, job_id: str) -> JobInfo | None:
        """The job record, completed with what RQ knows when the horse could not write it."""
        info = self.records.load(job_id)
        if info is None or info.terminal:
            return info
        try:
            rq_job = Job.fetch(job_id, connection=self.client, serializer=JSONSerializer)
            status = rq_job.get_status()
        except NoSuchJobError:
            if time.time() - info.created_at < 5 or self.records.alive(job_id):
                return info  # being enqueued right now, or a worker is solving it (Redis lost RQ's data)
            return self._terminal(
                job_id,
                JobStatus.FAILED,
                {
                    "kind": "worker_lost",
                    "code": "job_lost",
                    "message": "the queue lost this job; submit the request again",
                },
            )
        if status == RQStatus.FAILED:
            exc_text = (rq_job.exc_info or "").strip().splitlines()
            last = exc_text[-1] if exc_text else "unknown failure"
            if "Timeout" in last:
                error = {
                    "kind": "timeout",
                    "code": "job_timeout",
                    "message": f"the job timed out: {last}",
                }
            elif "stopped" in last.lower():
                error = {"kind": "canceled", "code": "canceled", "message": "the job was stopped"}
                return self._terminal(job_id, JobStatus.CANCELED, error)
            else:
                error = {
                    "kind": "worker_crashed",
                    "code": "worker_crashed",
                    "message": f"the worker running this job died: {last}",
                }
            return self._terminal(job_id, JobStatus.FAILED, error)
        if status == RQStatus.FINISHED:
            # the horse returned but its last record update was lost: use its return value
            value = rq_job.return_value()
            if isinstance(value, dict) and value.get("ok"):
                change = _finish(JobStatus.SUCCEEDED, result=value.get("result"), phase="done")
                return self.records.update(job_id, change)
            if isinstance(value, dict) and isinstance(value.get("error"), dict):
                return self._terminal(job_id, JobStatus.FAILED, value["error"])
            return info
        if status in (RQStatus.CANCELED, RQStatus.STOPPED):
            return self._terminal(
                job_id,
                JobStatus.CANCELED,
                {"kind": "canceled", "code": "canceled", "message": "canceled"},
            )
        if status in (RQStatus.QUEUED, RQStatus.SCHEDULED, RQStatus.DEFERRED) and (
            info.status is JobStatus.RUNNING
        ):
            info.status = JobStatus.QUEUED  # a retry after the horse died
        return info

    def _terminal(self, job_id: str, status: JobStatus, error: dict[str, Any]) -> JobInfo | None:
        return self.records.update(job_id, _finish(status, error=error))

    async def wait(self, job_id: str, timeout_s: float, after_version: int = -1) -> JobInfo | None:
        """Return when the version passes ``after_version``, the job ends, or at the timeout.

        Every waiter of a job shares one :class:`_Watch`: one coroutine polls the job's record
        with the asyncio client (no thread held, between or during its reads; RQ's own view is
        read every :data:`RECONCILE_EVERY_S`), however many streams and long-polls follow it.
        """
        watch = self._watches.get(job_id)
        if watch is None or watch.task is None or watch.task.done():
            watch = self._watches[job_id] = _Watch()
            watch.task = asyncio.create_task(self._follow(job_id, watch), name=f"autopar-watch-{job_id[:12]}")
        deadline = time.monotonic() + max(0.0, timeout_s)
        watch.waiters += 1
        try:
            while True:
                event = watch.changed
                if watch.error is not None:
                    raise watch.error
                info = watch.info
                if watch.polled and (info is None or info.terminal or info.version > after_version):
                    return info
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return info if watch.polled else await self.get(job_id)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            watch.waiters -= 1

    async def _follow(self, job_id: str, watch: _Watch) -> None:
        """Poll ``job_id``'s record while ``watch`` has waiters (from every 50 ms, slowing to every
        0.5 s while nothing changes); stop once the job ends."""
        delay = 0.05
        reconciled = -math.inf
        try:
            while watch.waiters > 0 or not watch.polled:
                try:
                    if time.monotonic() - reconciled >= RECONCILE_EVERY_S:
                        info = await self.get(job_id)  # RQ's view too: a horse that died, a time-out
                        reconciled = time.monotonic()
                    else:
                        info = await self._load_async(job_id)
                    error = None
                except CacheUnavailable as exc:
                    info, error = watch.info, exc
                moved = not watch.polled or error is not None or _moved(watch.info, info)
                watch.info, watch.error, watch.polled = info, error, True
                if moved:
                    watch.fire()
                    delay = 0.05
                else:
                    delay = min(delay * 1.5, 0.5)
                if info is None or info.terminal or error is not None:
                    return
                await asyncio.sleep(delay)
        finally:
            if self._watches.get(job_id) is watch:
                del self._watches[job_id]
            watch.fire()

    async def _load_async(self, job_id: str) -> JobInfo | None:
        """The job's record, read with the asyncio client (a terminal one is reported once)."""
        try:
            raw = await self.aclient.get(self.records.key(job_id))
        except RedisError as exc:
            raise self._unavailable("a progress read", exc) from None
        if raw is None:
            return await self.get(job_id)  # lost, or not written yet: what RQ says
        info = JobInfo.from_dict(json.loads(raw))
        if info.terminal:
            self._observe(info)
        return info

    async def cancel(self, job_id: str) -> JobInfo | None:
        info: JobInfo | None = await self._call("cancel", lambda: self._cancel(job_id))
        return info

    def _cancel(self, job_id: str) -> JobInfo | None:
        info = self._reconcile(job_id)
        if info is None or info.terminal:
            return info
        with contextlib.suppress(NoSuchJobError):
            rq_job = Job.fetch(job_id, connection=self.client, serializer=JSONSerializer)
            status = rq_job.get_status()
            if status == RQStatus.STARTED:
                with contextlib.suppress(InvalidJobOperation):
                    send_stop_job_command(self.client, job_id, serializer=JSONSerializer)
            elif status in (RQStatus.QUEUED, RQStatus.SCHEDULED, RQStatus.DEFERRED):
                rq_job.cancel()
        error = {
            "kind": "canceled",
            "code": "canceled",
            "message": "the job was canceled by a client",
        }
        return self._terminal(job_id, JobStatus.CANCELED, error)

    async def health(self) -> dict[str, Any]:
        def check() -> dict[str, Any]:
            # RQ's worker key outlives a SIGKILLed worker by a minute; the liveness key, renewed by
            # each heartbeat, by seconds: a stopped (SIGSTOP) or hung worker stops counting then
            names = sorted(k.decode() if isinstance(k, bytes) else k for k in get_keys(queue=self.queue))
            alive_keys = [alive_key(k.rsplit(":", 1)[-1]) for k in names]
            alive = self.client.exists(*alive_keys) if alive_keys else 0
            return {
                "ok": alive > 0,
                "kind": self.kind,
                "workers": alive,
                "registered": len(names),
                "queued": self.queue.count,
                "detail": None
                if alive
                else f"no autopar worker serves queue {self.queue.name!r}; start one with `autopar worker`",
            }

        try:
            return await run_in_threadpool(check)
        except RedisError as exc:
            log.warning("readiness: Redis unavailable: %s", exc)
            return {"ok": False, "kind": self.kind, "detail": "the queue (Redis) does not answer"}

    async def active(self) -> int:
        def count() -> int:
            return int(self.queue.count) + int(StartedJobRegistry(queue=self.queue).count)

        n: int = await self._call("count", count)
        return n

    async def solves_started(self) -> int:
        raw = await self._call("stats", lambda: self.store.get("stat:solves_started"))
        return int(raw) if raw else 0

    # ------------------------------------------------------------ janitor

    def reap_lost(self) -> list[str]:
        """Retry or fail running jobs whose heartbeat expired (worker died); return their ids."""
        registry = StartedJobRegistry(queue=self.queue)
        handled = []
        for job_id in registry.get_job_ids(cleanup=False):
            info = self.records.load(job_id)
            if info is None or info.status is not JobStatus.RUNNING or self.records.alive(job_id):
                continue
            if info.started_at and time.time() - info.started_at < self.settings.worker_lost_after_s:
                continue
            guard = f"{_PREFIX}lock:reap:{job_id}"
            if not self.client.set(guard, b"1", nx=True, px=int(self.settings.worker_lost_after_s * 1000)):
                continue
            try:
                rq_job = Job.fetch(job_id, connection=self.client, serializer=JSONSerializer)
            except NoSuchJobError:
                continue
            if rq_job.get_status() != RQStatus.STARTED:
                continue
            message = (
                f"the worker running this job stopped sending heartbeats for "
                f"{self.settings.worker_lost_after_s:.0f} s (killed or lost)"
            )
            error = {"kind": "worker_lost", "code": "worker_lost", "message": message}
            retry = rq_job.should_retry
            # the record first, atomically: an attempt that wrote the job's end since it was
            # loaded above keeps it, and the job is neither queued again nor failed
            change = (
                _requeued({**error, "retrying": True}) if retry else _finish(JobStatus.FAILED, error=error)
            )
            if not _applied(self.records, job_id, change):
                continue
            with self.client.pipeline() as pipe:
                registry.remove_executions(rq_job, pipeline=pipe)
                if retry:
                    rq_job.retry(self.queue, pipe)
                else:
                    record_job_failure(rq_job, message, pipe)
                pipe.execute()
            if retry:
                log.warning("job %s: worker lost, retrying", job_id[:12])
            else:
                log.warning("job %s: worker lost, no retries left", job_id[:12])
            handled.append(job_id)
        return handled


def _applied(records: JobRecords, job_id: str, change: Callable[[JobInfo], bool]) -> bool:
    """Apply ``change`` to a running record (atomically); whether it was applied."""
    applied = False

    def running_only(info: JobInfo) -> bool:
        nonlocal applied
        applied = info.status is JobStatus.RUNNING and change(info)
        return applied

    records.update(job_id, running_only)
    return applied
