"""Verification: a plan's evaluation must agree with what the solver (or the memo) claimed.

Every plan the planner returns, solved, recalled from the solve memo or lifted onto the
requested mesh, passes :func:`verify`: the independent evaluator
(:func:`autopar.cost.evaluate.evaluate`) accepts it, its iteration with every consumer's
boxing priced on its own equals the objective (the solver prices each edge; the runtime may
share a tensor's boxing between consumers, which only lowers the plan's price: the plan
reports the runtime's), and its memory fits the budget; else
:class:`~autopar.errors.VerificationError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from autopar.errors import VerificationError
from autopar_solver.problem import Solution

__all__ = ["VERIFY_RTOL", "SolvedObjective", "verify", "with_bound"]

VERIFY_RTOL = 1e-6


@dataclass(frozen=True)
class SolvedObjective:
    """Only an objective to check an evaluation against (a recalled or lifted plan)."""

    objective: float


def verify(ev: Any, solution: Solution | SolvedObjective, budget: int | None, graph: Any = None) -> None:
    """Raise :class:`VerificationError` unless evaluation ``ev`` is valid, its iteration time is
    ``solution.objective`` (within :data:`VERIFY_RTOL`) and its memory is within ``budget``.

    ``graph``: the plan's graph, for a runtime that runs sibling linears as one GEMM: the
    objective leaves out the boxing of the siblings after the first (:mod:`.siblings`)."""
    from autopar.runtimes.registry import runtime_profile
    from autopar_solver.planner.siblings import sibling_discount

    if not ev.valid:
        raise VerificationError(
            "invalid_plan",
            f"the evaluator rejected the solver's plan: {ev.errors[:3]}",
            errors=ev.errors[:20],
        )
    # the objective is the iteration (K x micro-batch + once per step; the step at K = 1) with
    # every edge priced on its own
    per_edge = ev.per_edge_iteration_time_s
    if graph is not None:
        per_edge -= sibling_discount(graph, runtime_profile(ev.runtime).fuses_sibling_linears, ev)
    if not math.isclose(per_edge, solution.objective, rel_tol=VERIFY_RTOL, abs_tol=1e-12):
        raise VerificationError(
            "cost_mismatch",
            f"evaluator iteration (every edge on its own) {per_edge!r} s != solver objective "
            f"{solution.objective!r} s",
        )
    if budget is not None and ev.memory.total > budget:
        raise VerificationError(
            "memory_mismatch", f"plan needs {ev.memory.total:.0f} bytes per device > budget {budget}"
        )


def with_bound(solution: Solution, best_bound: float) -> Solution:
    """``solution`` with ``best_bound`` (an earlier round's, a relaxation's) when that is
    greater than its own, and the gap that follows."""
    if not best_bound > solution.bound:
        return solution
    bound = min(best_bound, solution.objective)
    gap = 0.0 if solution.objective <= 0 else max(0.0, (solution.objective - bound) / solution.objective)
    return replace(solution, bound=bound, gap=gap, stats={**solution.stats, "bound": "earlier round"})
