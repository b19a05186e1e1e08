"""Worker processes for cost-table batches that can always be stopped.

``multiprocessing.Pool.terminate()`` can hang for good: its task thread writes queued
tasks into one shared pipe, and when the workers are killed while it is blocked in that
write (a batch larger than the pipe buffer), nothing reads the pipe again and
``join()`` waits on the thread forever (seen on mt5-base's 4x8 mesh search: the
command stopped at its deadline and then hung for ten minutes; gdb showed the pool's
task thread in ``write`` on the task pipe and the main thread joining it).

Here there is no background thread: each worker has its own duplex pipe, the calling
thread sends a batch only to an idle worker (one blocked reading its pipe, so the send
completes), waits for results with :func:`multiprocessing.connection.wait` up to the
deadline, and :meth:`BatchPool.close` kills (SIGKILL) every worker still alive and
reaps it with a bounded join.  No step waits without a time limit on anything but a
live worker that is writing its result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any

from autopar.infra.progress import Deadline

__all__ = ["REAP_TIMEOUT_S", "BatchPool", "PoolTimeout", "WorkerLost"]

REAP_TIMEOUT_S = 5.0
"""Most seconds :meth:`BatchPool.close` waits for each killed worker to be reaped."""


class PoolTimeout(Exception):
    """The deadline passed with batches still out."""


class WorkerLost(RuntimeError):
    """A worker died (killed, out of memory) with a batch."""


def _serve(conn: Connection, fn: Callable[[Any], Any]) -> None:
    """A worker: ``fn`` of each batch read from ``conn``, sent back as (ok, value)."""
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        try:
            result = (True, fn(batch))
        except Exception as exc:  # raised again in the parent
            result = (False, exc)
        conn.send(result)


class BatchPool:
    """``workers`` processes that compute ``fn`` of batches; a context manager that kills
    them on exit."""

    def __init__(self, fn: Callable[[Any], Any], workers: int) -> None:
        context = get_context()
        self._workers: list[tuple[Any, Connection]] = []
        try:
            for _ in range(workers):
                parent, child = context.Pipe(duplex=True)
                process = context.Process(target=_serve, args=(child, fn), daemon=True)
                process.start()
                child.close()
                self._workers.append((process, parent))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> BatchPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, batches: list[tuple[Any, Any]], deadline: Deadline) -> Iterator[tuple[Any, Any]]:
        """(tag, ``fn(batch)``) for each (tag, batch) of ``batches``, in the order they finish;
        :class:`PoolTimeout` once ``deadline`` passes with some still out."""
        queue = list(reversed(batches))
        idle = [conn for _, conn in self._workers]
        out: dict[Connection, Any] = {}  # worker -> tag of the batch it has
        while queue or out:
            while queue and idle:
                tag, batch = queue.pop()
                conn = idle.pop()
                try:
                    conn.send(batch)
                except OSError as exc:  # the worker is gone
                    raise WorkerLost(f"a cost-table worker died: {exc}") from None
                out[conn] = tag
            left = deadline.left()
            ready = wait(list(out), timeout=None if math.isinf(left) else left)
            if not ready:
                raise PoolTimeout(f"{len(out) + len(queue)} of {len(batches)} batches not done")
            for conn in [c for c in out if c in ready]:
                try:
                    ok, value = conn.recv()
                except (EOFError, OSError):
                    raise WorkerLost("a cost-table worker died with a batch") from None
                if not ok:
                    raise value
                idle.append(conn)
                yield out.pop(conn), value

    def close(self) -> None:
        """Kill every worker still alive and reap it (each join bounded by
        :data:`REAP_TIMEOUT_S`)."""
        for process, conn in self._workers:
            conn.close()
            if process.is_alive():
                process.kill()
        for process, _ in self._workers:
            process.join(REAP_TIMEOUT_S)
        self._workers = []
