"""Jobs without Redis: a bounded pool of solver processes beside the API.

Each attempt runs in its own process started from a ``forkserver`` that has
already imported the solver (a start costs milliseconds, not an import of
OR-Tools).  At most ``settings.local_workers`` run at once; the rest wait,
queued.  A process per attempt -- rather than a ``ProcessPoolExecutor`` --
is what makes cancellation, time-outs and crashes clean: the process group is
killed and the API, its other jobs and the pool carry on (a pool whose worker
is killed is broken for every job).

::

    API event loop ──submit──> asyncio task ──(semaphore)──> forkserver child
          ^                         │ pump thread reads the pipe  │ run_job()
          └──── call_soon_threadsafe(progress / done / error) <───┘ JSON messages

The child opens the embedded store itself (diskcache is multi-process safe),
so cost-table entries and the plan land in the shared cache directly.
Job records are kept in memory and, once terminal, also in the store
(``job:{id}``) so they survive an API restart until ``job_ttl_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from autopar_cache import codec
from autopar_cache.base import Store
from autopar_cache.errors import CacheUnavailable
from autopar_service.jobs import JobInfo, JobStatus
from autopar_service.settings import Settings
from autopar_service.work_pool import FORKSERVER_PRELOAD

__all__ = ["LocalJobManager", "child_main"]

log = logging.getLogger("autopar.service.local")

_KILL_GRACE_S = 3.0


def child_main(
    conn: Connection,
    job_id: str,
    payload: dict[str, Any],
    settings_data: dict[str, Any],
    versions: dict[str, str],
) -> None:
    """Entry point of a solver process: run the job, send JSON messages to the parent."""
    os.setpgrp()  # own process group: cancelling kills the solver's helpers too
    from autopar_cache.embedded import EmbeddedStore
    from autopar_service.tasks import error_of, run_job

    settings = Settings(**settings_data)
    store = EmbeddedStore(settings.cache_dir, settings.cache_size_limit_bytes)

    def send(kind: str, data: dict[str, Any]) -> None:
        conn.send_bytes(codec.dumps({"kind": kind, "data": data}))

    try:
        result = run_job(job_id, payload, store, settings, versions, lambda d: send("progress", d))
        send("done", result)
    except Exception as exc:  # process boundary: every failure becomes the job's error
        send("error", error_of(exc))
    finally:
        conn.close()
        store.close()


@dataclass
class _Entry:
    info: JobInfo
    payload: dict[str, Any]
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    process: multiprocessing.process.BaseProcess | None = None
    cancel_requested: bool = False


class LocalJobManager:
    """:class:`autopar_service.jobs.JobManager` running solves in local processes."""

    kind = "local"

    def __init__(
        self,
        settings: Settings,
        store: Store,
        versions: dict[str, str],
        on_terminal: Callable[[JobInfo], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.versions = versions
        self.on_terminal = on_terminal
        self._ctx = multiprocessing.get_context("forkserver")
        self._jobs: dict[str, _Entry] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = 0
        self._slots: asyncio.Semaphore | None = None
        self._pumps: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._slots = asyncio.Semaphore(self.settings.local_workers)
        self._pumps = ThreadPoolExecutor(
            max_workers=self.settings.local_workers, thread_name_prefix="autopar-pump"
        )
        # the search (OR-Tools, numba) too: the planner imports it only when it solves; one
        # forkserver serves the request workers too (autopar_service.work_pool), so one list
        self._ctx.set_forkserver_preload(FORKSERVER_PRELOAD)

    async def close(self) -> None:
        self._closed = True
        for entry in list(self._jobs.values()):
            if not entry.info.terminal:
                entry.cancel_requested = True
                self._kill(entry)
                if entry.task is not None:
                    entry.task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pumps is not None:
            self._pumps.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ API

    async def submit(self, job_id: str, payload: dict[str, Any], *, refresh: bool = False) -> JobInfo:
        if self._slots is None:
            raise RuntimeError("LocalJobManager.start() was not awaited")
        self._prune()
        entry = self._jobs.get(job_id)
        if entry is not None:
            if not entry.info.terminal:
                return entry.info
            if entry.info.status is JobStatus.SUCCEEDED and not refresh:
                return entry.info
        entry = _Entry(JobInfo(job_id), {**payload, "refresh": refresh})
        self._jobs[job_id] = entry
        entry.task = asyncio.create_task(self._run(entry), name=f"autopar-job-{job_id[:12]}")
        self._tasks.add(entry.task)
        entry.task.add_done_callback(self._tasks.discard)
        return entry.info

    async def get(self, job_id: str) -> JobInfo | None:
        entry = self._jobs.get(job_id)
        if entry is not None:
            return entry.info
        raw = await asyncio.to_thread(self.store.get, f"job:{job_id}")
        return JobInfo.from_dict(codec.decode(raw)) if raw is not None else None

    async def wait(self, job_id: str, timeout_s: float, after_version: int = -1) -> JobInfo | None:
        entry = self._jobs.get(job_id)
        if entry is None:
            return await self.get(job_id)
        deadline = time.monotonic() + max(0.0, timeout_s)
        while entry.info.version <= after_version and not entry.info.terminal:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            event = entry.changed
            with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError only from 3.11
                await asyncio.wait_for(event.wait(), remaining)
        return entry.info

    async def cancel(self, job_id: str) -> JobInfo | None:
        entry = self._jobs.get(job_id)
        if entry is None:
            return await self.get(job_id)
        if entry.info.terminal:
            return entry.info
        entry.cancel_requested = True
        if entry.process is None and entry.task is not None:
            entry.task.cancel()  # still waiting for a slot
        self._kill(entry)
        self._finish(entry, JobStatus.CANCELED, error=_canceled_error())
        return entry.info

    async def health(self) -> dict[str, Any]:
        running = sum(1 for e in self._jobs.values() if e.info.status is JobStatus.RUNNING)
        queued = sum(1 for e in self._jobs.values() if e.info.status is JobStatus.QUEUED)
        return {
            "ok": not self._closed and self._slots is not None,
            "kind": self.kind,
            "workers": self.settings.local_workers,
            "running": running,
            "queued": queued,
        }

    async def active(self) -> int:
        return sum(1 for e in self._jobs.values() if not e.info.terminal)

    async def solves_started(self) -> int:
        return self._started

    def pid(self, job_id: str) -> int | None:
        """Process id (and process group) of the job's running solver, if any."""
        entry = self._jobs.get(job_id)
        proc = entry.process if entry is not None else None
        return proc.pid if proc is not None and proc.exitcode is None else None

    # ------------------------------------------------------------ internals

    def _changed(self, entry: _Entry) -> None:
        entry.info.version += 1
        event, entry.changed = entry.changed, asyncio.Event()
        event.set()

    def _finish(self, entry: _Entry, status: JobStatus, **changes: Any) -> None:
        if entry.info.terminal:
            return
        info = entry.info
        info.status = status
        info.finished_at = time.time()
        for name, value in changes.items():
            setattr(info, name, value)
        self._changed(entry)
        self._persist(info)
        if self.on_terminal is not None:
            self.on_terminal(info)

    def _persist(self, info: JobInfo) -> None:
        """Write the terminal record to the store from a thread (SQLite may wait on a lock)."""
        record = codec.encode(info.to_dict())
        key, ttl = f"job:{info.id}", self.settings.job_ttl_s

        def write() -> None:
            try:
                self.store.put(key, record, ttl)
            except (OSError, CacheUnavailable) as exc:
                log.warning("job %s: could not persist its record: %s", info.id[:12], exc)

        if self._loop is not None and not self._closed:
            self._loop.run_in_executor(None, write)
        else:
            write()

    def _prune(self) -> None:
        horizon = time.time() - self.settings.job_ttl_s
        stale = [k for k, e in self._jobs.items() if e.info.terminal and (e.info.finished_at or 0) < horizon]
        for k in stale:
            del self._jobs[k]

    def _kill(self, entry: _Entry) -> None:
        proc = entry.process
        if proc is None or proc.pid is None or proc.exitcode is not None:
            return
        # the group (the solver's helpers too) and the process itself, in case it has
        # not called setpgrp yet (then it has no helpers either)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGTERM)

    async def _run(self, entry: _Entry) -> None:
        assert self._slots is not None
        try:
            async with self._slots:
                attempts_allowed = 1 + self.settings.job_retries
                while not entry.cancel_requested and not self._closed:
                    outcome = await self._attempt(entry)
                    if outcome != "crashed" or entry.info.attempts >= attempts_allowed:
                        break
                    log.warning("job %s: solver process died; retrying", entry.info.id[:12])
                    entry.info.status = JobStatus.QUEUED
                    self._changed(entry)
        except asyncio.CancelledError:
            if not entry.info.terminal:
                self._finish(entry, JobStatus.CANCELED, error=_canceled_error())

    async def _attempt(self, entry: _Entry) -> str:
        assert self._loop is not None and self._pumps is not None
        info = entry.info
        receiver, sender = self._ctx.Pipe(duplex=False)
        settings_data = self.settings.model_dump(mode="json")
        proc = self._ctx.Process(
            target=child_main,
            args=(sender, info.id, entry.payload, settings_data, self.versions),
            name=f"autopar-solve-{info.id[:12]}",
            daemon=False,  # the solver starts its own process pools
        )
        try:
            proc.start()
        finally:
            sender.close()
        entry.process = proc
        log.debug("job %s: attempt %d in process %s", info.id[:12], info.attempts + 1, proc.pid)
        self._started += 1
        info.status = JobStatus.RUNNING
        info.attempts += 1
        info.started_at = time.time()
        info.phase = "starting"
        info.objective = info.bound = None
        info.error = None  # a crashed attempt's note: this attempt runs now
        self._changed(entry)

        options = entry.payload.get("options") or {}
        limit = float(options.get("time_limit_s", self.settings.default_time_limit_s))
        deadline = time.monotonic() + limit + self.settings.job_timeout_margin_s
        try:
            final = await self._loop.run_in_executor(self._pumps, self._pump, receiver, entry, deadline)
        finally:
            receiver.close()
            if proc.exitcode is None:
                self._kill(entry)
            await self._loop.run_in_executor(self._pumps, _reap, proc)
        log.debug("job %s: process %s ended (exit %s)", info.id[:12], proc.pid, proc.exitcode)
        if entry.cancel_requested or info.terminal:
            return "canceled"
        if final is None:
            if time.monotonic() >= deadline:
                self._finish(
                    entry,
                    JobStatus.FAILED,
                    error={
                        "kind": "timeout",
                        "code": "job_timeout",
                        "message": f"the solve ran past its time limit ({limit:.0f} s) plus "
                        f"{self.settings.job_timeout_margin_s:.0f} s and was stopped; "
                        "raise time_limit_s or send a smaller graph",
                    },
                )
                return "timeout"
            code = proc.exitcode
            what = f"signal {-code} ({signal.Signals(-code).name})" if code and code < 0 else f"code {code}"
            error = {
                "kind": "worker_crashed",
                "code": "worker_crashed",
                "message": f"the solver process died with {what} (out of memory?) "
                f"after {info.attempts} attempt(s)",
            }
            if info.attempts < 1 + self.settings.job_retries:
                info.error = error
                return "crashed"
            self._finish(entry, JobStatus.FAILED, error=error)
            return "crashed"
        kind, data = final
        if kind == "done":
            self._finish(entry, JobStatus.SUCCEEDED, result=data, phase="done", error=None)
            return "succeeded"
        self._finish(entry, JobStatus.FAILED, error=data)
        return "failed"

    def _pump(
        self, receiver: Connection, entry: _Entry, deadline: float
    ) -> tuple[str, dict[str, Any]] | None:
        """Thread: relay progress to the loop until the final message, EOF or the deadline."""
        assert self._loop is not None
        canceled_at: float | None = None
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return None
            if entry.cancel_requested:
                canceled_at = canceled_at or now
                if now - canceled_at > _KILL_GRACE_S:
                    return None  # the caller SIGKILLs what is left
            try:
                if not receiver.poll(min(remaining, 1.0)):
                    continue
                message = codec.decode(receiver.recv_bytes())
            except (EOFError, OSError):
                return None
            kind, data = message["kind"], message["data"]
            if kind == "progress":
                self._loop.call_soon_threadsafe(self._apply_progress, entry, data)
            else:
                return kind, data

    def _apply_progress(self, entry: _Entry, data: dict[str, Any]) -> None:
        info = entry.info
        if info.terminal:
            return
        info.phase = data.get("phase")
        if data.get("objective") is not None:
            info.objective = data["objective"]
        if data.get("bound") is not None:
            info.bound = data["bound"]
        info.elapsed_s = data.get("elapsed_s")
        self._changed(entry)


def _reap(proc: multiprocessing.process.BaseProcess) -> None:
    proc.join(_KILL_GRACE_S)
    if proc.exitcode is None and proc.pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(_KILL_GRACE_S)


def _canceled_error() -> dict[str, Any]:
    return {"kind": "canceled", "code": "canceled", "message": "the job was canceled by a client"}
