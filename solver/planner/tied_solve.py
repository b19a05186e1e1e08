"""Solving one memory round's problem: with identical layers tied first, then untied.

::

    problem ─ tie (structural classes) ─> tied problem ─ solve ─> tied plan
            ─ untied solve from the tied plan (time allowing) ─> plan, untied bound
            ─ else: the tied plan, with the untied problem's TRW-S bound (time allowing)
                    or its trivial bound

The tied problem is only a restriction of the real one, so its bound is not the real
problem's: the reported bound (and gap) is always the untied problem's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from autopar.infra.progress import ProgressFn
from autopar_solver.options import SolverOptions
from autopar_solver.planner.context import MIN_SOLVE_S
from autopar_solver.planner.memory_rows import BuiltProblem
from autopar_solver.problem import Problem, Solution, trivial_bound
from autopar_solver.problem import evaluate as evaluate_problem

__all__ = [
    "TIED_SHARE",
    "TIE_ROUNDS",
    "UNTIED_BOUND_MARGIN_S",
    "UNTIED_BOUND_S_PER_NODE",
    "UNTIED_S_PER_NODE",
    "solve_built",
    "time_for_untied_solve",
]

TIE_ROUNDS = 1
"""Weisfeiler-Lehman refinements for layer tying (more rounds split layers near the ends apart)."""
TIED_SHARE = 0.5
"""Share of a round's time the tied solve may take (the untied solve gets the rest)."""
UNTIED_S_PER_NODE = 4.5e-4
"""Seconds per node below which the untied solve is not started (its reductions and
heuristic alone took 11.7 s on 50k nodes on the loaded 2-core machine; 14-21 s on the idle
one on 2026-12-02, when a 30 s limit that started it with 16.5 s left ended at 34-35 s)."""
UNTIED_BOUND_S_PER_NODE = 4e-5
"""Seconds per node below which no TRW-S bound of the untied problem is tried when its solve
was skipped.  The layout stops at the deadline (:class:`~autopar_solver.bounds.LayoutCut`:
then the trivial bound; only its copying checks the clock, hence the margin), so a try
costs only time nothing else would use: the 100k-op graph (4x8 a100-80g, load 5,
2026-12-04) lays out in 7.8 s, then 2 s of sweeps bring its bound from the trivial 156 ms
to 647 ms and 6 s to 698 ms (tied plan 709.6 ms).  At 1.2e-4 (12 s on that graph) a round
left under 12 s after the tied solve kept the trivial bound: at a 30 s limit 78.00 % in
14.7 s, now 1.45 % in 19.8 s (load 3); at 60 s and load 10, 78 % in 13.1 s (the reserve
for the re-check grows with the build time)."""
UNTIED_BOUND_MARGIN_S = 0.3
"""Seconds before the solve's end at which the untied problem's sweeps stop."""


def time_for_untied_solve(num_nodes: int, left: float) -> bool:
    """Do ``left`` seconds cover an untied solve of ``num_nodes`` nodes, twice over
    (:data:`UNTIED_S_PER_NODE`)?"""
    return left >= max(MIN_SOLVE_S, 2 * UNTIED_S_PER_NODE * num_nodes)


def solve_built(
    built: BuiltProblem,
    options: SolverOptions,
    progress: ProgressFn | None,
    hint: list[int] | None,
    tie_layers: bool,
    untie_after: bool = True,
    sweep_untied: bool = True,
) -> Solution:
    """Solve the problem; with ``tie_layers``, first with identical layers tied (fast, small)
    and then untied from that plan, so the reported bound and gap are the real problem's.
    ``untie_after`` False stops after the tied solve (the tied plan, with the untied
    problem's trivial bound), e.g. to see first whether the tied plan fits the budget.
    When there is no time for the untied solve, the untied problem's bound is swept with
    TRW-S for the rest of the time (:func:`_untied_bound`) if ``sweep_untied``, else it is
    the trivial bound."""
    # the search (OR-Tools, numba) is imported when a problem is solved, not to recall one
    from autopar_solver.solve import solve
    from autopar_solver.tying import untie

    if not tie_layers:
        return solve(built.problem, options, progress=progress, hint=hint)
    run = _solve_tied(built, options, progress, hint)
    sol = run.solution
    if not sol.ok:
        return Solution(
            untie(run.classes, sol.choices) if sol.choices else [],
            sol.objective,
            sol.bound,
            sol.gap,
            sol.status,
            sol.wall_s,
            {**sol.stats, "tying": {"classes": run.tied.num_nodes}},
        )
    run.expand(built.problem)
    # The tied optimum is only a restriction of the real problem: solve the untied
    # problem with it as the hint, for the rest of the time, so the plan can leave
    # the tie where that pays and the bound (and gap) is the untied problem's.
    run.t1 = time.perf_counter()
    remaining = options.time_limit_s - (run.t1 - run.t0)
    if not untie_after or (
        not options.deterministic and remaining < UNTIED_S_PER_NODE * built.problem.num_nodes
    ):
        return _tied_plan(built.problem, run, options, untie_after, sweep_untied)
    return _untied_from(built.problem, run, options, progress, remaining)


@dataclass
class _TiedRun:
    """The tied solve of one round, and its plan expanded to every node."""

    classes: list[int]
    tied: Problem
    solution: Solution
    t0: float
    t_tie: float
    expanded: list[int] | None = None
    tied_objective: float = 0.0
    """The expanded plan's cost on the untied problem."""
    t1: float = 0.0

    def expand(self, problem: Problem) -> None:
        from autopar_solver.tying import untie

        self.expanded = untie(self.classes, self.solution.choices)
        self.tied_objective, _ = evaluate_problem(problem, self.expanded)


def _solve_tied(
    built: BuiltProblem, options: SolverOptions, progress: ProgressFn | None, hint: list[int] | None
) -> _TiedRun:
    """Tie the identical layers of ``built`` and solve that problem, for its share of the time."""
    from autopar_solver.solve import solve
    from autopar_solver.tying import structural_classes, tie

    t0 = time.perf_counter()
    graph = built.tables.graph
    index = {name: i for i, name in enumerate(built.op_names)}
    labelled = [
        (index[e.producer], index[e.consumer], f"{e.out_port}>{e.in_port}") for e in built.tables.edges
    ]
    classes = structural_classes(
        [built.tables.op_keys.get(n, graph.op_by_name[n].type) for n in built.op_names],
        labelled,
        built.problem.num_choices,
        rounds=TIE_ROUNDS,
    )
    tied = tie(built.problem, classes)
    tied_hint = _tied_hint(hint, classes, tied.num_nodes)
    t_tie = time.perf_counter() - t0
    tied_options = (
        options
        if options.deterministic
        else replace(options, time_limit_s=max(MIN_SOLVE_S, TIED_SHARE * options.time_limit_s - t_tie))
    )
    sol = solve(tied, tied_options, progress=progress, hint=tied_hint)
    return _TiedRun(classes, tied, sol, t0, t_tie)


def _tied_phases(run: _TiedRun, **after: float) -> dict[str, float]:
    """Seconds per phase of a tied solve: tying, the tied problem's own phases (``tied_*``),
    then ``after`` (the untied bound's sweeps, or the untied solve's phases), so that the
    phases add up to the whole solve."""
    tied = {f"tied_{k}": v for k, v in run.solution.stats.get("phases_s", {}).items()}
    return {"tie": run.t_tie, **tied, **after}


def _tied_hint(hint: list[int] | None, classes: list[int], num_classes: int) -> list[int] | None:
    """``hint`` on the tied problem: each class takes its first hinted node's choice; None
    when a class has no hinted node."""
    if hint is None:
        return None
    tied_hint = [-1] * num_classes
    for node, c in enumerate(classes):
        if tied_hint[c] < 0 and hint[node] >= 0:
            tied_hint[c] = hint[node]
    if any(h < 0 for h in tied_hint):
        return None
    return tied_hint


def _tied_plan(
    problem: Problem, run: _TiedRun, options: SolverOptions, untie_after: bool, sweep_untied: bool
) -> Solution:
    """No time to solve the untied problem (its reductions and heuristic alone take longer),
    or not yet: the tied plan, with the untied problem's trivial bound (every node and edge
    at its least), which is valid where the tied bound is not, or its TRW-S bound."""
    assert run.expanded is not None
    tied_objective = run.tied_objective
    bound = min(trivial_bound(problem), tied_objective)
    untied_bound: dict[str, Any] | None = None
    t_bound = time.perf_counter()
    if untie_after and sweep_untied and not options.deterministic:
        untied_bound = _untied_bound(problem, run.t0 + options.time_limit_s - UNTIED_BOUND_MARGIN_S)
        if untied_bound is not None:
            bound = min(max(bound, untied_bound["bound"]), tied_objective)
    gap = 0.0 if tied_objective <= 0 else max(0.0, (tied_objective - bound) / tied_objective)
    stats = {
        **run.solution.stats,
        "phases_s": _tied_phases(run, untied_bound=time.perf_counter() - t_bound),
        "tying": {
            "nodes": problem.num_nodes,
            "classes": run.tied.num_nodes,
            "tied_objective": tied_objective,
            "tied_gap": run.solution.gap,
            "untied": "skipped: "
            + ("no time left" if untie_after else "the tied plan's memory is checked first")
            + (" (trivial bound)" if untied_bound is None else " (TRW-S bound of the untied problem)"),
            "untied_bound": untied_bound,
        },
    }
    return Solution(run.expanded, tied_objective, bound, gap, "feasible", time.perf_counter() - run.t0, stats)


def _untied_from(
    problem: Problem, run: _TiedRun, options: SolverOptions, progress: ProgressFn | None, remaining: float
) -> Solution:
    """Solve the untied problem from the tied plan for the ``remaining`` seconds; keep the
    tied plan (polished) when the untied solve finds nothing better, with the untied bound."""
    from autopar_solver.heuristic import improve
    from autopar_solver.solve import solve

    assert run.expanded is not None
    sol, t0, t1 = run.solution, run.t0, run.t1
    untied_options = replace(options, time_limit_s=max(MIN_SOLVE_S, remaining))
    untied = solve(problem, untied_options, progress=progress, hint=run.expanded)
    stats = dict(untied.stats)
    stats["phases_s"] = _tied_phases(
        run, **{f"untied_{k}": v for k, v in untied.stats.get("phases_s", {}).items()}
    )
    stats["tying"] = {
        "nodes": problem.num_nodes,
        "classes": run.tied.num_nodes,
        "edges_tied": len(run.tied.edges),
        "tied_objective": run.tied_objective,
        "tied_bound": sol.bound,
        "tied_gap": sol.gap,
        "tied_status": sol.status,
        "untied_objective": untied.objective,
        "untied_improvement": run.tied_objective - untied.objective,
        "time_tie_s": run.t_tie,
        "time_tied_solve_s": t1 - t0 - run.t_tie,
        "time_untied_solve_s": time.perf_counter() - t1,
    }
    if not untied.ok or untied.objective > run.tied_objective:
        # keep the tied plan (polished) but report the untied problem's bound
        polished = improve(
            problem, run.expanded, time_budget_s=min(1.0, max(0.0, options.time_limit_s - (t1 - t0)) / 4)
        )
        objective, _ = evaluate_problem(problem, polished)
        bound = untied.bound if untied.ok else sol.bound
        gap = 0.0 if objective <= 0 else max(0.0, (objective - bound) / objective)
        return Solution(polished, objective, bound, gap, "feasible", time.perf_counter() - t0, stats)
    return Solution(
        untied.choices,
        untied.objective,
        untied.bound,
        untied.gap,
        untied.status,
        time.perf_counter() - t0,
        stats,
    )


def _untied_bound(problem: Problem, deadline: float) -> dict[str, Any] | None:
    """A TRW-S bound of ``problem`` (not reduced; memory rows left out, so a bound of the
    problem with them too) swept until ``deadline``; None when there is not time for it
    (:data:`UNTIED_BOUND_S_PER_NODE`, or its layout is not done by ``deadline``).  The tied
    plan is a plan of ``problem``, so this is what proves how far it can be from the untied
    optimum."""
    from autopar_solver.bounds import DiffusionBound, LayoutCut

    start = time.perf_counter()
    if deadline - start < UNTIED_BOUND_S_PER_NODE * problem.num_nodes:
        return None
    try:
        run = DiffusionBound(problem, deadline=deadline)
    except LayoutCut:
        return None
    laid_out = time.perf_counter()
    value = run.run(1_000_000, deadline)
    return {
        "bound": value,
        "sweeps": run.sweeps,
        "layout_s": laid_out - start,
        "sweeps_s": time.perf_counter() - laid_out,
    }
