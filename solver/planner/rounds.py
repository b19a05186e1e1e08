"""Stage 5: memory rounds: solve, evaluate, constrain the peak, solve again.

Memory is a hard constraint, added lazily: the problem is first solved with no memory
rows (a relaxation), or with the row of the largest memory floor when that comes near
the budget; if the plan fits, it is optimal for the constrained problem too.  Otherwise
the row of the evaluator's peak position is added and the problem solved again, from the
plan before, until a plan fits, :data:`MAX_MEMORY_ROUNDS` run out, or the time does.

A round not known to be the last keeps time for the rounds after it once memory binds:
when the floors come near the budget (:class:`~.floors.MemorySeed`), or once a round's
plan has overflowed it (the floors can be far below the budget while the fastest plan is
over it: gpt-1.3b, ``full``, 13.5 GiB).  Such a round solves for :data:`ROUND_SHARE` of
the time left; when its plan fits, the rest of the time polishes it (same rows, from that
plan); when it breaks a row, the next round starts from it.  The last round (a polish, or
the last memory round) runs to the gap or the limit.

Each round only adds memory rows to the one before, so an earlier round's problem is a
relaxation of a later one's and its bound holds for the later ones: the rounds carry
their greatest bound.  With tied layers (:mod:`.tied_solve`), once a plan has overflowed
the budget, rounds solve the tied problem only (seconds) until its plan fits; only then
is the untied problem solved, from that plan, as a polish.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from autopar.cost.evaluate import evaluate
from autopar.cost.tables import CostTables
from autopar.errors import VerificationError
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar_solver.options import SolverOptions
from autopar_solver.planner.context import EVALUATE_PER_BUILD, MAX_MEMORY_ROUNDS, MIN_SOLVE_S, PlanContext
from autopar_solver.planner.lighten import lighten
from autopar_solver.planner.memory_rows import (
    BuiltProblem,
    assignment,
    build_problem,
    chosen_training,
    fit_choices,
)
from autopar_solver.planner.recall import Verified
from autopar_solver.planner.recompute import recompute_choices
from autopar_solver.planner.tied_solve import solve_built, time_for_untied_solve
from autopar_solver.problem import Solution
from autopar_solver.problem import evaluate as evaluate_problem

__all__ = ["ROUND_SHARE", "MeshJob", "Rounds", "plan_of_choices", "run_rounds", "shares_time"]

ROUND_SHARE = 0.5
"""Once memory binds (:func:`shares_time`), each memory round but the last may use this
share of the time left (a plan that overflows leads to another round, which needs time
too).  gpt-1.3b, 2x4 ``a100-40g``, ``[4, 2]``, ZeRO-2, K = 8, ``full``, 13.5 GiB, 120 s:
with the share only when the floors said memory binds, the second round (floors at under
half the budget) took the whole limit on a plan that broke a row and no plan was verified;
with it after the first overflow too, rounds of 58 s and 29 s and a 29 s polish verified
2544.8 ms, gap 1.07 % (a share of 0.25 once gave 2567.9 ms, 1.99 %: its polish found a
better plan that broke a row)."""


@dataclass(frozen=True)
class MeshJob:
    """One mesh's problem: what the rounds solve and the plan is built for."""

    graph: Graph
    mesh: Mesh
    budget: int | None
    zero_stage: int
    options: SolverOptions
    tables: CostTables
    tie_layers: bool
    memory_binds: bool
    """Memory floors come near the budget: rounds share the time."""


@dataclass
class Rounds:
    """Where the memory rounds stand, and what they leave behind."""

    positions: list[int]
    """Constrained positions (rows), in the order they were added."""
    hint: list[int] | None
    reserve: float
    """Seconds kept free before the deadline for the evaluator's re-check."""
    best_bound: float = -math.inf
    """Greatest lower bound of any round (or the memo's, proven on a relaxation)."""
    kept: Verified | None = None
    """The best plan that fits so far, evaluated, with its solution."""
    kept_positions: list[int] = field(default_factory=list)
    last: Solution | None = None
    """The last round's solution."""
    stopped_by_deadline: bool = False
    overflowed: bool = False
    """A round's plan has overflowed the budget: memory binds whatever the floors said, so
    from then on the rounds share the time (:func:`shares_time`)."""
    polishing: bool = False
    tied_first: bool = False
    """With tied layers, once a plan has overflowed the budget, rounds solve the tied problem
    only (seconds) until its plan fits; only then is the untied problem solved, from that
    plan, as a polish: an untied solve of a plan that overflows is time spent on a plan the
    next round discards.  The first round solves both (its untied bound holds for every
    later round)."""
    log: list[dict[str, Any]] = field(default_factory=list)
    """One entry per round (``solver["stats"]["rounds"]``)."""
    hand_layout: dict[str, Any] | None = None
    """Megatron-LM's layout on the mesh, tried first (:mod:`.hand_layout`): its objective,
    memory and outcome (``solver["stats"]["hand_layout"]``)."""
    hand_verified: Verified | None = None
    """That layout, evaluated, when it fits the budget (:func:`.hand_layout.faster_as_run`)."""
    full_first: dict[str, Any] | None = None
    """Under checkpointing ``auto``: the ``full`` plan solved first, the incumbent the rounds
    must beat (its objective, gap and wall time; ``solver["stats"]["full_first"]``)."""


def shares_time(job: MeshJob, state: Rounds) -> bool:
    """Does memory bind (the floors come near the budget, or a round's plan has overflowed
    it)?  Then a round not known to be the last keeps time for the rounds after it."""
    return job.memory_binds or state.overflowed


def _is_last(state: Rounds, round_no: int) -> bool:
    """Is round ``round_no`` known to be the last (a polish, or the last memory round)?"""
    return state.polishing or round_no >= MAX_MEMORY_ROUNDS - 1


def _keeps_time(job: MeshJob, state: Rounds, round_no: int) -> bool:
    """Does round ``round_no`` solve for :data:`ROUND_SHARE` of the time left, keeping the
    rest for the rounds after it?  Yes when memory binds (a round whose plan overflows leads
    to another round) and the round is not known to be the last (:func:`_is_last`)."""
    return shares_time(job, state) and not _is_last(state, round_no)


def run_rounds(job: MeshJob, state: Rounds, ctx: PlanContext, rounds: int) -> Rounds:
    """Run up to ``rounds`` memory rounds from ``state``; return it, advanced."""
    relay = ctx.relay()
    for round_no in range(rounds):
        ready = _round_problem(job, state, ctx)
        if ready is None:
            state.stopped_by_deadline = True
            break
        built, left = ready
        if built.recompute is not None and state.hint is not None:
            _keep_if_it_fits(job, built, state)
        relay.report("solve", detail={"memory_round": round_no, "polish": state.polishing})
        solution = _solve_round(job, built, left, state, ctx, round_no)
        if not _next_round(job, built, solution, state, ctx, round_no):
            break
    return state


def _keep_if_it_fits(job: MeshJob, built: BuiltProblem, state: Rounds) -> None:
    """Checkpointing ``auto``: the round's hint (the last plan's layout with every block
    recomputing, :func:`_constrain_peak`, or the ``full`` plan solved first), lightened block
    by block (:func:`.lighten.lighten`), else (no plan fits yet) as it is, becomes the
    verified plan so far and the round's hint when it beats the plan kept and the evaluator
    finds it within the budget, its objective the problem's own, with the rounds' bound; a
    round that finds a better plan that fits replaces it."""
    assert state.hint is not None
    whole = list(state.hint)
    if min(whole) < 0:
        return
    lighter = lighten(built, whole)
    sources = {"the last plan's layout, each block's cheapest recompute policy that fits": lighter}
    if state.kept is None:
        sources["the last plan's layout with every block recomputed"] = whole
    kept = math.inf if state.kept is None else state.kept[2].objective
    for source, choices in sources.items():
        objective, _ = evaluate_problem(built.problem, choices)
        if not objective < kept:
            continue
        candidate, ev = plan_of_choices(job, built, choices)
        if job.budget is not None and ev.memory.total > job.budget:
            continue
        bound = min(state.best_bound, objective)
        gap = 0.0 if objective <= 0 else max(0.0, (objective - bound) / objective)
        solution = Solution(choices, objective, bound, gap, "feasible", 0.0, {"source": source})
        state.kept = (candidate, ev, solution)
        state.kept_positions = list(state.positions)
        state.hint = choices  # the round starts from it
        return


def plan_of_choices(job: MeshJob, built: BuiltProblem, choices: list[int]) -> tuple[Plan, Any]:
    """The plan of ``choices`` (of ``built``, or with recompute choices ``built`` lacks:
    checkpointing ``auto``) with its evaluation."""
    rc = recompute_choices(job.tables)
    training = chosen_training(built, choices)
    if rc is not None and built.recompute is None:
        training = training.with_recomputed(rc.recomputed(choices))
    candidate = Plan.from_assignment(
        job.graph,
        job.mesh,
        job.zero_stage,
        assignment(built, choices),
        memory_budget_bytes=job.budget,
        runtime=job.tables.runtime.name,
        training=training,
    )
    return candidate, evaluate(job.graph, candidate)


def _round_problem(job: MeshJob, state: Rounds, ctx: PlanContext) -> tuple[BuiltProblem, float] | None:
    """The round's problem, with rows at ``state.positions``, and the seconds left for it;
    None when the time left (less the evaluator's reserve, which grows with the time
    building the problem took) is under :data:`MIN_SOLVE_S`."""
    if ctx.deadline.left() - state.reserve < MIN_SOLVE_S:
        return None
    started = time.perf_counter()
    built = build_problem(job.tables, job.budget, state.positions)
    if state.hint is not None:  # a hint with recompute choices for a problem without them
        state.hint = fit_choices(built, state.hint)
    # the evaluator's re-check walks the whole graph in Python as building the problem
    # does, a few times over (measured on mt5-base: 3-6x): keep that much free
    state.reserve = max(state.reserve, EVALUATE_PER_BUILD * (time.perf_counter() - started))
    left = ctx.deadline.left() - state.reserve
    if left < MIN_SOLVE_S:
        return None
    return built, left


def _solve_round(
    job: MeshJob, built: BuiltProblem, left: float, state: Rounds, ctx: PlanContext, round_no: int
) -> Solution:
    """Solve the round's problem for its share of the ``left`` seconds; log the round."""
    share = ROUND_SHARE if _keeps_time(job, state, round_no) else 1.0
    options = job.options
    # deterministic runs keep their limit (in CP-SAT's deterministic units): the wall clock
    # must not change their answer
    round_options = (
        options
        if options.deterministic
        else replace(options, time_limit_s=min(options.time_limit_s, max(share * left, MIN_SOLVE_S)))
    )
    tied = job.tie_layers and not state.polishing
    solution = solve_built(
        built,
        round_options,
        ctx.relay().callback(),
        state.hint,
        tied,
        untie_after=not state.tied_first,
        # sweeping the untied bound takes the rest of the round: only when no later
        # memory round needs that time
        sweep_untied=not shares_time(job, state),
    )
    state.log.append(
        {
            "memory_rows": len(state.positions),
            "left_s": left,
            "limit_s": round_options.time_limit_s,
            "status": solution.status,
            "wall_s": solution.wall_s,
            "polish": state.polishing,
            "tied": bool(job.tie_layers) and not state.polishing,
        }
    )
    state.last = solution
    return solution


def _next_round(
    job: MeshJob, built: BuiltProblem, solution: Solution, state: Rounds, ctx: PlanContext, round_no: int
) -> bool:
    """Evaluate the round's plan and decide: keep it, polish it, or constrain its peak and
    solve again (True: another round)."""
    kept = state.kept[2] if state.kept is not None else None
    if state.polishing:
        # the verified plan of the round before stays unless this one is better
        if solution.ok:
            state.best_bound = max(state.best_bound, solution.bound)
        if not solution.ok or kept is None or solution.objective >= kept.objective:
            return False
    if solution.status == "infeasible":
        return False
    if not solution.ok:
        state.stopped_by_deadline = True
        return False
    state.best_bound = max(state.best_bound, solution.bound)
    candidate = Plan.from_assignment(
        job.graph,
        job.mesh,
        job.zero_stage,
        assignment(built, solution.choices),
        memory_budget_bytes=job.budget,
        runtime=job.tables.runtime.name,
        training=chosen_training(built, solution.choices),  # the iteration it was solved for
    )
    ctx.relay().report("evaluate", objective=solution.objective, bound=solution.bound)
    ev = evaluate(job.graph, candidate)
    fits = job.budget is None or ev.memory.total <= job.budget
    state.log[-1].update(objective=solution.objective, fits=fits)
    if fits:
        if state.kept is None or solution.objective <= state.kept[2].objective:
            state.kept = (candidate, ev, solution)
            state.kept_positions = list(state.positions)
        return _after_fit(job, built, solution, state, ctx, round_no)
    if _is_last(state, round_no):
        return False  # over the budget elsewhere: keep the verified plan of the round before
    _constrain_peak(job, built, ev, solution, state, ctx)
    return True


def _after_fit(
    job: MeshJob, built: BuiltProblem, solution: Solution, state: Rounds, ctx: PlanContext, round_no: int
) -> bool:
    """The round's plan fits: polish it when the tied plan came first, or when the round's
    time was cut for rounds that did not come and the gap is worth the time left."""
    if state.tied_first:
        # the tied plan fits: now the untied problem, from it, with the same rows and the
        # time left (kept only if it fits and is better, as a polish)
        state.tied_first = False
        state.polishing = True
        state.hint = solution.choices
        return True
    if not _keeps_time(job, state, round_no) or not _worth_polishing(job, built, solution, state, ctx):
        return False
    # the round's time was cut for rounds that did not come: spend what is left on the
    # same rows, from this plan
    state.polishing = True
    state.hint = solution.choices
    return True


def _constrain_peak(
    job: MeshJob, built: BuiltProblem, ev: Any, solution: Solution, state: Rounds, ctx: PlanContext
) -> None:
    """The plan overflows: add the row of its peak position, start the next round from it."""
    state.tied_first = bool(job.tie_layers)
    state.overflowed = True
    peak = ev.activation_peak_position
    if peak in state.positions:
        raise VerificationError(
            "memory_mismatch",
            f"plan uses {ev.memory.total:.0f} bytes at position {peak} although that row was constrained",
        )
    state.positions.append(peak)
    state.hint = solution.choices
    rc = recompute_choices(job.tables)
    if rc is not None:
        # checkpointing auto: start the constrained round from the plan's layout with every
        # block recomputing (the least activation memory of that layout), and constrain
        # that plan's peak too when it overflows (recomputing moves the peak)
        state.hint = rc.all_recomputing(solution.choices)
        _, again = plan_of_choices(job, built, state.hint)
        if again.memory.total > (job.budget or 0) and again.activation_peak_position not in state.positions:
            state.positions.append(again.activation_peak_position)
    ctx.relay().report("memory", detail={"memory_rows": len(state.positions), "peak_bytes": ev.memory.total})


def _worth_polishing(
    job: MeshJob, built: BuiltProblem, solution: Solution, state: Rounds, ctx: PlanContext
) -> bool:
    """Solve a fitting round again, from its plan, with the time left?  Only when its gap
    (against the best bound of any round) misses the target and the time left covers an
    untied solve of this size (:func:`~.tied_solve.time_for_untied_solve`)."""
    options = job.options
    if options.deterministic or solution.objective <= 0:
        return False
    gap = (solution.objective - max(state.best_bound, solution.bound)) / solution.objective
    left = ctx.deadline.left() - state.reserve
    return gap > options.relative_gap and time_for_untied_solve(built.problem.num_nodes, left)
