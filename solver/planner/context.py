"""What travels through every stage of a plan: one clock, where progress goes, the memo.

:class:`PlanContext` carries the deadline, the caller's progress callback, the store of
the solve memo, the caller's hint plan and ``resolve``; a stage takes the context
instead of those as loose arguments.  The constants here are the time keeping the
stages share: how many memory rounds a mesh gets, the shortest solve worth starting,
and the time kept free for the evaluator's re-check of a plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from autopar.cost.remote_tables import RemoteTableBuilder
from autopar.infra.progress import Deadline, Progress, ProgressFn
from autopar.infra.store import KeyValueStore
from autopar.ir.plan import Plan
from autopar_solver.options import DETERMINISTIC_WALL_FACTOR, SolverOptions

__all__ = [
    "DETERMINISTIC_WALL_FACTOR",
    "EVALUATE_PER_BUILD",
    "EVALUATE_RESERVE_S",
    "EVALUATE_S_PER_OP",
    "MAX_MEMORY_ROUNDS",
    "MIN_SOLVE_S",
    "PlanContext",
    "evaluate_reserve",
    "wall_limit",
]

MAX_MEMORY_ROUNDS = 6
MIN_SOLVE_S = 0.2
"""Fewest seconds a solve is given; with less left the best verified plan so far is returned."""
EVALUATE_RESERVE_S = 1.0
"""Seconds kept free before the deadline, at least, for the evaluator's re-check of the
plan (measured on mt5-base, 4.2k ops, 2-core machine: 0.6-0.9 s wall from the solver's
answer to the verified plan)."""
EVALUATE_S_PER_OP = 1.5e-4
"""Seconds per op kept free before the deadline for building the plan from the solver's
answer and re-checking it, when that is more than :data:`EVALUATE_RESERVE_S` (measured on
the 50k-op graph, 2-core machine, 2026-12-02: 1.7 s to build the plan, 5.3 s to evaluate
it; with 1 s per 10k ops kept free, a 30 s limit ended at 33.7 s)."""
EVALUATE_PER_BUILD = 5.0
"""Evaluator seconds per second of :func:`build_problem` kept free before the deadline."""


def wall_limit(options: SolverOptions) -> float:
    """Wall seconds the command may take: deterministic runs get
    :data:`~autopar_solver.options.DETERMINISTIC_WALL_FACTOR` times their limit for every
    memory round and mesh shape."""
    if options.deterministic:
        return DETERMINISTIC_WALL_FACTOR * options.time_limit_s * MAX_MEMORY_ROUNDS * 4
    return options.time_limit_s


def evaluate_reserve(num_ops: int) -> float:
    """Seconds kept free before the deadline for the evaluator's re-check of a plan of
    ``num_ops`` ops (:data:`EVALUATE_RESERVE_S`, :data:`EVALUATE_S_PER_OP`)."""
    return max(EVALUATE_RESERVE_S, EVALUATE_S_PER_OP * num_ops)


@dataclass(frozen=True)
class PlanContext:
    """The clock and the channels of one plan command, handed from stage to stage."""

    deadline: Deadline
    progress: ProgressFn | None = None
    """The caller's callback (reports are stamped by :meth:`relay`)."""
    store: KeyValueStore | None = None
    """Where the cost-table memo and the solve memo live (None: no memo)."""
    hint: Plan | None = None
    """A plan to start from (used when it fits the mesh's tables)."""
    resolve: bool = False
    """Solve again even when the solve memo's plan is within the requested gap."""
    shape: tuple[int, ...] | None = None
    """The mesh shape reports carry (set by the mesh search)."""
    remote_tables: RemoteTableBuilder | None = None
    """Where missing cost-table entries are built besides this process (the service's
    workers); None: a local process pool only."""

    @classmethod
    def start(
        cls,
        options: SolverOptions,
        deadline: Deadline | None = None,
        **channels: Any,
    ) -> PlanContext:
        """A context on ``deadline``, or on a new one of :func:`wall_limit` from now."""
        return cls(deadline if deadline is not None else Deadline(wall_limit(options)), **channels)

    def relay(self) -> _Relay:
        """The callback the stages report to (see :class:`_Relay`)."""
        return _Relay(self.progress, self.deadline, self.shape)

    def for_shape(
        self, shape: tuple[int, ...], deadline: Deadline, progress: ProgressFn | None
    ) -> PlanContext:
        """This context for one shape of the mesh search: its own deadline and callback."""
        return replace(self, deadline=deadline, progress=progress, shape=shape)


class _Relay:
    """Forwards reports to the caller's callback, stamped with the command's one clock
    (elapsed, time left) and the mesh shape; the solves' own ``done`` becomes ``solved``:
    only :func:`~autopar_solver.planner.plan` says ``done``, once, with the chosen plan's
    objective."""

    def __init__(
        self, progress: ProgressFn | None, deadline: Deadline, shape: tuple[int, ...] | None
    ) -> None:
        self.progress = progress
        self.deadline = deadline
        self.shape = shape

    def __call__(self, p: Progress) -> None:
        if self.progress is None:
            return
        left = self.deadline.left()
        self.progress(
            replace(
                p,
                phase="solved" if p.phase == "done" else p.phase,
                elapsed_s=self.deadline.elapsed(),
                time_left_s=None if math.isinf(left) else left,
                shape=self.shape,
            )
        )

    def report(self, phase: str, **fields: Any) -> None:
        if self.progress is not None:
            self(Progress(phase, **fields))

    def callback(self) -> ProgressFn | None:
        """Itself when there is a caller to report to, else None (the solves skip reporting)."""
        return self if self.progress is not None else None
