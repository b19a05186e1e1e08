"""Worker processes for the CPU-heavy work of requests, apart from the API's event loop.

Parsing a body (the JSON of a 5,000-op graph, its checks, the evaluator) and rendering a
report take from a tenth of a second to seconds of CPU.  In threads of the API process they
held its GIL, so while one key flooded, another key's cache hit (2 ms of work) waited behind
them (p99 1.5 s).  They run here instead, in processes of their own at a lower CPU priority,
taken from one FIFO per client in turn::

    route ──run(client, task, *args, body=parts)─> FairQueue: a FIFO per client, served round robin
                                                    │ the next free worker takes the oldest job
                                                    v  of the client after the last one served
                    runner (an asyncio task + a thread of its own) ──pipe──> worker process (niced)
                                 <── ("ok", value) | ("error", problem) | EOF (died, or killed) ──┘

* A client may have ``max_parses_per_client`` jobs queued or running (429 ``too_many_parses``
  at once beyond), so one key never holds every worker; a job that finds no worker free
  within ``max_parse_s`` is 429 ``server_busy``.
* A job that runs past its time limit is stopped for real: its worker is killed (SIGKILL) and
  replaced, and the request answers 503 ``parse_timeout``.  A worker that dies (OOM) is replaced
  and its job answers 503 ``worker_crashed``.
* A task is a module-level function ``task(context, *args, body=...)`` (pickled by name): the
  worker's :class:`WorkerContext` holds the settings, the code versions and the store, opened
  in the worker from the settings (the embedded cache directory or the Redis URL).
* A task's errors come back as problems: an :class:`~autopar_service.problems.ApiError` or an
  :class:`~autopar.errors.AutoparError` answers as it would in the API; anything else is a
  logged 500 (a bug).
* The body goes to the worker in the parts it arrived in (sent from a thread of the pool's own,
  joined in the worker) and the API keeps no reference to it once it is sent.  A route asks
  :meth:`WorkPool.check_room` before it reads a body, so a client at its bound is refused
  without its body being read.
* After a task over :data:`RELEASE_ABOVE_BYTES` of body the worker collects its garbage and
  hands freed memory back to the system (``malloc_trim``): what a refused body built is not
  kept for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import multiprocessing
import os
import signal
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from autopar.errors import AutoparError
from autopar_cache.base import Store
from autopar_cache.plans import PlanCache
from autopar_service.body import Body
from autopar_service.problems import ApiError, from_autopar
from autopar_service.settings import Settings

__all__ = ["FORKSERVER_PRELOAD", "RELEASE_ABOVE_BYTES", "WorkPool", "WorkerContext"]

log = logging.getLogger("autopar.service.work")

FORKSERVER_PRELOAD = [
    "autopar_service.tasks",
    "autopar_service.work_tasks",
    "autopar_service.report",
    "autopar_solver.planner",
    "autopar_solver.solve",
    "autopar_cache.embedded",
    "autopar_service.work_preload",
]
"""Modules the forkserver imports once, so a solver process (:mod:`autopar_service.local_jobs`) or
a worker of this pool starts in milliseconds (both come from the one forkserver of a process)."""
RELEASE_ABOVE_BYTES = 1 << 20
"""A task with a larger body is followed by a garbage collection and ``malloc_trim``."""
_KILL_WAIT_S = 5.0


class WorkerContext:
    """What a task reads in a worker process: settings, code versions, the store (opened on
    first use from the settings) and the plan cache on it."""

    def __init__(self, settings: Settings, versions: dict[str, str]) -> None:
        self.settings = settings
        self.versions = versions
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            from autopar_cache import open_store

            s = self.settings
            self._store = open_store(
                s.redis_url,
                s.cache_dir,
                size_limit_bytes=s.cache_size_limit_bytes,
                socket_timeout_s=s.redis_timeout_s,
                max_connections=2,
            )
        return self._store

    @property
    def plans(self) -> PlanCache:
        return PlanCache(self.store, self.settings.plan_ttl_s)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def _problem_of(exc: BaseException, retry_after_s: int) -> dict[str, Any]:
    """A task's failure as the problem the API answers with."""
    if isinstance(exc, AutoparError):
        exc = from_autopar(exc, retry_after_s)
    if isinstance(exc, ApiError):
        return {
            "status": exc.status,
            "code": exc.code,
            "detail": exc.detail,
            "headers": dict(exc.headers or {}),
            "extra": dict(exc.extra),
        }
    log.exception("a request task failed unexpectedly")
    return {
        "status": 500,
        "code": "internal_error",
        "detail": f"unexpected {type(exc).__name__}; the server log has the traceback",
        "headers": {},
        "extra": {},
    }


def _release_memory() -> None:
    """Collect garbage and hand the heap's free pages back to the system (glibc)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def worker_main(conn: Connection, settings_data: dict[str, Any], versions: dict[str, str], nice: int) -> None:
    """A worker process: run tasks from ``conn`` until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API stops its workers itself
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    gc.freeze()  # the forkserver's modules: a collection after a large body walks only its objects
    settings = Settings(**settings_data)
    context = WorkerContext(settings, versions)
    try:
        while True:
            try:
                task, args, parts, context.versions = conn.recv()
                body = None if parts is None else b"".join([conn.recv_bytes() for _ in range(parts)])
                has_body = body is not None
            except (EOFError, OSError):
                return
            size = len(body) if body is not None else 0
            try:
                value = task(context, *args, body=body) if has_body else task(context, *args)
                message: tuple[str, Any] = ("ok", value)
            except BaseException as exc:  # the process boundary: every failure is an answer
                message = ("error", _problem_of(exc, settings.retry_after_s))
            del body
            try:
                conn.send(message)
            except (EOFError, OSError):
                return
            del message
            if size > RELEASE_ABOVE_BYTES:
                _release_memory()
    finally:
        context.close()


@dataclass
class _Job:
    client: str
    task: Callable[..., Any]
    args: tuple[Any, ...]
    body: list[bytes] | None
    """The body's parts (sent one by one, joined in the worker)."""
    has_body: bool
    timeout_s: float
    future: asyncio.Future[Any]
    versions: dict[str, str]
    started: asyncio.Event = field(default_factory=asyncio.Event)


class FairQueue:
    """Jobs waiting for a worker: a FIFO per client, the clients served round robin (the client
    after the one served last goes next), so a client with many jobs waits for its own."""

    def __init__(self) -> None:
        self._by_client: OrderedDict[str, deque[_Job]] = OrderedDict()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_client.values())

    def put(self, job: _Job) -> None:
        self._by_client.setdefault(job.client, deque()).append(job)
        self._ready.set()

    def remove(self, job: _Job) -> bool:
        queue = self._by_client.get(job.client)
        if queue is None or job not in queue:
            return False
        queue.remove(job)
        if not queue:
            del self._by_client[job.client]
        return True

    async def get(self) -> _Job:
        while not self._by_client:
            self._ready.clear()
            await self._ready.wait()
        client, queue = next(iter(self._by_client.items()))
        job = queue.popleft()
        del self._by_client[client]
        if queue:
            self._by_client[client] = queue  # to the back of the ring
        return job


class _Worker:
    """One worker process and the pipe to it."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn

    def kill(self) -> None:
        if self.process.pid is not None and self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        with contextlib.suppress(OSError):
            self.conn.close()
        self.process.join(_KILL_WAIT_S)


class WorkPool:
    """``size`` worker processes serving a :class:`FairQueue` (see the module)."""

    def __init__(self, settings: Settings, versions: dict[str, str], size: int, nice: int = 10) -> None:
        self.settings = settings
        self.versions = versions
        self.size = size
        self.nice = nice
        self.queue = FairQueue()
        self.in_flight: dict[str, int] = {}
        """Jobs per client, queued or running (``max_parses_per_client``)."""
        self._ctx = multiprocessing.get_context("forkserver")
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="autopar-work")
        self._runners: list[asyncio.Task[None]] = []
        self._workers: list[_Worker | None] = [None] * size
        self._closed = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        self._runners = [
            asyncio.create_task(self._runner(i), name=f"autopar-work-{i}") for i in range(self.size)
        ]

    async def close(self) -> None:
        self._closed = True
        for runner in self._runners:
            runner.cancel()
        await asyncio.gather(*self._runners, return_exceptions=True)
        for i, worker in enumerate(self._workers):
            if worker is not None:
                await asyncio.get_running_loop().run_in_executor(self._threads, worker.close)
                self._workers[i] = None
        self._threads.shutdown(wait=False, cancel_futures=True)

    def pids(self) -> list[int]:
        """The worker processes' ids (those started)."""
        return [w.process.pid for w in self._workers if w is not None and w.process.pid is not None]

    # ------------------------------------------------------------ API

    async def run(
        self,
        client: str,
        task: Callable[..., Any],
        *args: Any,
        body: Body | bytes | None = None,
        timeout_s: float | None = None,
        versions: dict[str, str] | None = None,
    ) -> Any:
        """``task(context, *args[, body=body])`` in a worker; its value, or its problem raised as
        :class:`ApiError`.  429 when ``client`` has its most jobs in flight or no worker frees
        within ``max_parse_s``; 503 when it runs past ``timeout_s`` (default ``max_parse_s``).
        ``versions``: the code versions the task keys plans with (default the pool's)."""
        settings = self.settings
        self.check_room(client)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        parts = None if body is None else [body] if isinstance(body, bytes) else body.parts
        job = _Job(
            client,
            task,
            args,
            parts,
            body is not None,
            timeout_s or settings.max_parse_s,
            future,
            dict(versions or self.versions),
        )
        del body, parts
        self.in_flight[client] = self.in_flight.get(client, 0) + 1
        self.queue.put(job)
        try:
            try:
                await asyncio.wait_for(job.started.wait(), settings.max_parse_s)
            except asyncio.TimeoutError:
                if self.queue.remove(job):
                    raise _busy(
                        "server_busy",
                        f"every worker was busy for {settings.max_parse_s:g} s (AUTOPAR_MAX_PARSE_S); "
                        "retry later",
                        settings.retry_after_s,
                    ) from None
            return await asyncio.shield(job.future)
        finally:
            self.queue.remove(job)  # canceled while queued: nobody waits for it
            job.body = None
            left = self.in_flight[client] - 1
            if left:
                self.in_flight[client] = left
            else:
                del self.in_flight[client]

    def check_room(self, client: str, *, body_unread: bool = False) -> None:
        """429 ``too_many_parses`` when ``client`` has its most jobs queued or running.

        A route asks before it reads a body (``body_unread``): a client at its bound is refused
        without its body being read (its connection is closed, the body left unread), so a flood
        of large bodies costs the API no more than its headers."""
        limit = self.settings.max_parses_per_client
        if self.in_flight.get(client, 0) >= limit:
            headers = {"Connection": "close"} if body_unread else {}
            raise _busy(
                "too_many_parses",
                f"you have {limit} requests being parsed or rendered, the most one client may have; "
                "wait for one to be answered",
                self.settings.retry_after_s,
                **headers,
            )

    # ------------------------------------------------------------ internals

    def _spawn(self) -> _Worker:
        receiver, sender = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main,
            args=(sender, self.settings.model_dump(mode="json"), self.versions, self.nice),
            name="autopar-work",
            daemon=True,
        )
        process.start()
        sender.close()
        return _Worker(process, receiver)

    async def _runner(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            worker = self._workers[index]
            if worker is None or worker.process.exitcode is not None:
                worker = await loop.run_in_executor(self._threads, self._spawn)
                self._workers[index] = worker
            job = await self.queue.get()
            if job.future.done():
                continue
            job.started.set()
            if not await self._exchange(loop, worker, job):  # killed (time-out) or died
                self._workers[index] = None
                await loop.run_in_executor(self._threads, worker.close)

    async def _exchange(self, loop: asyncio.AbstractEventLoop, worker: _Worker, job: _Job) -> bool:
        """Send ``job`` to ``worker`` and settle its future; False when the worker is gone."""
        body, job.body = job.body, None
        exchange = loop.run_in_executor(self._threads, _send_and_receive, worker.conn, job, body)
        del body
        retry = {"Retry-After": str(self.settings.retry_after_s)}
        try:
            kind, value = await asyncio.wait_for(asyncio.shield(exchange), job.timeout_s)
        except asyncio.TimeoutError:
            worker.kill()
            with contextlib.suppress(Exception):
                await exchange
            _settle(job, _parse_timeout(job.timeout_s, self.settings.retry_after_s))
            log.warning("a request task ran past %.0f s; its worker was killed", job.timeout_s)
            return False
        except asyncio.CancelledError:  # the pool is closing
            worker.kill()
            _settle(job, ApiError(503, "shutting_down", "the server is stopping; retry", headers=retry))
            raise
        except (EOFError, OSError) as exc:
            worker.kill()
            log.warning("a request task's worker died: %s", exc)
            _settle(
                job,
                ApiError(503, "worker_crashed", "the worker parsing this body died; retry", headers=retry),
            )
            return False
        if kind == "ok":
            if not job.future.done():
                job.future.set_result(value)
        else:
            headers = value["headers"] or None
            _settle(
                job,
                ApiError(value["status"], value["code"], value["detail"], headers=headers, **value["extra"]),
            )
        return True


def _send_and_receive(conn: Connection, job: _Job, parts: list[bytes] | None) -> tuple[str, Any]:
    """Thread: the job to the worker (its body part by part), its answer back (EOFError when the
    worker died)."""
    conn.send((job.task, job.args, None if parts is None else len(parts), job.versions))
    for part in parts or ():
        conn.send_bytes(part)
    del parts
    kind, value = conn.recv()
    return kind, value


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a job's failure as seen (a request that went away never awaits it)."""
    if not future.cancelled():
        future.exception()


def _settle(job: _Job, error: ApiError) -> None:
    if not job.future.done():
        job.future.set_exception(error)


def _busy(code: str, detail: str, retry_after_s: int, **headers: str) -> ApiError:
    return ApiError(429, code, detail, headers={"Retry-After": str(retry_after_s), **headers})


def _parse_timeout(limit_s: float, retry_after_s: int) -> ApiError:
    return ApiError(
        503,
        "parse_timeout",
        f"parsing and checking the body took more than {limit_s:.0f} s and was stopped; "
        "send a smaller graph or retry later",
        headers={"Retry-After": str(retry_after_s)},
    )
