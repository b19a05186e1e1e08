"""Pipeline stages in the search: the number of stages, the cut of the blocks, the schedule,
and a plan per stage.

For a number of stages ``S`` (:func:`stage_candidates`: every ``S`` that gives each stage
whole nodes or an even slice of one node, at most one stage per block),
:func:`solve_pipeline`:

1. plans the balanced cut (:func:`autopar.pipeline.split.balanced_counts`): every stage by
   the intra-stage planner with memory rounds (:class:`.pipeline_stages.StagesSolve`), and
   prices it under 1F1B and every interleaving the runtime runs
   (:func:`.pipeline_cuts.virtual_stage_choices`: the same stages, each with the schedule's
   micro-batches in flight, :func:`autopar.pipeline.evaluate.rescheduled`);
2. measures on it what each block costs each stage (:mod:`.pipeline_block_costs`) and
   predicts, for every schedule, the cut of least iteration within the budget
   (:func:`.pipeline_cuts.best_cut`, a dynamic program over contiguous block ranges);
3. plans the predicted cuts that beat the best verified plan by :data:`REBALANCE_GAIN`, the
   most promising first, at most :data:`MAX_SEARCHED_CUTS`, while the time left covers
   another solve as long as the first, and prices their schedules;
4. keeps the fastest verified cut and schedule, re-checked by
   :func:`autopar.pipeline.evaluate.evaluate_pipeline`.

Every cut and schedule priced or predicted is a row of ``diagnostics["pipeline_search"]``
(:func:`cut_search_text` prints them); ``solver["cuts"]`` keeps each planned cut's best.

The bound includes the bubble (:mod:`.pipeline_bounds`): from each stage's proven bound on its
``K x t_s + u_s`` and a proven bound on its micro-batch time ``t_s``, a lower bound on the
iteration of every plan with the chosen cut, under 1F1B or any interleaving it allows, so the
gap is a real gap for that cut (not over other cuts).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from autopar.errors import AutoparError, ConfigError, VerificationError
from autopar.infra.progress import Deadline, ProgressFn
from autopar.infra.store import KeyValueStore
from autopar.ir.plan import format_bytes
from autopar.pipeline.evaluate import (
    PipelineEvaluation,
    boundary_floors,
    evaluate_pipeline,
    priced,
    rescheduled,
    stage_cluster,
    stage_link,
)
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.split import balanced_counts, ordered_blocks
from autopar_solver.planner.pipeline_block_costs import stage_costs
from autopar_solver.planner.pipeline_bounds import schedule_bound
from autopar_solver.planner.pipeline_cuts import (
    CutPrediction,
    StageCosts,
    best_cut,
    cut_refusal,
    virtual_stage_choices,
)
from autopar_solver.planner.pipeline_stages import MEMORY_ROUNDS, StagesSolve, default_stage_shape
from autopar_solver.planner.request import PlanRequest

__all__ = [
    "MAX_SEARCHED_CUTS",
    "MEMORY_ROUNDS",
    "REBALANCE_GAIN",
    "cut_search_text",
    "default_stage_shape",
    "solve_pipeline",
    "stage_candidates",
]

REBALANCE_GAIN = 0.01
"""Least predicted gain (share of the best verified iteration) for which a searched cut is planned."""
MAX_SEARCHED_CUTS = 2
"""Most predicted cuts planned besides the balanced one (one per schedule at most)."""


def stage_candidates(request: PlanRequest) -> list[int]:
    """Numbers of stages worth planning: ``S >= 2`` dividing the devices into whole nodes or
    even slices of one node, with at least one block per stage."""
    blocks = len(ordered_blocks(request.graph))
    out = []
    for s in range(2, min(blocks, request.cluster.world_size) + 1):
        try:
            stage_cluster(request.cluster, s)
        except ConfigError:
            continue
        out.append(s)
    return out


def solve_pipeline(
    request: PlanRequest,
    stages: int,
    deadline: Deadline,
    *,
    store: KeyValueStore | None = None,
    progress: ProgressFn | None = None,
    stage_mesh_shape: tuple[int, ...] | None = None,
) -> PipelinePlan:
    """The pipeline plan of ``request`` in ``stages`` stages, planned within ``deadline``
    (module docstring); raises :class:`~autopar.errors.TimeLimitError` when a stage of the
    balanced cut finds no plan in time and :class:`~autopar.errors.InfeasibleError` when one
    cannot fit the budget."""
    t0 = time.perf_counter()
    search = _CutSearch(request, stages, store, progress, stage_mesh_shape)
    even = balanced_counts(len(search.blocks), stages)
    run, ev = search.plan(even, "balanced", deadline)
    spent = time.perf_counter() - t0
    plans = [p for p in run.plans if p is not None]
    search.search_cuts(stage_costs(search.blocks, run.slices, plans, ev), deadline, spent)
    return search.result(t0)


@dataclass
class _Priced:
    """A planned cut under one schedule, verified."""

    run: StagesSolve
    plan: PipelinePlan
    evaluation: PipelineEvaluation
    v: int


class _CutSearch:
    """The cuts and schedules of one number of stages, priced and kept as rows (module docstring)."""

    def __init__(
        self,
        request: PlanRequest,
        stages: int,
        store: KeyValueStore | None,
        progress: ProgressFn | None,
        shape: tuple[int, ...] | None,
    ) -> None:
        self.request, self.stages, self.store, self.progress, self.shape = (
            request,
            stages,
            store,
            progress,
            shape,
        )
        self.k = request.options.micro_batches
        self.blocks = ordered_blocks(request.graph)
        self.choices = virtual_stage_choices(request.options.runtime, stages, self.k, len(self.blocks))
        self.rows: list[dict[str, Any]] = []
        self.cuts: list[dict[str, Any]] = []
        self.best: _Priced | None = None
        self.planned: set[tuple[int, ...]] = set()

    @property
    def best_iteration(self) -> float:
        assert self.best is not None
        return self.best.evaluation.iteration_time_s

    def plan(
        self, counts: tuple[int, ...], source: str, deadline: Deadline
    ) -> tuple[StagesSolve, PipelineEvaluation]:
        """Plan the stages of ``counts`` and price every schedule of it."""
        self.planned.add(counts)
        run = StagesSolve(self.request, counts, self.store, self.progress, self.shape)
        pp, ev = run.solve(deadline)
        self.price(run, pp, ev, source)
        return run, ev

    def price(self, run: StagesSolve, pp: PipelinePlan, ev: PipelineEvaluation, source: str) -> None:
        """A row per schedule of ``run``'s verified plan ``pp`` (evaluated ``ev`` under 1F1B):
        its iteration and memory, or why it is rejected."""
        here: _Priced | None = None
        budget = self.request.memory_budget_bytes
        for v in self.choices:
            row: dict[str, Any] = {"source": source, "block_counts": list(run.counts), "virtual_stages": v}
            self.rows.append(row)
            refusal = cut_refusal(run.counts, self.k, v)
            if refusal is not None:
                row["outcome"] = f"rejected: {refusal}"
                continue
            got = ev if v == 1 else rescheduled(ev, run.counts, self.k, v, budget)
            row["iteration_time_s"] = got.iteration_time_s
            row["memory_per_device_bytes"] = got.memory_per_device_bytes
            row["bubble_fraction"] = got.bubble_fraction
            if got.errors:
                row["outcome"] = f"rejected: {got.errors[0]}"
                continue
            row["outcome"] = "verified"
            if here is None or got.iteration_time_s < here.evaluation.iteration_time_s:
                here = _Priced(run, pp, got, v)
        assert here is not None  # 1F1B: the plan run.solve verified
        cut = {"block_counts": list(run.counts), "iteration_time_s": here.evaluation.iteration_time_s}
        self.cuts.append({**cut, "virtual_stages": here.v})
        if self.best is None or here.evaluation.iteration_time_s < self.best_iteration:
            self.best = here

    def search_cuts(self, costs: list[StageCosts], deadline: Deadline, spent: float) -> None:
        """Predict the best cut of every schedule from ``costs`` (per stage, from the balanced
        cut) and plan the promising ones (module docstring)."""
        budget = self.request.memory_budget_bytes
        predicted: list[tuple[CutPrediction, dict[str, Any]]] = []
        for v in self.choices:
            row: dict[str, Any] = {"source": "predicted", "virtual_stages": v}
            self.rows.append(row)
            p = best_cut(costs, self.k, v, budget)
            if p is None:
                row["outcome"] = "no cut fits the budget" + ("" if v == 1 else " in whole chunks")
                continue
            row["block_counts"] = list(p.counts)
            row["predicted_iteration_s"] = p.iteration_s
            row["predicted_memory_per_device_bytes"] = max(p.memory_bytes)
            predicted.append((p, row))
        searched = 0
        for p, row in sorted(predicted, key=lambda pr: pr[0].iteration_s):
            row["outcome"] = self.plan_predicted(p, deadline, spent, searched)
            searched += row["outcome"] == "planned" or row["outcome"].startswith("no plan")

    def plan_predicted(self, p: CutPrediction, deadline: Deadline, spent: float, searched: int) -> str:
        """Plan the predicted cut ``p`` when it is worth it and time is left; what happened."""
        if p.counts in self.planned:
            return "planned already"
        best = self.best_iteration
        if p.iteration_s > (1 - REBALANCE_GAIN) * best:
            return (
                f"not planned: predicted {p.iteration_s * 1e3:.3f} ms, not {REBALANCE_GAIN:.0%} under "
                f"the best verified {best * 1e3:.3f} ms"
            )
        if searched >= MAX_SEARCHED_CUTS:
            return f"not planned: {MAX_SEARCHED_CUTS} searched cuts planned already"
        if deadline.left() <= spent:
            return f"not planned: {deadline.left():.1f} s left, the balanced cut took {spent:.1f} s"
        try:
            self.plan(p.counts, "searched", deadline)
        except AutoparError as exc:
            self.cuts.append({"block_counts": list(p.counts), "error": f"[{exc.code}] {exc.message}"})
            return f"no plan: [{exc.code}] {exc.message}"
        return "planned"

    def result(self, t0: float) -> PipelinePlan:
        """The fastest verified cut and schedule, re-checked, with the search's rows and bound."""
        best = self.best
        assert best is not None
        pp = dataclasses.replace(best.plan, virtual_stages=best.v)
        ev = best.evaluation
        if best.v > 1:  # the schedule was priced on the 1F1B evaluation: check it whole
            ev = evaluate_pipeline(self.request.graph, pp, slices=best.run.slices)
            if ev.errors:
                why = f"{self.stages}-stage plan, v={best.v}, does not verify: {ev.errors[0]}"
                raise VerificationError("pipeline_unverified", why)
        for row in self.rows:
            if row["outcome"] == "verified":
                chosen = tuple(row["block_counts"]) == best.run.counts and row["virtual_stages"] == best.v
                row["outcome"] = "chosen" if chosen else "slower"
        pp = priced(pp, ev)
        pp.diagnostics["pipeline_search"] = self.rows
        pp.solver = self.solver_record(best.run, ev, t0)
        return pp

    def solver_record(self, run: StagesSolve, ev: PipelineEvaluation, t0: float) -> dict[str, Any]:
        """The plan's ``solver``: its iteration, the bound over every schedule of its cut, the cuts."""
        request, k = self.request, self.k
        per_micro, once = boundary_floors(
            request.graph,
            run.slices,
            run.sub.world_size,
            stage_link(request.cluster, self.stages),
            request.options.runtime,
        )
        stage_bounds = [lb + k * m + u for lb, m, u in zip(run.bounds, per_micro, once)]
        micro_bounds = [tau + m for tau, m in zip(run.micro_bounds, per_micro)]
        schedules = [v for v in self.choices if cut_refusal(run.counts, k, v) is None]
        least = min(schedule_bound(stage_bounds, micro_bounds, k, v) for v in schedules)
        bound = min(least, ev.iteration_time_s)
        it = ev.iteration_time_s
        return {
            "objective": it,
            "bound": bound,
            "gap": (it - bound) / it if it > 0 else 0.0,
            "bound_note": "the stages' proven bounds (each stage's iteration and its micro-batch time) "
            "under 1F1B and every interleaving this cut allows: the bubble included; not over other cuts",
            "stage_bounds": stage_bounds,
            "micro_batch_bounds": micro_bounds,
            "stages": self.stages,
            "virtual_stages": ev.virtual_stages,
            "cuts": self.cuts,
            "memory_rounds": run.rounds,
            "wall_s": time.perf_counter() - t0,
        }


def cut_search_text(rows: list[dict[str, Any]]) -> str:
    """The ``cut search:`` lines: every cut and schedule priced (its iteration and memory, or
    why it was rejected) and every cut predicted (its predicted iteration, and whether it was
    planned)."""
    lines = ["cut search (blocks per stage, v chunks per device; balanced, predicted by the DP, searched):"]
    for r in rows:
        counts = r.get("block_counts", "-")
        head = f"  {r['source']:<9} {counts} v={r['virtual_stages']}"
        if "iteration_time_s" in r:
            figures = (
                f"iteration {r['iteration_time_s'] * 1e3:.3f} ms, "
                f"{format_bytes(r['memory_per_device_bytes'])}/dev"
            )
        elif "predicted_iteration_s" in r:
            figures = f"predicted {r['predicted_iteration_s'] * 1e3:.3f} ms"
        else:
            figures = ""
        lines.append(f"{head}: {figures + ': ' if figures else ''}{r['outcome']}")
    return "\n".join(lines) + "\n"
