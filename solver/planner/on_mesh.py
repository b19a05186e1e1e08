"""One mesh: cost tables -> floors -> memo recall -> memory rounds -> verified plan.

::

    cost tables ─> memory floors ─> solve memo recall ─> memory rounds ─> chosen plan
    (memo: store)  (floors.py)      (recall.py)          (rounds.py)      verified, memo written

Every returned plan has been re-checked by :func:`autopar.cost.evaluate.evaluate`: its step
time equals the solver's objective and its memory fits the budget
(:mod:`.verify`); a mismatch raises :class:`~autopar.errors.VerificationError`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from autopar.cost.build_tables import build_cost_tables
from autopar.cost.evaluate import attach_evaluation
from autopar.cost.iteration import checkpoint_units
from autopar.cost.tables import CostTables
from autopar.cost.weighted_tables import with_training
from autopar.errors import TimeLimitError
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline, ProgressFn
from autopar.infra.store import KeyValueStore
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.wire import SolverReport
from autopar_solver.options import SolverOptions
from autopar_solver.planner.context import MAX_MEMORY_ROUNDS, PlanContext, evaluate_reserve
from autopar_solver.planner.floors import MemorySeed, memory_seed, raise_infeasible
from autopar_solver.planner.hand_layout import faster_as_run, seed_with_hand_layout
from autopar_solver.planner.incumbent import seed_with_full
from autopar_solver.planner.recall import MemoRecall, Verified
from autopar_solver.planner.recompute import recompute_choices
from autopar_solver.planner.request import TIE_THRESHOLD_OPS
from autopar_solver.planner.rounds import MeshJob, Rounds, run_rounds
from autopar_solver.planner.verify import verify, with_bound
from autopar_solver.problem import Solution

__all__ = ["solve_mesh", "solve_on_mesh"]


def solve_on_mesh(
    graph: Graph,
    mesh: Mesh,
    memory_budget_bytes: int | None,
    zero_stage: int,
    options: SolverOptions,
    *,
    store: KeyValueStore | None = None,
    progress: ProgressFn | None = None,
    hint: Plan | None = None,
    tables: CostTables | None = None,
    tie_layers: bool | None = None,
    deadline: Deadline | None = None,
    shape_label: tuple[int, ...] | None = None,
    resolve: bool = False,
) -> Plan:
    """Best plan of ``graph`` on one mesh within the budget; verified by the evaluator.

    ``deadline`` (default: ``options.time_limit_s`` from now) bounds everything:
    cost tables, every memory round's solve, the evaluator's re-checks.  When it
    runs out the best verified plan so far is returned with its gap; without one,
    :class:`TimeLimitError` says how far the solve got.
    """
    ctx = PlanContext.start(
        options, deadline, progress=progress, store=store, hint=hint, resolve=resolve, shape=shape_label
    )
    return solve_mesh(
        graph, mesh, memory_budget_bytes, zero_stage, options, ctx, tables=tables, tie_layers=tie_layers
    )


def solve_mesh(
    graph: Graph,
    mesh: Mesh,
    budget: int | None,
    zero_stage: int,
    options: SolverOptions,
    ctx: PlanContext,
    *,
    tables: CostTables | None = None,
    tie_layers: bool | None = None,
) -> Plan:
    """:func:`solve_on_mesh` with its clock and channels in ``ctx``: the stages, in order."""
    t0 = time.perf_counter()
    tables = tables if tables is not None else _cost_tables(graph, mesh, zero_stage, options, ctx)
    tables = with_training(tables, options.training)  # the iteration priced (autopar.cost.iteration)
    t_tables = time.perf_counter() - t0
    tied = tie_layers if tie_layers is not None else len(graph.ops) > TIE_THRESHOLD_OPS
    seed: MemorySeed = memory_seed(tables, budget, mesh, ctx.deadline)
    job = MeshJob(graph, mesh, budget, zero_stage, options, tables, tied, seed.binds)
    reserve = evaluate_reserve(len(graph.ops))
    memo = _recall(job, reserve, ctx)
    state, solve_again = _first_round(job, seed, memo, reserve, ctx)
    if solve_again:
        seed_with_full(job, state, ctx)  # checkpointing auto: never worse than full
        seed_with_hand_layout(job, state, ctx)  # never worse than Megatron-LM's layout here
    run_rounds(job, state, ctx, MAX_MEMORY_ROUNDS + 1 if solve_again else 0)
    plan_obj, ev, solution = _chosen(job, state, memo, ctx, t_tables)
    solution = with_bound(solution, state.best_bound)
    verify(ev, solution, budget, job.graph)
    if ctx.store is not None:  # the search's own best, verified, whichever plan is returned
        memo.write(ctx.store, graph, solution, state.kept_positions, without_rows=not state.positions)
    returned = faster_as_run(state, (plan_obj, ev, solution))
    if returned[0] is not plan_obj:  # the hand layout: checked against its own objective
        plan_obj, ev, solution = returned
        verify(ev, solution, budget, job.graph)
    attach_evaluation(plan_obj, ev)
    plan_obj.solver = _solver_report(solution, state, memo, tables, t0, t_tables)
    ctx.relay().report("verified", objective=solution.objective, bound=solution.bound)
    return plan_obj


def _cost_tables(
    graph: Graph, mesh: Mesh, zero_stage: int, options: SolverOptions, ctx: PlanContext
) -> CostTables:
    """The mesh's cost tables, through the cost-table memo of ``ctx.store``."""
    return build_cost_tables(
        graph,
        mesh,
        zero_stage,
        store=ctx.store,
        workers=options.workers,
        runtime=options.runtime,
        progress=ctx.relay().callback(),
        deadline=ctx.deadline,
        remote=ctx.remote_tables,
    )


def _recall(job: MeshJob, reserve: float, ctx: PlanContext) -> MemoRecall:
    """What earlier solves of this very problem proved: re-checked, the answer or the start."""
    memo = MemoRecall.read(ctx.store, job.options, job.tables, job.budget)
    if memo.found and ctx.deadline.left() >= reserve:  # else no time to re-check a recalled plan
        memo.recall(job.graph, job.mesh, job.zero_stage, job.tables, job.budget)
    elif memo.found:
        memo.stats["found"] = "no time to re-check it"
    return memo


def _first_round(
    job: MeshJob, seed: MemorySeed, memo: MemoRecall, reserve: float, ctx: PlanContext
) -> tuple[Rounds, bool]:
    """Where the rounds start (the caller's hint, or the recalled plan with its rows and
    bound), and whether to solve at all (not when the recalled plan's gap is within the
    target, unless ``ctx.resolve``)."""
    hint = _hint_choices(ctx.hint, job.tables) if ctx.hint is not None else None
    state = Rounds(positions=seed.positions, hint=hint, reserve=reserve)
    if memo.entry is None or memo.plan is None:
        return state, True
    state.best_bound = memo.entry.bound  # proven on this problem (a relaxation of it, at least)
    state.hint = memo.plan[2].choices
    n = len(job.graph.ops)
    state.positions += [p for p in memo.entry.positions if p not in state.positions and p < n]
    solve_again = ctx.resolve or memo.plan[2].gap > job.options.relative_gap
    memo.stats.update(recalled_gap=memo.plan[2].gap, solved_again=solve_again)
    return state, solve_again


def _chosen(job: MeshJob, state: Rounds, memo: MemoRecall, ctx: PlanContext, t_tables: float) -> Verified:
    """The better of the rounds' plan and the recalled one; when there is neither, the
    budget is infeasible (:class:`InfeasibleError`) or the time ran out (:class:`TimeLimitError`)."""
    kept = state.kept
    if (
        memo.plan is not None
        and memo.entry is not None
        and (kept is None or memo.plan[2].objective < kept[2].objective)
    ):
        kept = state.kept = memo.plan
        state.kept_positions = list(memo.entry.positions)
        memo.stats["plan"] = "recalled"
    if kept is not None:
        return kept
    last = state.last
    if last is not None and last.status == "infeasible" and not state.stopped_by_deadline:
        raise_infeasible(job.tables, job.budget, state.positions, job.mesh, ctx.deadline)
    raise TimeLimitError(
        "time_limit",
        f"the time limit ({round(ctx.deadline.limit_s, 2):g} s) ran out before a plan on mesh "
        f"{list(job.mesh.shape)} "
        f"fitting the budget was verified: cost tables took {t_tables:.1f} s, "
        f"{len(state.log)} memory round(s) solved ({len(state.positions)} memory rows added); "
        "raise the time limit",
        phase="solve",
        memory_rounds=len(state.log),
        time_cost_tables_s=t_tables,
    )


def _solver_report(
    solution: Solution, state: Rounds, memo: MemoRecall, tables: CostTables, t0: float, t_tables: float
) -> SolverReport:
    """``plan.solver``: the objective, bound, gap and the stats of every stage."""
    stats = dict(solution.stats)
    stats["rounds"] = state.log
    stats["memo"] = memo.stats
    if state.full_first is not None:
        stats["full_first"] = state.full_first
    if state.hand_layout is not None:
        stats["hand_layout"] = state.hand_layout
    stats["time_cost_tables_s"] = t_tables
    stats["cost_tables"] = {k: v for k, v in tables.stats.items() if k != "fallback_ops"}
    report: SolverReport = {
        "objective": solution.objective,
        "bound": solution.bound,
        "gap": solution.gap,
        "status": solution.status,
        "wall_s": time.perf_counter() - t0,
        "memory_rows": len(state.positions),
        "tied_layers": any(r["tied"] for r in state.log),
        "stats": _jsonable(stats),
    }
    return report


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _hint_choices(hint: Plan, tables: CostTables) -> list[int] | None:
    """Choices of ``hint`` in topological op order, or None if it does not fit these tables;
    under checkpointing ``auto``, with the policies the hint's blocks take."""
    if tuple(hint.mesh.shape) != tuple(tables.mesh.shape):
        return None
    rc = recompute_choices(tables)
    recomputed = checkpoint_units(tables.graph, hint.training)
    policy = {b: rc.policy_index(b, recomputed) for b in rc.blocks} if rc is not None else {}
    choices = []
    for i, op in enumerate(tables.graph.topological_order):
        sig = hint.signatures.get(op.name)
        sigs = tables.ops[op.name].signatures
        if sig is None or sig not in sigs:
            choices.append(-1)
        elif rc is None:
            choices.append(sigs.index(sig))
        else:
            choices.append(rc.choice(i, sigs.index(sig), policy.get(rc.block_of.get(i, ""), 0)))
    if all(c < 0 for c in choices):
        return None
    return choices
