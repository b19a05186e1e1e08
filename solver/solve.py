"""Solve a :class:`~autopar_solver.problem.Problem` exactly (within a time limit).

::

    Problem ─ reduce ─> reduced Problem ─ TRW-S set up; its sweeps start in a thread
                                        ─ heuristic ─> plan that fits (usually)
                                        ─ TRW-S bound (Lagrangian on memory), decoded into
                                          plans every 10 sweeps (compiled greedy + ICM)
            ─ model small enough?  yes ─> CP-SAT on the whole reduced problem, hinted
                                   no  ─> CP-SAT on windows (LNS) from the best plan
            ─ expand (undo stack) ─> verify on the ORIGINAL problem ─> Solution

Off the deterministic path, a TRW-S run without memory prices sweeps in a second thread
(numba kernels that release the interpreter lock) while this thread runs the heuristic
and decodes snapshots of the run: on a 2-core machine both cores work.

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
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from autopar.errors import VerificationError
from autopar_solver.bounds import DiffusionBound, LayoutCut, reparametrized
from autopar_solver.cpsat import CpSatResult, find_feasible, model_size, solve_cpsat
from autopar_solver.heuristic import HeuristicResult, greedy_assignment, solve_heuristic
from autopar_solver.lns import WINDOW_TIME_S, window_search
from autopar_solver.options import Progress, ProgressFn, SolverOptions
from autopar_solver.problem import Problem, Solution, cost_spread, evaluate, memory_fits, trivial_bound
from autopar_solver.reductions import Reduction, problem_size, reduce_problem, unreduced

__all__ = ["solve"]

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
_DENSE_ENTRIES = 40_000_000
_DENSE_ENTRIES_PER_EDGE = 4096
"""Problems with more edge entries than this, and more than this many per edge on average
(three-axis meshes: mt5-base on [2, 2, 2] has 150.9M entries, 23k per edge; on [4, 2]:
4.3M, 650), skip the reductions: there they copied every matrix for seconds (6-10 s on
the loaded 2-core machine, 2026-12-04) to remove 2 % of the entries, time the TRW-S bound
needs."""
_DETERMINISTIC_SWEEPS = 80
_CHUNK = 10
_MAX_ROUNDS = 120
"""Decodes follow every 10 sweeps, up to 1200 sweeps per solve.  A decode is compiled
(greedy on the reparametrised costs, then ICM on the run's own: about 0.1 s on mt5-base,
as long as 4 sweeps).  Decoded plans improve in jumps (mt5-base on [4, 2]: about 4 %
above the bound up to 90 sweeps, then 0.35 % from 95 on), so decodes come often."""
_DESCENT_EVERY = 4
"""Every 4th decode round also runs the heuristic's descent (tree-block moves, memory
repair; Python, up to :data:`_DECODE_S`) on the round's best decoded plan, as does any
round whose decoded plans all overflow the budget."""
_PRICE_UP = 1.5
_PRICE_DOWN = 1.25
_PRICE_CEILING = 1e200
"""Most seconds per byte a memory row is priced at: where no plan fits (an infeasible
problem the reductions did not see, e.g. a dense one they skip) prices rise each decode,
and past this one memory already outweighs any step time (seconds <= 1e3, bytes <= 1e15)
by 1e180 while priced terms would overflow float64 near 1e308."""
_MARGIN_S = 0.3
"""Kept free before the deadline for the last sweep, expansion and verification."""
_DECODE_S = 1.0
_WINDOW_STALL = 8
_MAX_DUAL_ENTRIES = 40_000_000
"""Largest problem (edge matrix entries) TRW-S is set up for: it keeps two copies of
every entry (16 bytes each)."""
_MAX_DENSE_DUAL_ENTRIES = 250_000_000
"""The same for a dense problem (:func:`_dense`), whose copies are in single precision
(:data:`~autopar_solver.bounds.SINGLE_ENTRIES`; 8 bytes an entry: 2 GB at this size;
mt5-base on [2, 2, 2] has 150.9M entries, whose bound is what proves a three-axis plan's
gap)."""
_SETUP_S_PER_ENTRY = 1.5e-7
"""TRW-S setup seconds per edge entry (measured on mt5-base's reduced problem, 2.9M
entries: 0.2-0.4 s, the compiled layout included)."""
_DENSE_SETUP_S_PER_ENTRY = 6e-8
"""The same for a dense problem (single precision; mt5-base on [2, 2, 2], 150.9M entries,
loaded 2-core machine, 2026-12-04: 2.8-13 s, most of it the first touch of the pages of
the copies)."""
_SETUP_SHARE = 1.0
"""TRW-S is set up only when its estimated setup fits in this share of the time left (a
safety net: the planner already skips the untied solve of a tied graph without time)."""
_SETUP_CUT_SHARE = 0.5
"""A TRW-S layout still running after this share of the time left is abandoned (no time
would be left to sweep it)."""
_DENSE_FINAL_S = 2.0
"""Seconds a dense problem's sweeps stop before its dual phase ends, for the decode of
their last state and the heuristic's descent from the best plan (mt5-base on [2, 2, 2],
loaded 2-core machine: 0.3-0.4 s to decode, 1 s of descent: 43.5 ms -> 40.6 ms)."""
_PRICED_SETUP_FACTOR = 4
"""The priced run is set up only with this many times the first run's setup time left."""
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
    if best.feasible and _relative_gap(best.cost, dual.lower) <= enough:
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


def _dense(entries: int, edges: int) -> bool:
    """Over :data:`_DENSE_ENTRIES` edge entries, and over :data:`_DENSE_ENTRIES_PER_EDGE` per
    edge on average (three-axis meshes)."""
    return entries > _DENSE_ENTRIES and entries > _DENSE_ENTRIES_PER_EDGE * edges


def _too_dense_to_reduce(problem: Problem) -> str | None:
    """Why the reductions are skipped on ``problem`` (None: they run): more than
    :data:`_DENSE_ENTRIES` edge entries at over :data:`_DENSE_ENTRIES_PER_EDGE` per edge on
    average, and no self-loop."""
    entries = sum(m.size for _, _, m in problem.edges)
    if not _dense(entries, len(problem.edges)):
        return None
    if any(u == v for u, v, _ in problem.edges):
        return None
    return f"{entries} edge entries, {entries // len(problem.edges)} per edge"


def _dual_and_heuristic(
    run: _Run, reduction: Reduction, hint: Sequence[int] | None
) -> tuple[_Dual, HeuristicResult]:
    """The TRW-S bound, set up first (off the deterministic path its sweeps go on in a
    thread while the heuristic runs), and the heuristic's plan."""
    options = run.options
    heuristic_share, dual_share = run.shares
    start = time.perf_counter()
    run.dual_deadline = min(run.deadline - _MARGIN_S, start + dual_share * options.time_limit_s)
    dual = _Dual(reduction.reduced, options, None if options.deterministic else run.deadline)
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


def _advance_dual(run: _Run, reduction: Reduction, dual: _Dual, best: HeuristicResult) -> HeuristicResult:
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


def _windows(run: _Run, reduction: Reduction, dual: _Dual, best: HeuristicResult) -> Solution:
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
        _, memory, fits = _evaluated(reduced, lns.choices)
        dual.best = HeuristicResult(lns.choices, lns.cost, memory, fits)
        dual.advance(run.deadline - _MARGIN_S, options.relative_gap)
        choices = dual.best.choices
        run.phases["bound"] += time.perf_counter() - start
        stats["dual"] = dual.stats
    stats["cpsat"] = None
    stats["windows"] = lns.stats
    stats["source"] = "windows"
    return _finish(run.problem, reduction, choices, "feasible", None, dual.lower, stats, run.t0, run.report)


def _one_model(run: _Run, reduction: Reduction, dual: _Dual, best: HeuristicResult) -> Solution:
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
        if _better(seeded, best):
            best = seeded
            stats["hint"] = "used"
    return best


class _Dual:
    """TRW-S runs (without prices and, if memory binds, with the heuristic's
    prices) whose reparametrised problems are decoded into plans: a greedy pass on
    the reparametrised costs, then the heuristic's descent on the true costs."""

    def __init__(
        self,
        reduced: Problem,
        options: SolverOptions,
        deadline: float | None = None,
    ) -> None:
        self.reduced = reduced
        self.best = HeuristicResult([], math.inf, [], False)
        """Best plan so far (:meth:`use_heuristic` sets the heuristic's)."""
        self.options = options
        self.sweepers: list[_Sweeper] = []
        """Runs sweeping in threads of their own (:meth:`start_sweeping`)."""
        self._fresh = threading.Event()
        """Set by a sweeper when it has published a new state."""
        self._retired: set[DiffusionBound] = set()
        """Runs that no thread is to sweep again."""
        self.trivial = trivial_bound(reduced)
        """The bound without any sweep: every node and edge at its least, seconds."""
        self.runs: list[DiffusionBound] = []
        self.setup_s = 0.0
        self.rounds = 0
        self.memory = bool(reduced.memory_rows) and reduced.budget_bytes is not None
        """Memory rows are in play (a decoded plan may not fit)."""
        self.decode_s = 0.0
        """Seconds the last decode took (time kept free for the next one)."""
        self.stats: dict[str, Any] = {"decodes": 0, "improved": 0, "sweeps": []}
        entries = sum(m.size for _, _, m in reduced.edges)
        self.dense = _dense(entries, len(reduced.edges))
        """A problem this big sweeps slowly (three-axis meshes: about 0.3-0.5 s a sweep on
        the loaded 2-core machine): its sweeps stop :data:`_DENSE_FINAL_S` before the dual
        phase ends, so that their last state is decoded and the best plan descended."""
        if not reduced.num_nodes:
            return  # the reductions solved it
        left = math.inf if deadline is None else deadline - time.perf_counter()
        most, per_entry = (
            (_MAX_DENSE_DUAL_ENTRIES, _DENSE_SETUP_S_PER_ENTRY)
            if self.dense
            else (_MAX_DUAL_ENTRIES, _SETUP_S_PER_ENTRY)
        )
        if entries > most or entries * per_entry > _SETUP_SHARE * left:
            # too big to lay out in the time (or memory) there is: the trivial bound only
            self.stats["skipped"] = f"{entries} edge entries"
            return
        began = time.perf_counter()
        try:
            self.runs = [DiffusionBound(reduced, deadline=began + _SETUP_CUT_SHARE * left)]
        except LayoutCut as cut:  # the estimate was short (a loaded machine): no bound in time
            self.stats["skipped"] = f"{entries} edge entries; {cut}"
            return
        self.setup_s = time.perf_counter() - began
        self.stats["sweeps"] = [0]
        self.stats["single_precision"] = self.runs[0].single

    def use_heuristic(self, best: HeuristicResult, deadline: float | None = None) -> None:
        """Start from the heuristic's plan; when memory binds (the plan has prices) add a
        second run on the priced problem, whose bound counts memory, and stop sweeping
        the first (it keeps its bound): off the deterministic path the priced run then
        sweeps alone, in a thread, with both cores' worth of the time."""
        self.best = best
        price = best.price
        if price is None and self.memory:
            # memory rows are in play because an earlier round's plan overflowed; a plan
            # that fits from the start leaves the heuristic no prices to hand on
            price = starting_prices(self.reduced)
        if (
            self.runs
            and price is not None
            and math.isfinite(self.runs[0].value)
            and (deadline is None or deadline - time.perf_counter() > _PRICED_SETUP_FACTOR * self.setup_s)
        ):
            self.stop_sweeping()
            if not self.options.deterministic:
                self._retired.add(self.runs[0])
            self.runs.append(DiffusionBound(self.reduced, price))
        self.stats["sweeps"] = [r.sweeps for r in self.runs]

    @property
    def lower(self) -> float:
        return max([self.trivial, *(run.value for run in self.runs)])

    def advance(self, deadline: float, target_gap: float) -> None:
        """Sweep and decode until ``deadline`` (deterministic: a fixed sweep count),
        until every run has converged, or until the gap is at most ``target_gap``.

        Decodes follow every :data:`_CHUNK` sweeps; time for one more decode is kept
        before the deadline; after two rounds only the run with the higher bound goes
        on.  Off the deterministic path every run sweeps in a thread of its own
        (:meth:`_advance_in_parallel`)."""
        deterministic = self.options.deterministic
        if not deterministic:
            self.start_sweeping(deadline)
        if self.sweepers:
            self._advance_in_parallel(deadline, target_gap)
            return
        while True:
            live = [r for r in self.runs if not r.converged and r not in self._retired]
            if deterministic:
                live = [r for r in live if r.sweeps < _DETERMINISTIC_SWEEPS]
            if self.rounds >= _MAX_ROUNDS:
                break
            if self.rounds >= 2 and len(live) > 1:
                live = [max(live, key=lambda r: r.value)]
            stop = math.inf if deterministic else deadline - 1.5 * self.decode_s
            now = time.perf_counter()
            if not live or now >= stop:
                break
            for k, run in enumerate(live):
                share = stop if deterministic else now + (stop - now) * (k + 1) / len(live)
                between: list[tuple[np.ndarray, np.ndarray]] = []
                run.run(_CHUNK, share, between=partial(_take_snapshot, run, between))
                self._decode(run, deadline, reverse_state=between[0] if between else None)
            self.rounds += 1
            if self.best.feasible and _relative_gap(self.best.cost, self.lower) <= target_gap:
                break
        self.stats["sweeps"] = [r.sweeps for r in self.runs]

    def start_sweeping(self, deadline: float) -> None:
        """Sweep every run that is not converged nor sweeping yet in a thread of its own
        until ``deadline`` (e.g. while the heuristic runs); :meth:`advance` then decodes
        what they reach."""
        until = deadline - _DENSE_FINAL_S if self.dense else deadline
        for run in self.runs:
            if run in self._retired or run.converged:
                continue
            if all(s.run is not run for s in self.sweepers):
                self.sweepers.append(_Sweeper(run, until, self._fresh))

    def _advance_in_parallel(self, deadline: float, target_gap: float) -> None:
        """:meth:`advance` while the runs sweep in threads of their own (compiled, without
        the interpreter lock): this one decodes each run's latest state every
        :data:`_CHUNK` sweeps (new memory prices go to the run's thread, which applies
        them between chunks) and runs the heuristic's descent, so both cores of a small
        machine work.  After two decodes only the run with the higher bound goes on."""
        decoded: dict[_Sweeper, int] = {}
        try:
            while self.sweepers:
                self._fresh.wait(timeout=max(0.0, deadline - time.perf_counter()))
                self._fresh.clear()
                for sweeper in list(self.sweepers):
                    state, done = sweeper.latest()
                    if state is not None and state[0] != decoded.get(sweeper):
                        if time.perf_counter() >= deadline:
                            break
                        decoded[sweeper] = state[0]
                        self._decode(sweeper.run, deadline, state=state[1], reverse_state=state[2])
                        self.rounds += 1
                    if done:
                        self._stop(sweeper)
                if self.best.feasible and _relative_gap(self.best.cost, self.lower) <= target_gap:
                    break
                if self.rounds >= 2 and len(self.sweepers) > 1:
                    lowest = min(self.sweepers, key=lambda s: s.run.value)
                    self._retired.add(lowest.run)
                    self._stop(lowest)
                if time.perf_counter() >= deadline:
                    break
        finally:
            self.stop_sweeping()
        if self.dense:
            self._final_descent(deadline)
        self.stats["sweeps"] = [r.sweeps for r in self.runs]

    def _final_descent(self, deadline: float) -> None:
        """A dense problem: the heuristic's descent from the best plan, for the time its
        sweeps left free (:data:`_DENSE_FINAL_S`)."""
        left = deadline - time.perf_counter()
        if not self.best.feasible or left < 0.1:
            return
        candidate = solve_heuristic(
            self.reduced, start=self.best.choices, time_budget_s=0.8 * left, seed=self.options.seed
        )
        self.stats["final_descent"] = {"from": self.best.cost, "to": candidate.cost}
        if _better(candidate, self.best):
            candidate.price = candidate.price if candidate.price is not None else self.best.price
            self.best = candidate

    def stop_sweeping(self) -> None:
        """Stop every sweeping thread after its current pass (each run keeps every sweep it
        made); re-raise what stopped one."""
        while self.sweepers:
            self._stop(self.sweepers[-1])

    def _stop(self, sweeper: _Sweeper) -> None:
        self.sweepers.remove(sweeper)
        sweeper.stop()

    def _reprice(self, run: DiffusionBound, price: np.ndarray) -> None:
        """Give ``run`` new memory prices: through its thread when it sweeps in one."""
        for sweeper in self.sweepers:
            if sweeper.run is run:
                sweeper.reprice(price)
                return
        run.reprice(price)

    def _decode(
        self,
        run: DiffusionBound,
        deadline: float,
        *,
        state: tuple[np.ndarray, np.ndarray] | None = None,
        reverse_state: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Greedy on the reparametrised costs in the forward pass's order, and in the
        backward pass's (from ``reverse_state``, the snapshot taken between the last
        sweep's passes), each then descended by ICM on
        the run's own costs (:meth:`DiffusionBound.decode`, :meth:`DiffusionBound.descend`,
        compiled; ``state``: a snapshot to decode instead of the run now).  When memory
        binds and no such plan fits, the heuristic's greedy pass, which keeps rows within
        the budget, is tried too.  The best plan then goes through the heuristic's descent
        (tree-block moves, memory repair) when it does not fit, and every
        :data:`_DESCENT_EVERY` rounds; a priced run also moves its prices toward the
        plan's memory (up where it overflows a row, down where it fits).

        The two orders find different plans where the LP is not tight (mt5-base on
        [2, 4] after 40 sweeps: 0.0505 s in node order, 0.0422 s in reverse, bound
        0.0420 s; t5-base the other way round), so both are tried."""
        if not math.isfinite(run.current):
            return
        began = time.perf_counter()
        raws = [run.descend(run.decode(state=state))]
        if reverse_state is not None:
            raws.append(run.descend(run.decode(reverse=True, state=reverse_state)))
        scored = [self._score(raw) for raw in raws]
        if self.memory and all(blocked for blocked, *_ in scored) and state is None:
            scored.append(self._score(greedy_assignment(reparametrized(run))))
        blocked, cost, raw, memory = min(scored, key=lambda t: (t[0], t[1]))
        if run.price.any() and self.reduced.budget_bytes is not None:
            over = np.array(memory) > self.reduced.budget_bytes
            floor = float(run.price.max())
            price = np.where(over, np.maximum(run.price * _PRICE_UP, floor * 1e-3), run.price / _PRICE_DOWN)
            self._reprice(run, np.minimum(price, _PRICE_CEILING))
        # the compiled part: what the deadline keeps free for the next decode
        self.decode_s = time.perf_counter() - began
        if not blocked and self.rounds % _DESCENT_EVERY != _DESCENT_EVERY - 1:
            candidate = HeuristicResult(raw, cost, memory, True)
        else:
            if self.options.deterministic:
                budget = math.inf
            else:
                budget = max(0.05, min(_DECODE_S, 0.5 * (deadline - time.perf_counter())))
            candidate = solve_heuristic(self.reduced, start=raw, time_budget_s=budget, seed=self.options.seed)
        self.stats["decodes"] += 1
        if _better(candidate, self.best):
            if candidate.price is None:
                candidate.price = self.best.price
            self.best = candidate
            self.stats["improved"] += 1

    def _score(self, choices: list[int]) -> tuple[bool, float, list[int], list[float]]:
        """(does not fit, seconds, choices, bytes per memory row) on the reduced problem."""
        cost, memory, fits = _evaluated(self.reduced, choices)
        return not fits, cost, choices, memory


_State = tuple[int, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None]
"""Sweeps done, the run's :meth:`~DiffusionBound.snapshot` after the last of them, and the
snapshot between its two passes (the state to decode in the backward pass's order)."""


class _Sweeper:
    """A thread that sweeps ``run`` :data:`_CHUNK` sweeps at a time until ``deadline``,
    convergence (a priced run: until new prices un-converge it) or :meth:`stop`,
    publishing a :data:`_State` after each chunk (and setting ``fresh``).  Only this
    thread touches the run meanwhile: readers take snapshots, and new prices
    (:meth:`reprice`) wait for the end of a chunk."""

    def __init__(self, run: DiffusionBound, deadline: float, fresh: threading.Event) -> None:
        self.run = run
        self.deadline = deadline
        self._lock = threading.Lock()
        self._fresh = fresh
        self._finished = threading.Event()
        self._stop = threading.Event()
        self._latest: _State | None = None
        self._price: np.ndarray | None = None
        self._priced = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._sweep, name="trws-sweeps", daemon=True)
        self._thread.start()

    def _sweep(self) -> None:
        run = self.run
        try:
            while not self._stop.is_set() and time.perf_counter() < self.deadline:
                self._apply_price()
                if run.converged:
                    if not run.price.any():
                        break  # nothing will move it again
                    # a priced run waits for the prices of the decode of its last state
                    self._priced.wait(timeout=max(0.0, self.deadline - time.perf_counter()))
                    continue
                between: list[tuple[np.ndarray, np.ndarray]] = []
                run.run(_CHUNK, self.deadline, between=partial(_take_snapshot, run, between))
                state = (run.sweeps, run.snapshot(), between[0] if between else None)
                with self._lock:
                    self._latest = state
                self._fresh.set()
        except BaseException as exc:  # re-raised in the solving thread by stop()
            self._failure = exc
        finally:
            self._finished.set()
            self._fresh.set()

    def _apply_price(self) -> None:
        with self._lock:
            price, self._price = self._price, None
            self._priced.clear()
        if price is not None:
            self.run.reprice(price)

    def reprice(self, price: np.ndarray) -> None:
        """New memory prices for the run, applied before its next chunk (or at :meth:`stop`)."""
        with self._lock:
            self._price = price
            self._priced.set()

    def latest(self) -> tuple[_State | None, bool]:
        """The latest state published, and whether the thread has finished."""
        with self._lock:
            return self._latest, self._finished.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._priced.set()
        self._thread.join()
        self._apply_price()
        if self._failure is not None:
            raise self._failure


def _take_snapshot(run: DiffusionBound, out: list[tuple[np.ndarray, np.ndarray]]) -> None:
    out.append(run.snapshot())


def starting_prices(problem: Problem) -> np.ndarray:
    """Seconds per byte of each memory row at which memory weighs about as much as time:
    the median spread of the node costs over the median spread of the row's per-node
    bytes (the heuristic's first price when it has to price memory); decodes then move
    each price up while plans overflow the row and down while they fit."""
    cost_scale = max(cost_spread(problem.node_costs), 1e-30)
    prices = []
    for row in problem.memory_rows:
        bytes_spread = [float(np.ptp(t)) for t in row.terms.values() if t.size > 1]
        prices.append(cost_scale / max(float(np.median(bytes_spread)) if bytes_spread else 1.0, 1.0))
    return np.array(prices)


def _evaluated(problem: Problem, choices: list[int]) -> tuple[float, list[float], bool]:
    """Seconds, bytes per memory row, and whether the plan is finite and fits."""
    cost, memory = evaluate(problem, choices)
    return cost, memory, math.isfinite(cost) and memory_fits(problem.budget_bytes, memory)


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
    gap = _relative_gap(objective, bound)
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


def _relative_gap(objective: float, bound: float) -> float:
    """``(objective - bound) / objective``; 0 when the bound meets the objective."""
    if objective <= bound:
        return 0.0
    return (objective - bound) / abs(objective) if objective != 0 else math.inf


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
