"""Checkpointing ``auto`` starts from ``full``: every ``full`` plan is an ``auto`` plan.

A ``full`` plan (every block recomputed) is the ``auto`` plan with every flag set to
recompute, priced the same (:func:`autopar.cost.iteration.checkpoint_blocks`: ``auto`` with
every block of :func:`~autopar.cost.iteration.candidate_blocks` recomputes what ``full`` does),
so ``auto`` can never be worse than the ``full`` plan it could have found.  The doubled
problem is larger and harder, though: within a time limit CP-SAT may stop on a worse plan
(gpt-1.3b, 2x4 ``a100-40g``, ``[4, 2]``, ZeRO-2, K = 8, 13.5 GiB: ``auto`` 2594.7 ms, gap
5.13 %, against ``full``'s 2559.8 ms at 120 s).

So when memory binds a plan that keeps every activation (the largest floor of ``off`` is at
least :data:`~.floors.SEED_ROW_FRACTION` of the budget: recomputing may pay), ``auto`` first
solves ``full`` within :data:`FULL_SHARE` of the time left, through the same memory
rounds, and keeps its plan, relabelled ``auto`` with every block recomputed, as the
incumbent: the verified plan the ``auto`` rounds must beat (they replace it only with a
plan of lower objective), and the rounds' first hint.  Below that the plan that keeps
everything nearly always fits, and it is optimal for ``auto`` when it does (recomputing
never saves time): nothing is done.
"""

from __future__ import annotations

import dataclasses
import math

from autopar.cost.evaluate import evaluate
from autopar.cost.weighted_tables import training_of, with_training
from autopar.errors import InfeasibleError, TimeLimitError
from autopar.infra.progress import Deadline
from autopar.ir.training import TrainingConfig
from autopar_solver.planner.context import MAX_MEMORY_ROUNDS, PlanContext
from autopar_solver.planner.floors import SEED_ROW_FRACTION, memory_floors, memory_seed
from autopar_solver.planner.recall import Verified
from autopar_solver.planner.recompute import recompute_choices
from autopar_solver.planner.rounds import MeshJob, Rounds, run_rounds
from autopar_solver.problem import Solution

__all__ = ["FULL_SHARE", "full_incumbent", "seed_with_full"]

FULL_SHARE = 0.3
"""Share of the time left that ``auto`` spends solving ``full`` first."""


def full_incumbent(job: MeshJob, ctx: PlanContext, reserve: float) -> Verified | None:
    """The ``full`` plan of ``job`` (an ``auto`` job whose memory binds) as a verified
    ``auto`` plan recomputing every block, its choices those of ``auto``'s doubled problem;
    None when ``job`` is not such a job, or ``full`` is infeasible or finds no plan in its
    share of the time."""
    rc = recompute_choices(job.tables)
    if rc is None or job.budget is None:
        return None
    training = training_of(job.tables)
    if not _keeping_binds(job, training, ctx):
        return None
    full = TrainingConfig(training.micro_batches, "full")
    tables = with_training(job.tables, full)
    deadline = Deadline(ctx.deadline.left() * FULL_SHARE)
    try:
        seed = memory_seed(tables, job.budget, job.mesh, deadline)
    except (InfeasibleError, TimeLimitError):
        return None  # full does not fit: auto's own rounds decide
    options = dataclasses.replace(job.options, checkpointing="full")
    full_job = dataclasses.replace(job, tables=tables, options=options, memory_binds=seed.binds)
    state = Rounds(positions=seed.positions, hint=None, reserve=reserve)
    run_rounds(full_job, state, dataclasses.replace(ctx, deadline=deadline, hint=None), MAX_MEMORY_ROUNDS + 1)
    if state.kept is None:
        return None
    plan, _, solution = state.kept
    plan = dataclasses.replace(plan, training=training.with_recomputed(rc.blocks))
    ev = evaluate(job.graph, plan)
    bound = state.best_bound if math.isfinite(state.best_bound) else None
    first = {
        "objective": solution.objective,
        "bound": bound,
        "gap": None if bound is None else (solution.objective - bound) / max(solution.objective, 1e-300),
        "wall_s": deadline.elapsed(),
    }
    stats = {
        "source": "checkpointing full, solved first (every block recomputed)",
        "full": solution.stats,
        "full_first": first,
    }
    choices = rc.all_recomputing(solution.choices)
    incumbent = Solution(choices, solution.objective, -math.inf, 1.0, "feasible", solution.wall_s, stats)
    return plan, ev, incumbent


def _keeping_binds(job: MeshJob, training: TrainingConfig, ctx: PlanContext) -> bool:
    """Does memory bind a plan that keeps every block's activations: is the largest memory
    floor of ``off`` at least :data:`~.floors.SEED_ROW_FRACTION` of the budget?  (Else the
    plan that keeps everything nearly always fits, and ``full`` is not worth its time.)"""
    assert job.budget is not None
    off = with_training(job.tables, TrainingConfig(training.micro_batches, "off"))
    try:
        floors = memory_floors(off, ctx.deadline)
    except TimeLimitError:
        return False
    return bool(len(floors)) and float(floors.max()) >= SEED_ROW_FRACTION * job.budget


def seed_with_full(job: MeshJob, state: Rounds, ctx: PlanContext) -> None:
    """Under ``auto`` with binding memory: :func:`full_incumbent` as ``state``'s verified
    plan so far and, when no hint is given, the rounds' first hint."""
    found = full_incumbent(job, ctx, state.reserve)
    if found is None:
        return
    state.kept = found
    state.kept_positions = []
    state.full_first = found[2].stats["full_first"]
    if state.hint is None:
        state.hint = list(found[2].choices)
