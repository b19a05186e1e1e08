"""Solve a :class:`~solver.problem.Problem` exactly (within a time limit).

::

    Problem ─ reduce ─> reduced Problem ─ heuristic ─> hint ─ CP-SAT ─> reduced choices
                                                                            │
    Solution <─ verify (evaluate on the ORIGINAL problem) <─ expand (undo stack)

The objective in :class:`Solution` is always recomputed by :func:`evaluate` on the
original problem; it must agree with CP-SAT's integer objective (plus the
seconds folded out by the reductions) within the documented rounding error, and
every memory row must fit, or :class:`~autopar.errors.VerificationError` is raised.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from autopar.errors import VerificationError
from solver.cpsat import CpSatResult, solve_cpsat
from solver.heuristic import HeuristicResult, solve_heuristic
from solver.options import Progress, ProgressFn, SolverOptions
from solver.problem import Problem, Solution, evaluate, memory_fits
from solver.reductions import Reduction, problem_size, reduce_problem

__all__ = ["solve"]

logger = logging.getLogger("solver")

_FLOAT_RTOL = 1e-9
"""Relative slack between float sums taken in different orders (reduced vs original)."""


def solve(
    problem: Problem,
    options: SolverOptions | None = None,
    progress: ProgressFn | None = None,
    hint: Sequence[int] | None = None,
) -> Solution:
    """Reductions -> heuristic -> CP-SAT -> expand -> verify.

    ``hint`` (one choice per original node, e.g. a cached plan) seeds the
    heuristic; the better of it and the plain heuristic becomes CP-SAT's hint.
    An invalid hint is ignored (``stats["hint"]`` says why).
    """
    options = options or SolverOptions()
    t0 = time.perf_counter()
    phases: dict[str, float] = {}
    stats: dict[str, Any] = {"phases_s": phases}

    def report(phase: str, objective: float | None = None, bound: float | None = None) -> None:
        if progress is not None:
            progress(Progress(phase, objective, bound, time.perf_counter() - t0))

    # -- reduce
    report("reduce")
    start = time.perf_counter()
    reduction = reduce_problem(problem, None if options.reductions else ())
    phases["reduce"] = time.perf_counter() - start
    stats["reductions"] = reduction.stats
    logger.debug("reductions: %s -> %s", reduction.stats["before"], reduction.stats["after"])
    if reduction.infeasible:
        return _finish_infeasible(stats, t0, report)
    reduced = reduction.reduced

    # -- heuristic
    report("heuristic")
    start = time.perf_counter()
    heuristic_budget = math.inf if options.deterministic else min(0.1 * options.time_limit_s, 5.0)
    best = solve_heuristic(reduced, time_budget_s=heuristic_budget, seed=options.seed)
    stats["heuristic"] = dict(best.stats)
    seed = _restricted_hint(problem, reduction, hint, stats)
    if seed is not None:
        seeded = solve_heuristic(
            reduced, start=seed, time_budget_s=heuristic_budget, seed=options.seed
        )
        if _better(seeded, best):
            best = seeded
            stats["hint"] = "used"
    phases["heuristic"] = time.perf_counter() - start
    stats["heuristic"].update(cost=best.cost + reduction.offset, feasible=best.feasible)
    report("heuristic", best.cost + reduction.offset if best.feasible else None)

    # -- nothing left: the reductions solved it
    if reduced.num_nodes == 0:
        stats["cpsat"] = None
        return _finish(problem, reduction, [], "optimal", None, None, stats, t0, report)

    # -- CP-SAT
    result = solve_cpsat(
        reduced,
        options,
        hint=best.choices if options.use_hint else None,
        progress=progress,
        offset=reduction.offset,
        t0=t0,
    )
    phases["build"] = result.stats["build_s"]
    phases["solve"] = result.stats["solve_s"]
    stats["cpsat"] = result.stats
    stats["rounding_error_s"] = result.rounding_error_s

    choices, status, source = _pick(reduced, result, best)
    stats["source"] = source
    if choices is None:
        if status == "infeasible":
            return _finish_infeasible(stats, t0, report)
        # Unknown and the heuristic found nothing that fits: return its best effort.
        choices = best.choices
    return _finish(
        problem,
        reduction,
        choices,
        status,
        result if source == "cpsat" else None,
        result,
        stats,
        t0,
        report,
    )


def _better(a: HeuristicResult, b: HeuristicResult) -> bool:
    if a.feasible != b.feasible:
        return a.feasible
    return a.cost < b.cost


def _restricted_hint(
    problem: Problem, reduction: Reduction, hint: Sequence[int] | None, stats: dict[str, Any]
) -> list[int | None] | None:
    if hint is None:
        return None
    if len(hint) != problem.num_nodes:
        stats["hint"] = f"ignored: {len(hint)} choices for {problem.num_nodes} nodes"
        return None
    for i, c in enumerate(hint):
        if not 0 <= c < len(problem.node_costs[i]):
            stats["hint"] = f"ignored: choice {c} out of range for node {problem.node_names[i]!r}"
            return None
    stats["hint"] = "not better than the heuristic"
    return reduction.restrict(hint)


def _pick(
    reduced: Problem, result: CpSatResult, heuristic: HeuristicResult
) -> tuple[list[int] | None, str, str]:
    """Choose between CP-SAT's and the heuristic's assignment: (choices, status, source)."""
    if result.choices is not None:
        cp_cost = evaluate(reduced, result.choices)[0]
        if heuristic.feasible and heuristic.cost < cp_cost - _FLOAT_RTOL * abs(cp_cost):
            return heuristic.choices, "feasible", "heuristic"
        return result.choices, result.status, "cpsat"
    if heuristic.feasible:
        # CP-SAT found nothing in time (or its rounded memory model was too tight).
        return heuristic.choices, "feasible", "heuristic"
    if result.status == "infeasible":
        return None, "infeasible", "cpsat"
    return None, "unknown", "heuristic"


def _finish_infeasible(stats: dict[str, Any], t0: float, report: Any) -> Solution:
    report("done")
    return Solution(
        choices=[],
        objective=math.inf,
        bound=math.inf,
        gap=0.0,
        status="infeasible",
        wall_s=time.perf_counter() - t0,
        stats=stats,
    )


def _finish(
    problem: Problem,
    reduction: Reduction,
    reduced_choices: list[int],
    status: str,
    from_cpsat: CpSatResult | None,
    result: CpSatResult | None,
    stats: dict[str, Any],
    t0: float,
    report: Any,
) -> Solution:
    report("expand")
    start = time.perf_counter()
    choices = reduction.expand(reduced_choices)
    objective, memory = evaluate(problem, choices)
    stats["phases_s"]["expand"] = time.perf_counter() - start
    stats["memory_bytes"] = memory
    stats["sizes"] = {"before": problem_size(problem), "after": problem_size(reduction.reduced)}
    if status in ("optimal", "feasible"):
        _verify(problem, reduction, reduced_choices, objective, memory, from_cpsat)
    bound = _bound(objective, status, result, reduction.offset)
    gap = (
        0.0
        if objective <= bound
        else ((objective - bound) / abs(objective) if objective != 0 else math.inf)
    )
    report("done", objective if math.isfinite(objective) else None, bound)
    return Solution(
        choices=choices,
        objective=objective,
        bound=bound,
        gap=gap,
        status=status,
        wall_s=time.perf_counter() - t0,
        stats=stats,
    )


def _bound(objective: float, status: str, result: CpSatResult | None, offset: float) -> float:
    if status == "optimal":
        return objective
    if result is None or not math.isfinite(result.bound_s):
        return -math.inf
    # A valid bound on the float problem: the integer bound minus the rounding slack.
    return min(objective, result.bound_s + offset - result.rounding_error_s)


def _verify(
    problem: Problem,
    reduction: Reduction,
    reduced_choices: list[int],
    objective: float,
    memory: list[float],
    from_cpsat: CpSatResult | None,
) -> None:
    if not math.isfinite(objective):
        raise VerificationError(
            None,
            "the solver's plan uses a forbidden choice or pair (infinite cost) on the original "
            "problem; this is a solver bug: report it with the problem",
        )
    if not memory_fits(problem.budget_bytes, memory):
        worst = max(range(len(memory)), key=lambda r: memory[r])
        raise VerificationError(
            None,
            f"the solver's plan needs {memory[worst]:.0f} bytes in memory row "
            f"{problem.memory_rows[worst].name!r}, over the budget {problem.budget_bytes:.0f}; "
            "this is a solver bug: report it with the problem",
        )
    tolerance = _FLOAT_RTOL * max(1.0, abs(objective))
    reduced_cost = evaluate(reduction.reduced, reduced_choices)[0] + reduction.offset
    if abs(reduced_cost - objective) > tolerance:
        raise VerificationError(
            None,
            f"reduced objective {reduced_cost!r} + folded constants disagrees with the original "
            f"objective {objective!r}; a reduction is not exact: report it with the problem",
        )
    if from_cpsat is not None and from_cpsat.objective_s is not None:
        expected = from_cpsat.objective_s + reduction.offset
        if abs(expected - objective) > from_cpsat.rounding_error_s + tolerance:
            raise VerificationError(
                None,
                f"CP-SAT objective {expected!r} s disagrees with the evaluated {objective!r} s "
                f"by more than the rounding bound {from_cpsat.rounding_error_s:.3g} s",
            )
