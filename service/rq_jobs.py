"""Jobs with Redis: an RQ queue served by ``autopar worker`` processes anywhere.

::

    API ──enqueue(job_id = plan key)──> RQ queue ──> autopar worker ──fork──> horse: solve_job()
     ^                                                                          │
     └──── job record  autopar:job:{id}  (status, phase, objective, bound) <────┤ progress
           heartbeat   autopar:job:{id}:hb (TTL worker_lost_after_s) <───────────┘ renewed every 2 s

The job record (JSON, updated with optimistic WATCH transactions) is what the
API reports; RQ's own status fills in what the horse could not write itself:

* horse killed (SIGKILL, OOM): RQ's worker notices, retries the job while
  ``job_retries`` last, else marks it failed -> ``worker_crashed``;
* the whole worker killed: the heartbeat expires, the API's janitor
  (:meth:`RQJobManager.reap_lost`) retries the job or fails it -> ``worker_lost``;
* RQ's time-out (solver time limit + margin) -> ``timeout``;
* ``DELETE`` -> queued jobs are canceled, running ones stopped (the horse is killed).

Deterministic failures (infeasible budget, invalid graph) are recorded by the
horse and never retried.  Job arguments use RQ's JSON serializer (no pickle).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import RedisError, WatchError
from rq import Queue, Retry
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job, get_current_job
from rq.job import JobStatus as RQStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.worker_registration import get_keys
from starlette.concurrency import run_in_threadpool

from autopar.errors import ConfigError
from autopar_cache.errors import CacheUnavailable
from autopar_cache.redis_store import RedisStore, connect, redact_url
from autopar_service.jobs import JobInfo, JobStatus
from autopar_service.settings import Settings
from autopar_service.worker import alive_key

__all__ = ["JobRecords", "RQJobManager", "solve_job"]

log = logging.getLogger("autopar.service.rq")

SOLVE_FUNC = "autopar_service.rq_jobs.solve_job"
_SEEN_LIMIT = 10_000
_PREFIX = "autopar:"


class JobRecords:
    """Job records in Redis: ``{prefix}job:{id}`` (JSON) and ``{prefix}job:{id}:hb``."""

    def __init__(self, client: redis.Redis, ttl_s: float, prefix: str = _PREFIX) -> None:
        self.client = client
        self.ttl_ms = int(ttl_s * 1000)
        self.prefix = prefix

    def key(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def heartbeat_key(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}:hb"

    def load(self, job_id: str) -> JobInfo | None:
        raw: Any = self.client.get(self.key(job_id))
        return JobInfo.from_dict(json.loads(raw)) if raw is not None else None

    def save(self, info: JobInfo, *, if_missing: bool = False) -> None:
        self.client.set(self.key(info.id), json.dumps(info.to_dict()), px=self.ttl_ms, nx=if_missing)

    def update(self, job_id: str, change: Callable[[JobInfo], bool]) -> JobInfo | None:
        """Apply ``change`` atomically (WATCH/MULTI); it returns False to leave the record as is.

        The version is bumped on every applied change.  Returns the record after.
        """
        key = self.key(job_id)
        while True:
            with self.client.pipeline() as pipe:
                try:
                    pipe.watch(key)
                    raw: Any = pipe.get(key)
                    if raw is None:
                        pipe.unwatch()
                        return None
                    info = JobInfo.from_dict(json.loads(raw))
                    if not change(info):
                        pipe.unwatch()
                        return info
                    info.version += 1
                    pipe.multi()
                    pipe.set(key, json.dumps(info.to_dict()), px=self.ttl_ms)
                    pipe.execute()
                    return info
                except WatchError:
                    continue

    def beat(self, job_id: str, lost_after_s: float) -> None:
        self.client.set(self.heartbeat_key(job_id), b"1", px=int(lost_after_s * 1000))

    def alive(self, job_id: str) -> bool:
        return bool(self.client.exists(self.heartbeat_key(job_id)))


def _requeued(error: dict[str, Any]) -> Callable[[JobInfo], bool]:
    """A change that puts a running record back in the queue, noting why; the running
    attempt's fencing token is revoked (its later writes are discarded)."""

    def change(info: JobInfo) -> bool:
        if info.terminal:
            return False
        info.status = JobStatus.QUEUED
        info.error = error
        info.fence = None
        return True

    return change


class Superseded(Exception):
    """Raised in an attempt whose fencing token the job record no longer holds: the job was
    requeued (its worker stopped heartbeating past the lease) and another attempt owns it."""


def _holds(info: JobInfo, fence: str | None) -> bool:
    """Whether the attempt holding ``fence`` may still write ``info`` (None: no fencing)."""
    return fence is None or info.fence == fence


def _finish(status: JobStatus, fence: str | None = None, **changes: Any) -> Callable[[JobInfo], bool]:
    """A change that makes a non-terminal record terminal (a terminal one is left alone, and so
    is one whose fencing token is not ``fence``: a superseded attempt's end is discarded)."""

    def change(info: JobInfo) -> bool:
        if info.terminal or not _holds(info, fence):
            return False
        info.status = status
        info.finished_at = time.time()
        for name, value in changes.items():
            setattr(info, name, value)
        return True

    return change


# ------------------------------------------------------------------ worker side


class _Heartbeat:
    """Background thread renewing the job's heartbeat key while the horse solves."""

    def __init__(
        self, records: JobRecords, job_id: str, settings: Settings, fence: str | None = None
    ) -> None:
        self.records = records
        self.job_id = job_id
        self.settings = settings
        self.fence = fence
        """The attempt's fencing token, kept in a record the heartbeat puts back."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autopar-heartbeat", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self.records.beat(self.job_id, self.settings.worker_lost_after_s)
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.time()
        while not self._stop.wait(self.settings.heartbeat_interval_s):
            with contextlib.suppress(RedisError):
                self.records.beat(self.job_id, self.settings.worker_lost_after_s)
                # Redis restarted without its data: put the running job's record back
                running = JobInfo(
                    self.job_id,
                    JobStatus.RUNNING,
                    attempts=1,
                    started_at=started,
                    version=1,
                    fence=self.fence,
                )
                self.records.save(running, if_missing=True)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(RedisError):
            self.records.client.delete(self.records.heartbeat_key(self.job_id))


def solve_job(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """RQ entry point (runs in the worker's horse): solve and record the outcome.

    Outcomes are written to the job record and the function returns normally,
    so RQ retries only what killed the horse.
    """
    from autopar_cache.plans import code_versions
    from autopar_service.settings import load_settings
    from autopar_service.table_jobs import RQTableBuilder
    from autopar_service.tasks import error_of, run_job

    settings = load_settings()
    rq_job = get_current_job()
    if rq_job is not None:
        client = rq_job.connection  # the worker's own connection
    elif settings.redis_url is not None:
        client = connect(settings.redis_url, socket_timeout_s=settings.redis_timeout_s)
    else:
        raise ConfigError("bad_settings", "solve_job runs outside RQ and AUTOPAR_REDIS_URL is unset")
    records = JobRecords(client, settings.job_ttl_s)
    store = RedisStore(settings.redis_url or "redis://(worker connection)", client=client)
    fence = _start_attempt(records, job_id)
    if fence is None:
        # a stale retry: the record is already terminal (the janitor queued it again while the
        # attempt that finished it was writing its end); solving again would be wasted work
        log.warning("job %s: already ended; this run does nothing", job_id[:12])
        return {"ok": False, "already_ended": True}
    store.incr("stat:solves_started")
    report = _reporter(records, job_id, fence)
    with _Heartbeat(records, job_id, settings, fence):
        try:
            tables = RQTableBuilder(store, settings)  # missing cost-table entries: on every worker
            result = run_job(job_id, payload, store, settings, code_versions(), report, tables)
        except Superseded:
            store.incr("stat:attempts_superseded")
            log.warning(
                "job %s: this attempt was superseded (requeued past its lease); its work is discarded",
                job_id[:12],
            )
            return {"ok": False, "superseded": True}
        except JobTimeoutException:
            limit = payload.get("options", {}).get("time_limit_s")
            error = {
                "kind": "timeout",
                "code": "job_timeout",
                "message": f"the solve ran past its time limit ({limit} s) plus "
                f"{settings.job_timeout_margin_s:.0f} s and was stopped; raise time_limit_s "
                "or send a smaller graph",
            }
            _record_outcome(records, job_id, settings, JobStatus.FAILED, fence, error=error)
            return {"ok": False, "error": error}
        except Exception as exc:  # process boundary: every failure becomes the job's error
            error = error_of(exc)
            _record_outcome(records, job_id, settings, JobStatus.FAILED, fence, error=error)
            return {"ok": False, "error": error}
        # the end is written while the heartbeat still beats: between a stopped heartbeat and a
        # terminal record the janitor would take the finished job for a lost one and run it again
        store.incr("stat:plans_stored")
        _record_outcome(
            records, job_id, settings, JobStatus.SUCCEEDED, fence, result=result, phase="done", error=None
        )
    return {"ok": True, "result": result}


def _start_attempt(records: JobRecords, job_id: str) -> str | None:
    """Mark the job running under a fresh fencing token (this attempt's) and return the token;
    None when the record is terminal already (nothing is left to run)."""
    fence = uuid.uuid4().hex
    ended = False

    def started(info: JobInfo) -> bool:
        nonlocal ended
        if info.terminal:
            ended = True
            return False
        info.status = JobStatus.RUNNING
        info.attempts += 1
        info.started_at = time.time()
        info.phase, info.objective, info.bound, info.elapsed_s = "starting", None, None, 0.0
        info.fence = fence
        return True

    if records.update(job_id, started) is None:
        records.save(JobInfo(job_id, JobStatus.RUNNING, attempts=1, started_at=time.time(), fence=fence))
    return None if ended else fence


def _reporter(records: JobRecords, job_id: str, fence: str) -> Callable[[dict[str, Any]], None]:
    """The progress callback of one attempt: it writes the record while the attempt holds the
    fencing token, and raises :class:`Superseded` (stopping the solve at that phase) once it
    does not.  ``run_job`` reports before every phase and before it stores the plan."""

    def report(data: dict[str, Any]) -> None:
        superseded = False

        def change(info: JobInfo) -> bool:
            nonlocal superseded
            if info.terminal or not _holds(info, fence):
                superseded = not _holds(info, fence)
                return False
            info.phase = data.get("phase")
            if data.get("objective") is not None:
                info.objective = data["objective"]
            if data.get("bound") is not None:
                info.bound = data["bound"]
            info.elapsed_s = data.get("elapsed_s")
            return True

        with contextlib.suppress(RedisError):
            records.update(job_id, change)
        if superseded:
            raise Superseded(f"job {job_id[:12]}: another attempt holds it now")

    return report


def _record_outcome(
    records: JobRecords,
    job_id: str,
    settings: Settings,
    status: JobStatus,
    fence: str | None = None,
    **changes: Any,
) -> None:
    """Write the job's end, retrying through a Redis outage; recreate the record if Redis lost it.
    Nothing is written when the record's fencing token is not ``fence`` (a superseded attempt)."""
    from autopar_service.tasks import with_retries

    def write() -> None:
        try:
            if records.update(job_id, _finish(status, fence, **changes)) is None:
                lost = JobInfo(job_id, status, finished_at=time.time(), attempts=1, version=1, **changes)
                records.save(lost)
        except RedisError as exc:
            raise CacheUnavailable("queue_unavailable", f"Redis failed: {exc}") from None

    with_retries(write, settings.outage_grace_s, f"record the end of job {job_id[:12]}")


# ------------------------------------------------------------------ API side


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
        deadline = time.monotonic() + max(0.0, timeout_s)
        delay = 0.05
        while True:
            info = await self.get(job_id)
            if info is None or info.terminal or info.version > after_version:
                return info
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return info
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 0.5)

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
