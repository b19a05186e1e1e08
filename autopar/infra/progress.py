"""Progress reports and the time limit of one planning command.

One :class:`Progress` record type for every stage (cost tables, baselines,
evaluation, reductions, heuristic, CP-SAT, memory rounds, mesh search) and one
callback type, :data:`ProgressFn`.  A :class:`Deadline` is the wall-clock budget
of the whole command: every stage asks it how much time is left, and the
elapsed seconds it reports come from one clock, so they never go backwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Deadline", "Progress", "ProgressFn"]


@dataclass(frozen=True)
class Progress:
    """One progress report.  Objective and bound are seconds of modelled step time."""

    phase: str
    """Stage name, e.g. ``cost_tables:edges``, ``reduce``, ``solve``, ``memory``, ``done``."""
    objective: float | None = None
    """Best assignment so far, seconds (None before the first one)."""
    bound: float | None = None
    """Proven lower bound so far, seconds (None before the solver has one)."""
    elapsed_s: float = 0.0
    """Seconds since the command started (one clock: never decreases)."""
    done: int | None = None
    """Units of the phase finished (with :attr:`total`: percent done)."""
    total: int | None = None
    time_left_s: float | None = None
    """Seconds left of the time limit (None without a limit)."""
    shape: tuple[int, ...] | None = None
    """Mesh shape this report is about (mesh search), None for the only one."""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def percent(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return 100.0 * min(self.done, self.total) / self.total


ProgressFn = Callable[[Progress], None]
"""Progress callback.  It may be called from a solver thread, one call at a time;
it must return quickly and not raise."""


class Deadline:
    """The wall-clock budget of one command: ``limit_s`` seconds from ``start``
    (a :func:`time.perf_counter` value, default now); ``limit_s=inf`` never expires."""

    def __init__(self, limit_s: float = math.inf, start: float | None = None) -> None:
        self.limit_s = float(limit_s)
        self.start = time.perf_counter() if start is None else start

    @property
    def at(self) -> float:
        """The :func:`time.perf_counter` value at which time is up."""
        return self.start + self.limit_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds left (0 once expired; ``inf`` without a limit)."""
        return max(0.0, self.at - time.perf_counter())

    def expired(self) -> bool:
        return time.perf_counter() >= self.at

    def report(self, progress: ProgressFn | None, phase: str, **fields: Any) -> None:
        """Send ``Progress(phase, **fields)`` stamped with this clock's elapsed and left seconds."""
        if progress is None:
            return
        left = self.left()
        progress(
            Progress(
                phase,
                elapsed_s=self.elapsed(),
                time_left_s=None if math.isinf(left) else left,
                **fields,
            )
        )
