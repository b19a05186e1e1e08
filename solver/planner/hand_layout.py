"""Megatron-LM's layout on the mesh being solved, as the memory rounds' first plan.

A searched plan must never lose to the layout its users would write by hand on the same
mesh.  Before the rounds solve a mesh, its Megatron-LM layout (:func:`hand_layout_choices`:
the ``megatron`` baseline's column-, row- and vocab-parallel linears with the mesh's last
axis tensor-parallel, sequence parallelism when that axis has more than one device, data
split on the others; :func:`autopar.baselines.plans.baseline_plan`) is built with the rules
the solver's tables were priced with, and:

* when the evaluator finds it within the budget and it beats the plan kept so far, it is
  the verified plan so far, with the problem's own objective: a round replaces it only with
  a plan of lower objective (:func:`seed_with_hand_layout`), so a mesh whose memory rounds
  run out of time still has a verified plan (gpt 48 x 6144 on 1x8, ``a100-80g``, K = 4,
  ``--zero auto`` at 300 s, 2026-12-07: ``[4, 2]``, Megatron-LM's own tp=2 mesh, had no
  plan after two memory rounds in its 23 s share);
* the mesh's plan is the faster, as the runtime runs it, of the rounds' plan and the hand
  layout (:func:`faster_as_run`).

The rounds do not start from it (it is no hint): what they find is what they found before.

Only where the plan is priced as Megatron-LM runs it (:data:`HAND_LAYOUT_RUNTIMES`): that is
where this layout runs, and where the scoreboard races it (benchmarks/README.md).  Under the
OneFlow profiles the seed job's searched plan already beats Megatron-LM's best as Megatron-LM
runs it at K = 1 and 8 (README, the seed's table), the layout's walk and evaluation would come
out of 10-30 s limits there, and the figures measured with them were not re-measured with it:
trying it there too is open.

An op whose hand signature the tables lack (the layout is built with OneFlow's rules: a
signature only Megatron-LM's rules offer is not in them) takes its cheapest
signature; an infinite objective (an illegal pair) or a layout the graph cannot take
(heads the tensor-parallel degree does not divide) leaves the rounds as they were.  What was
tried is in ``solver["stats"]["hand_layout"]``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from autopar.baselines.plans import baseline_plan
from autopar.errors import AutoparError
from autopar.rules.registry import default_rules
from autopar_solver.planner.context import PlanContext
from autopar_solver.planner.memory_rows import build_problem
from autopar_solver.planner.recall import Verified
from autopar_solver.planner.rounds import MeshJob, Rounds, plan_of_choices
from autopar_solver.problem import Solution
from autopar_solver.problem import evaluate as evaluate_problem

__all__ = [
    "HAND_LAYOUT_RESERVES",
    "HAND_LAYOUT_RUNTIMES",
    "HAND_LAYOUT_SOURCE",
    "faster_as_run",
    "hand_layout_choices",
    "seed_with_hand_layout",
]

HAND_LAYOUT_SOURCE = "Megatron-LM's layout on this mesh"
"""``solution.stats["source"]`` of a kept hand layout."""
HAND_LAYOUT_RUNTIMES = frozenset({"megatron-lm"})
"""Runtime profiles whose solves try the hand layout (module docstring)."""
HAND_LAYOUT_RESERVES = 2.0
"""Time the hand layout needs, in evaluator re-checks (:func:`.context.evaluate_reserve`): a
walk over the graph and a problem build, each about one re-check, and one evaluation (the
re-check kept free anyway).  gpt 48 x 6144 (8.3k ops): 2.7-2.9 s, 2.3 re-checks of 1.25 s.
With less left the rounds start as they would without it."""


def hand_layout_choices(job: MeshJob) -> tuple[list[int], int] | None:
    """The choices (topological op order, every block keeping its activations) of
    Megatron-LM's layout on ``job``'s mesh and how many ops start from their cheapest
    signature instead (module docstring); None when the graph cannot take the layout."""
    mesh = job.mesh
    tp = mesh.shape[-1] if mesh.ndim > 1 else 1
    try:
        plan = baseline_plan(
            "megatron",
            job.graph,
            mesh,
            job.zero_stage,
            rules=default_rules(),
            runtime=job.tables.runtime.name,
            sequence_parallel=tp > 1,
        )
    except AutoparError:
        return None
    choices: list[int] = []
    missing = 0
    for op in job.graph.topological_order:
        table = job.tables.ops[op.name]
        sig = plan.signatures.get(op.name)
        if sig is not None and sig in table.signatures:
            choices.append(table.signatures.index(sig))
        else:
            missing += 1
            choices.append(int(np.argmin(table.compute_s)))
    return choices, missing


def seed_with_hand_layout(job: MeshJob, state: Rounds, ctx: PlanContext) -> None:
    """Start ``state``'s rounds from Megatron-LM's layout (module docstring)."""
    if job.tables.runtime.name not in HAND_LAYOUT_RUNTIMES:
        return
    t0 = time.perf_counter()
    record: dict[str, Any] = {"mesh": list(job.mesh.shape)}
    state.hand_layout = record
    need = HAND_LAYOUT_RESERVES * state.reserve
    if ctx.deadline.left() - state.reserve < need:  # the final re-check is kept free too
        record["outcome"] = f"no time: under {need:.1f} s left for it"
        return
    found = hand_layout_choices(job)
    if found is None:
        record["outcome"] = "the graph cannot take it"
        return
    choices, missing = found
    record["ops_from_cheapest"] = missing
    # without rows no choice is doubled (every block keeps its activations): the choices are
    # the signatures' indices as they are
    built = build_problem(job.tables, job.budget, [])
    objective, _ = evaluate_problem(built.problem, choices)
    record["objective_s"] = objective
    if not math.isfinite(objective):
        record["outcome"] = "an illegal pair in the tables"
        record["wall_s"] = time.perf_counter() - t0
        return
    plan, ev = plan_of_choices(job, built, choices)
    fits = ev.valid and (job.budget is None or ev.memory.total <= job.budget)
    record.update(
        fits=fits, memory_bytes=ev.memory.total, achieved_iteration_time_s=ev.achieved_iteration_time_s
    )
    kept = math.inf if state.kept is None else state.kept[2].objective
    # no round has proven a bound yet: 0 (every time is at least that), a gap of 100 %
    solution = Solution(choices, objective, 0.0, 1.0, "feasible", 0.0, {"source": HAND_LAYOUT_SOURCE})
    if fits:
        state.hand_verified = (plan, ev, solution)
    if fits and objective < kept:
        state.kept = (plan, ev, solution)
        state.kept_positions = list(state.positions)
        record["outcome"] = "kept: the plan the rounds must beat"
    else:
        record["outcome"] = "over the budget" if not fits else "a better plan was kept"
    record["wall_s"] = time.perf_counter() - t0


def faster_as_run(state: Rounds, chosen: Verified) -> Verified:
    """``chosen`` (the rounds' plan), or the hand layout when that fits and is faster as the
    runtime runs it (:attr:`~autopar.cost.evaluation.Evaluation.achieved_iteration_time_s`:
    the figure plans and baselines are compared by).  The solver's objective prices every
    edge on its own and hides nothing, where the runtime shares a tensor's boxing between
    its readers and hides the gradient reduction and the parameter gathers behind compute:
    Megatron-LM's FSDP layout of gpt 48 x 6144 on ``[4, 2]`` (K = 4, ZeRO-3) is 4,211 ms to
    the solver and 2,686 ms as run, against the rounds' 3,444 and 3,039.  The returned
    solution keeps the rounds' bound; its objective is the hand layout's own."""
    hand, record = state.hand_verified, state.hand_layout
    if hand is None or record is None:
        return chosen
    if hand[0] is chosen[0]:  # no round found a plan of lower objective
        record.update(returned=True, searched_achieved_iteration_time_s=None)
        return chosen
    if not hand[1].achieved_iteration_time_s < chosen[1].achieved_iteration_time_s:
        record["returned"] = False
        return chosen
    plan, ev, solution = hand
    bound = min(max(state.best_bound, chosen[2].bound, 0.0), solution.objective)
    gap = 1.0 if solution.objective <= 0 else (solution.objective - bound) / solution.objective
    searched = chosen[1].achieved_iteration_time_s
    searched_report = {k: chosen[2].stats[k] for k in ("source",) if k in chosen[2].stats}
    stats = {
        **solution.stats,
        "searched": {
            "objective": chosen[2].objective,
            "achieved_iteration_time_s": searched,
            "status": chosen[2].status,
            **searched_report,
        },
    }
    record["returned"] = True
    record["searched_achieved_iteration_time_s"] = searched
    return (
        plan,
        ev,
        Solution(solution.choices, solution.objective, bound, gap, "feasible", chosen[2].wall_s, stats),
    )
