"""Jobs with Redis: an RQ queue served by ``autopar worker`` processes anywhere (the worker's side,
and the job records both sides share; the API's side is :mod:`autopar_service.rq_manager`).

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
  (:meth:`autopar_service.rq_manager.RQJobManager.reap_lost`) retries the job or fails it -> ``worker_lost``;
* RQ's time-out (solver time limit + margin) -> ``timeout``;
* ``DELETE`` -> queued jobs are canceled, running ones stopped (the horse is killed).

Deterministic failures (infeasible budget, invalid graph) are recorded by the
horse and never retried.  Job arguments use RQ's JSON serializer (no pickle).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import RedisError, WatchError
from rq.job import get_current_job
from rq.timeouts import JobTimeoutException

from autopar.errors import ConfigError
from autopar_cache.errors import CacheUnavailable
from autopar_cache.redis_store import RedisStore, connect
from autopar_service.jobs import JobInfo, JobStatus
from autopar_service.settings import Settings

__all__ = ["SOLVE_FUNC", "JobRecords", "solve_job"]

log = logging.getLogger("autopar.service.rq")

SOLVE_FUNC = "autopar_service.rq_jobs.solve_job"
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
        info.error = None  # the lost attempt's worker_lost note: this attempt runs now
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
