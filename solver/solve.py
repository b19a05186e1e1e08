"""Solve a :class:`~autopar_solver.problem.Problem` exactly (within a time limit).

::

    Problem ─ reduce ─> reduced Problem ─ TRW-S set up; its sweeps start in a thread
                                        ─ heuristic ─> plan that fits (usually)
                                        ─ TRW-S bound (Lagrangian on memory), decoded into
                                          plans every 10 sweeps (compiled greedy + ICM)
            ─ model small enough?  yes ─> CP-SAT on the whole reduced problem, hinted
                                   no  ─> CP-SAT on windows (LNS) from the best plan
            ─ expand (undo stack) ─> verify on the ORIGINAL problem ─> Solution

This module is the orchestration: the reductions, the strategy (one model or windows), the
phases' shares of the time, the choice between plans, expansion and verification.  The
TRW-S bound and the plans decoded from it, with the sweeping threads, are
:mod:`autopar_solver.dual`: off the deterministic path a TRW-S run sweeps in a second
thread (numba kernels that release the interpreter lock) while this thread runs the
heuristic and decodes snapshots of the run, so on a 2-core machine both cores work.

The objective in :class:`Solution` is always recomputed by :func:`evaluate` on the
original problem; it must agree with the reduced problem's cost plus the seconds
folded out by the reductions, and with CP-SAT's integer objective within the
documented rounding error, and every memory row must fit, or
:class:`~autopar.errors.VerificationError` is raised.

The bound is the best of CP-SAT's bound (minus its rounding error) and the
TRW-S bound (:mod:`autopar_solver.bounds`), plus the folded seconds; when it meets the objective the
status is "optimal" whichever search found the plan.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from autopar.errors import VerificationError
from autopar_solver.cpsat import CpSatResult, find_feasible, model_size, solve_cpsat
from autopar_solver.dual import Dual, better, evaluated, is_dense, relative_gap, starting_prices
from autopar_solver.heuristic import HeuristicResult, solve_heuristic
from autopar_solver.lns import WINDOW_TIME_S, window_search
from autopar_solver.options import Progress, ProgressFn, SolverOptions
from autopar_solver.problem import Problem, Solution, evaluate, memory_fits
from autopar_solver.reductions import Reduction, problem_size, reduce_problem, unreduced

__all__ = ["solve", "starting_prices"]  # starting_prices: from autopar_solver.dual

logger = logging.getLogger("solver")

_FLOAT_RTOL = 1e-9
"""Relative slack between float sums taken in different orders (reduced vs original)."""
_OPTIMAL_RTOL = 1e-7
"""A plan within this (relative) of a proven bound is reported "optimal": float noise
and the last digits a converging bound never reaches."""
_SHARES = {"model": (0.05, 0.3), "windows": (0.05, 1.0)}
"""Share of the time limit for (heuristic, dual phase) per strategy.  The dual phase
stops early once its bound meets the best plan (within ``relative_gap`` for big
problems, to optimality for small ones) or when TRW-S has converged.  On the
planner's problems the local-polytope LP is nearly tight, so plans decoded from the
TRW-S are near-optimal and the dual phase gets the time: for big problems all
of it, windows only run once TRW-S has converged (on MT5-base tables windows
never improved a decoded plan; on tiny-gpt the dual phase proves optimality in
under a second where one CP-SAT model reached a 23 % gap in 50 s)."""
_REDUCE_SHARE = 0.4
"""Share of the time limit the reductions may take before the search starts on what is
left (they are exact one by one, so stopping early only leaves a larger problem)."""
_MARGIN_S = 0.3
"""Kept free before the deadline for the last sweep, expansion and verification."""
_WINDOW_STALL = 8
"""Windows in a row without a gain before the rest of the time goes to the bound."""

_Report = Callable[..., None]


def solve(
    problem: Problem,
    options: SolverOptions | None = None,
    progress: ProgressFn | None = None,
    hint: Sequence[int] | None = None,
) -> Solution:
    """Reductions -> heuristic -> bound -> CP-SAT (whole or windows) -> expand -> verify.

    ``hint`` (one choice per original node, e.g. a cached plan) seeds the
    heuristic; the better of it and the plain heuristic becomes CP-SAT's hint.
    An invalid hint is ignored (``stats["hint"]`` says why).
    """
    run = _Run(problem, options or SolverOptions(), progress)
    reduction = _reduce(run)
    if reduction.infeasible:
        return _finish_infeasible(run.stats, run.t0, run.report)
    strategy = run.plan_search(reduction)
    dual, best = _dual_and_heuristic(run, reduction, hint)
    if reduction.reduced.num_nodes == 0:  # nothing left: the reductions solved it
        run.stats["cpsat"] = None
        return _finish(problem, reduction, [], "optimal", None, -math.inf, run.stats, run.t0, run.report)
    best = _advance_dual(run, reduction, dual, best)
    enough = run.options.relative_gap if strategy == "windows" else _OPTIMAL_RTOL
    if best.feasible and relative_gap(best.cost, dual.lower) <= enough:
        # The bound already meets the plan: within the requested gap for big
        # problems; proven optimal for ones small enough for one CP-SAT model.
        run.stats.update(strategy="dual", cpsat=None, source="dual")
        return _finish(
            problem, reduction, best.choices, "feasible", None, dual.lower, run.stats, run.t0, run.report
        )
    if strategy == "windows":
        if not best.feasible:
            best = _any_feasible(run, reduction, best)
        if best.feasible:
            return _windows(run, reduction, dual, best)
    return _one_model(run, reduction, dual, best)


class _Run:
    """One :func:`solve` call: its problem, options, clock, phase times and stats."""

    def __init__(self, problem: Problem, options: SolverOptions, progress: ProgressFn | None) -> None:
        self.problem = problem
        self.options = options
        self.progress = progress
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + options.time_limit_s
        self.phases: dict[str, float] = {}
        self.stats: dict[str, Any] = {"phases_s": self.phases}
        self.strategy = "model"
        """One CP-SAT ``model`` of the reduced problem, or ``windows`` of it (LNS)."""
        self.shares = _SHARES["model"]
        """(heuristic, dual phase) shares of the time limit of the strategy."""
        self.dual_deadline = self.deadline
        """When the dual phase stops (its share of the time)."""
        self.bound_s = 0.0
        """Seconds setting up the dual (before the heuristic)."""

    def report(self, phase: str, objective: float | None = None, bound: float | None = None) -> None:
        if self.progress is not None:
            self.progress(Progress(phase, objective, bound, time.perf_counter() - self.t0))

    def plan_search(self, reduction: Reduction) -> str:
        """``model`` (one CP-SAT model) or ``windows`` (LNS), by the reduced problem's size."""
        size = model_size(reduction.reduced)
        strategy = "model" if size <= self.options.max_model_vars else "windows"
        self.stats["model_size"] = size
        self.strategy = strategy
        self.shares = _SHARES[strategy]
        return strategy


def _reduce(run: _Run) -> Reduction:
    """The exact reductions, to the fixpoint or their share of the time."""
    options = run.options
    run.report("reduce")
    start = time.perf_counter()
    dense = _too_dense_to_reduce(run.problem)
    if dense is not None:
        reduction = unreduced(run.problem, dense)
    else:
        reduction = reduce_problem(
            run.problem,
            None if options.reductions else (),
            # deterministic runs reduce to the fixpoint: the clock must not change the answer
            deadline=None if options.deterministic else run.t0 + _REDUCE_SHARE * options.time_limit_s,
        )
    run.phases["reduce"] = time.perf_counter() - start
    run.stats["reductions"] = reduction.stats
    logger.debug("reductions: %s -> %s", reduction.stats["before"], reduction.stats["after"])
    return reduction


def _too_dense_to_reduce(problem: Problem) -> str | None:
    """Why the reductions are skipped on ``problem`` (None: they run): more than
    :data:`~autopar_solver.dual._DENSE_ENTRIES` edge entries at over
    :data:`~autopar_solver.dual._DENSE_ENTRIES_PER_EDGE` per edge on average, and no self-loop."""
    entries = sum(m.size for _, _, m in problem.edges)
    if not is_dense(entries, len(problem.edges)):
        return None
    if any(u == v for u, v, _ in problem.edges):
        return None
    return f"{entries} edge entries, {entries // len(problem.edges)} per edge"


def _dual_and_heuristic(
    run: _Run, reduction: Reduction, hint: Sequence[int] | None
) -> tuple[Dual, HeuristicResult]:
    """The TRW-S bound, set up first (off the deterministic path its sweeps go on in a
    thread while the heuristic runs), and the heuristic's plan."""
    options = run.options
    heuristic_share, dual_share = run.shares
    start = time.perf_counter()
    run.dual_deadline = min(run.deadline - _MARGIN_S, start + dual_share * options.time_limit_s)
    dual = Dual(reduction.reduced, options, None if options.deterministic else run.deadline)
    if not options.deterministic:
        dual.start_sweeping(run.dual_deadline)  # (no run when the reductions solved it)
    run.bound_s = time.perf_counter() - start

    run.report("heuristic")
    start = time.perf_counter()
    try:
        best = _heuristic(run.problem, reduction, hint, options, run.stats, heuristic_share)
    except BaseException:
        dual.stop_sweeping()
        raise
    run.phases["heuristic"] = time.perf_counter() - start
    run.stats["heuristic"].update(cost=best.cost + reduction.offset, feasible=best.feasible)
    run.report("heuristic", best.cost + reduction.offset if best.feasible else None)
    return dual, best


def _advance_dual(run: _Run, reduction: Reduction, dual: Dual, best: HeuristicResult) -> HeuristicResult:
    """Sweep the bound from the heuristic's plan, decoding plans, for the dual phase's share;
    the best plan so far."""
    options = run.options
    strategy_gap = options.relative_gap if run.strategy == "windows" else _OPTIMAL_RTOL
    start = time.perf_counter()
    dual.use_heuristic(best, None if options.deterministic else run.deadline)
    dual.advance(run.dual_deadline, strategy_gap)
    best = dual.best
    run.phases["bound"] = run.bound_s + time.perf_counter() - start
    run.stats["dual"] = dual.stats
    offset = reduction.offset
    run.report("heuristic", best.cost + offset if best.feasible else None, dual.lower + offset)
    return best


def _any_feasible(run: _Run, reduction: Reduction, best: HeuristicResult) -> HeuristicResult:
    """Too big for one model and the heuristic found no plan that fits: ask CP-SAT for any
    plan that fits (a much smaller model), before the windows."""
    options = run.options
    reduced = reduction.reduced
    start = time.perf_counter()
    limit = options.time_limit_s if options.deterministic else run.deadline - start
    found = find_feasible(reduced, options, best.choices, time_limit_s=max(limit, 0.05))
    run.phases["feasibility"] = time.perf_counter() - start
    run.stats["feasibility"] = found is not None
    if found is None:
        return best
    cost, memory = evaluate(reduced, found)
    return HeuristicResult(found, cost, memory, memory_fits(reduced.budget_bytes, memory))


def _windows(run: _Run, reduction: Reduction, dual: Dual, best: HeuristicResult) -> Solution:
    """CP-SAT on windows of the problem (LNS) from the best plan; then the rest of the time
    to the dual, once the windows stop paying off."""
    options, stats, offset, reduced = run.options, run.stats, reduction.offset, reduction.reduced
    stats["strategy"] = "windows"
    run.report("solve", best.cost + offset, dual.lower + offset)
    start = time.perf_counter()
    lns = window_search(
        reduced,
        best.choices,
        options,
        # Deterministic runs count windows instead of watching the clock.
        deadline=math.inf if options.deterministic else run.deadline,
        max_windows=(max(1, int(options.time_limit_s / WINDOW_TIME_S)) if options.deterministic else None),
        t0=run.t0,
        offset=offset,
        progress=run.progress,
        stall=None if options.deterministic else _WINDOW_STALL,
    )
    run.phases["solve"] = time.perf_counter() - start
    choices = lns.choices
    if not options.deterministic and time.perf_counter() < run.deadline - 2 * _MARGIN_S:
        # Windows stopped paying off: spend the rest on the dual.
        start = time.perf_counter()
        _, memory, fits = evaluated(reduced, lns.choices)
        dual.best = HeuristicResult(lns.choices, lns.cost, memory, fits)
        dual.advance(run.deadline - _MARGIN_S, options.relative_gap)
        choices = dual.best.choices
        run.phases["bound"] += time.perf_counter() - start
        stats["dual"] = dual.stats
    stats["cpsat"] = None
    stats["windows"] = lns.stats
    stats["source"] = "windows"
    return _finish(run.problem, reduction, choices, "feasible", None, dual.lower, stats, run.t0, run.report)


def _one_model(run: _Run, reduction: Reduction, dual: Dual, best: HeuristicResult) -> Solution:
    """CP-SAT on the whole reduced problem, hinted with the best plan; the better of its
    answer and that plan."""
    options, stats, reduced = run.options, run.stats, reduction.reduced
    stats["strategy"] = "model"
    result = solve_cpsat(
        reduced,
        options,
        hint=best.choices if options.use_hint else None,
        progress=run.progress,
        offset=reduction.offset,
        t0=run.t0,
        lower_bound_s=dual.lower,
    )
    run.phases["build"] = result.stats["build_s"]
    run.phases["solve"] = result.stats["solve_s"]
    stats["cpsat"] = result.stats
    stats["rounding_error_s"] = result.rounding_error_s
    lower = dual.lower
    if math.isfinite(result.bound_s):
        lower = max(lower, result.bound_s - result.rounding_error_s)

    picked, status, source = _pick(reduced, result, best)
    stats["source"] = source
    if picked is None:
        if status == "infeasible":
            return _finish_infeasible(stats, run.t0, run.report)
        # Unknown and the heuristic found nothing that fits: return its best effort.
        picked = best.choices
    cpsat = result if source == "cpsat" else None
    return _finish(run.problem, reduction, picked, status, cpsat, lower, stats, run.t0, run.report)


def _heuristic(
    problem: Problem,
    reduction: Reduction,
    hint: Sequence[int] | None,
    options: SolverOptions,
    stats: dict[str, Any],
    share: float,
) -> HeuristicResult:
    budget = math.inf if options.deterministic else share * options.time_limit_s
    best = solve_heuristic(reduction.reduced, time_budget_s=budget, seed=options.seed)
    stats["heuristic"] = dict(best.stats)
    seed = _restricted_hint(problem, reduction, hint, stats)
    if seed is not None:
        seeded = solve_heuristic(reduction.reduced, start=seed, time_budget_s=budget, seed=options.seed)
        if better(seeded, best):
            best = seeded
            stats["hint"] = "used"
    return best


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


def _finish_infeasible(stats: dict[str, Any], t0: float, report: _Report) -> Solution:
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
    reduced_bound: float,
    stats: dict[str, Any],
    t0: float,
    report: _Report,
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
    bound = min(objective, reduced_bound + reduction.offset)
    if status == "feasible" and objective - bound <= _OPTIMAL_RTOL * abs(objective):
        status = "optimal"  # the bound meets the plan: proven optimal
    if status == "optimal":
        bound = objective
    gap = relative_gap(objective, bound)
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
