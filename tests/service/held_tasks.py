"""Request tasks held in the worker processes until a test lets them go (tests only).

The service runs a request's parse, evaluation or report in a worker process
(:mod:`autopar_service.work_pool`), so a test cannot hold it with a ``threading.Event``.  A test
patches a task of :mod:`autopar_service.work_tasks` in its own process with one of these
(module-level functions: the pool sends them to its workers by name).  A body holding
``hold:DIR;`` (a graph named so) makes the task write ``DIR/started-PID`` and wait for
``DIR/release`` before it does the real work; any other body goes straight through.  A report
is held when ``DIR`` is given by :data:`REPORT_HOLD`'s file.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from autopar_service import work_tasks
from autopar_service.work_pool import WorkerContext

HOLD_WAIT_S = 120.0
_MARK = re.compile(rb"hold:([^;\"]+);")
REPORT_HOLD = Path(os.environ.get("TMPDIR", "/tmp")) / "autopar-test-report-hold"
"""A file naming the folder a held report waits on (one test at a time holds reports)."""


def hold_name(folder: Path) -> str:
    """The graph name that holds a body's task on ``folder``."""
    return f"hold:{folder};"


def _hold(folder: str) -> None:
    path = Path(folder)
    (path / f"started-{os.getpid()}").write_text(str(time.time()))
    deadline = time.monotonic() + HOLD_WAIT_S
    while not (path / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _held_by(body: bytes | None) -> None:
    found = _MARK.search(body or b"")
    if found is not None:
        _hold(found.group(1).decode())


def held_prepare_plan(context: WorkerContext, refresh: bool, *, body: bytes) -> Any:
    _held_by(body)
    return work_tasks.prepare_plan(context, refresh, body=body)


def held_evaluate_plan(context: WorkerContext, *, body: bytes) -> Any:
    _held_by(body)
    return work_tasks.evaluate_plan(context, body=body)


def held_render_report(context: WorkerContext, key: str, compare: tuple[str, ...]) -> Any:
    if REPORT_HOLD.exists():
        _hold(REPORT_HOLD.read_text())
    return work_tasks.render_report(context, key, compare)


def started(folder: Path) -> list[int]:
    """The worker processes a held task started in (their pids)."""
    return [int(p.name.split("-", 1)[1]) for p in folder.glob("started-*")]


def wait_started(folder: Path, count: int = 1, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(started(folder)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} held task(s) did not start in {timeout_s} s")
        time.sleep(0.01)
    return started(folder)


def release(folder: Path) -> None:
    (folder / "release").write_text("go")


def broken_prepare_plan(context: WorkerContext, refresh: bool, *, body: bytes) -> Any:
    """A task with a bug: the pool answers 500 ``internal_error`` (the detail without the message)."""
    raise RuntimeError("a bug")
