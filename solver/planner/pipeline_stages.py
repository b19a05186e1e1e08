"""The stages of one cut, planned: every stage's graph on its own ``world / S`` devices by the
intra-stage planner (:func:`autopar_solver.planner.plan`: the exact SBP solve with ZeRO,
checkpointing and memory rows), on the stage mesh named, else :func:`default_stage_shape`.
Identical layers share cost-table entries across stages, and a stage starts from the plan of
an earlier stage with as many blocks (its op names moved).

Memory: a stage keeps the activations of ``min(S - s, K)`` micro-batches
(:func:`autopar.pipeline.evaluate.stage_memory_bytes`), which the intra-stage planner does not see;
a stage over the budget is planned again under the budget less its overshoot (at most
:data:`MEMORY_ROUNDS` times).  Every result is re-checked by
:func:`autopar.pipeline.evaluate.evaluate_pipeline`.
"""

from __future__ import annotations

import dataclasses
import math

from autopar.cost.build_tables import build_cost_tables
from autopar.errors import InfeasibleError, TimeLimitError, VerificationError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline, ProgressFn
from autopar.infra.store import KeyValueStore, MemoryStore
from autopar.ir.blocks import layer_of
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan, format_bytes
from autopar.pipeline.evaluate import PipelineEvaluation, evaluate_pipeline, stage_cluster, stage_link
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.split import StageSlice, ordered_blocks, split_graph
from autopar_solver.planner.pipeline_bounds import micro_batch_bound
from autopar_solver.planner.request import PlanRequest

__all__ = ["MEMORY_ROUNDS", "StagesSolve", "default_stage_shape"]

MEMORY_ROUNDS = 3
"""Re-plans of a stage over its budget with its micro-batches in flight."""
VERIFY_S_PER_OP = 1e-3
"""Seconds per op of the whole graph kept for :func:`autopar.pipeline.evaluate.evaluate_pipeline` after
each round (measured: 6.7 s for the 8,334 ops of a 48-layer GPT at load 18 on 2 cores)."""
MEMORY_RESERVE = 0.25
"""Share of the time the first round leaves for memory rounds (under a budget)."""


def default_stage_shape(sub: Cluster) -> tuple[int, ...]:
    """A stage's mesh when none is named: its nodes x the devices of a node (the last axis inside
    a node, where tensor parallelism goes, as Megatron-LM, Alpa and Galvatron lay out a stage);
    a stage of one node or a slice of one: two axes ``[2, D / 2]`` when ``D >= 4``, else ``[D]``.
    The intra-stage solve chooses what each axis does (a split batch on both is data
    parallelism over the whole stage)."""
    if sub.nodes > 1:
        return (sub.nodes, sub.devices_per_node)
    d = sub.devices_per_node
    return (2, d // 2) if d >= 4 and d % 2 == 0 else (d,)


def _stage_request(
    request: PlanRequest,
    graph: Graph,
    cluster: Cluster,
    shape: tuple[int, ...] | None,
    budget: float | None,
    time_s: float,
) -> PlanRequest:
    options = dataclasses.replace(request.options, time_limit_s=max(time_s, 0.5))
    return dataclasses.replace(
        request,
        tie_layers=True,  # a stage's blocks are identical layers: one shared choice each
        graph=graph,
        cluster=cluster,
        mesh_shape=shape,
        memory_budget_bytes=None if budget is None else int(budget),
        options=options,
    )


class StagesSolve:
    """The stages of one pipeline, planned round by round (a round re-plans the stages over
    the budget under a smaller one)."""

    def __init__(
        self,
        request: PlanRequest,
        counts: tuple[int, ...],
        store: KeyValueStore | None,
        progress: ProgressFn | None,
        stage_mesh_shape: tuple[int, ...] | None,
    ) -> None:
        stages = len(counts)
        self.request, self.stages, self.progress = request, stages, progress
        graph = request.graph
        self.blocks = ordered_blocks(graph)
        self.counts = counts
        self.slices = split_graph(graph, self.counts, stage_link(request.cluster, stages).crosses_nodes)
        self.sub = stage_cluster(request.cluster, stages)
        self.shape = stage_mesh_shape or default_stage_shape(self.sub)
        self.budget = request.memory_budget_bytes
        self.budgets: list[float | None] = [self.budget] * stages
        # cost-table entries of identical layers are built once for every stage
        self.memo: KeyValueStore = store if store is not None else MemoryStore()
        self.plans: list[Plan | None] = [None] * stages
        self.bounds: list[float] = [0.0] * stages
        self.micro_bounds: list[float] = [0.0] * stages
        """Each stage's proven lower bound on one micro-batch's time (:mod:`.pipeline_bounds`)."""
        self.rounds = 0

    def solve(self, deadline: Deadline) -> tuple[PipelinePlan, PipelineEvaluation]:
        """Every stage planned, re-planned while over the budget, the whole re-checked."""
        todo = list(range(self.stages))
        while True:
            self.plan_round(todo, deadline)
            pp = self.pipeline()
            ev = evaluate_pipeline(self.request.graph, pp, slices=self.slices)
            todo = self.over_budget(ev)
            if not todo:
                break
        if ev.errors:
            raise VerificationError(
                "pipeline_unverified", f"{self.stages}-stage plan does not verify: {ev.errors[0]}"
            )
        return pp, ev

    def plan_round(self, todo: list[int], deadline: Deadline) -> None:
        """Plan the stages ``todo``, sharing the time of this round equally."""
        from autopar_solver.planner import plan  # the intra-stage planner

        # the first round keeps a quarter of the time for a memory round, and every round
        # the re-check of the whole pipeline after it
        reserve = MEMORY_RESERVE if self.rounds == 0 and self.budget is not None else 0.0
        verify = VERIFY_S_PER_OP * len(self.request.graph.ops)
        this_round = Deadline((deadline.left() - verify) * (1 - reserve))
        for n, s in enumerate(todo):
            share = this_round.left() / (len(todo) - n)
            if share <= 0.5:
                raise TimeLimitError(
                    "time_limit", f"no time left to plan stage {s} of {self.stages}", phase="pipeline"
                )
            req = _stage_request(
                self.request, self.slices[s].graph, self.sub, self.shape, self.budgets[s], share
            )
            hint = self.plans[s] or _renamed_hint(self.plans, self.slices, s, self.blocks)
            p = plan(req, store=self.memo, progress=self.progress, hint=hint)
            self.plans[s] = p
            if self.rounds == 0 and p.solver is not None:
                b = p.solver.get("bound")
                self.bounds[s] = float(b) if isinstance(b, (int, float)) and math.isfinite(b) else 0.0
                self.micro_bounds[s] = self.micro_bound(s, this_round)
        self.rounds += 1

    def micro_bound(self, s: int, deadline: Deadline) -> float:
        """Stage ``s``'s proven lower bound on one micro-batch's time (its tables are in the
        memo: nothing is computed again), within a share of what the round has left."""
        options = self.request.options
        tables = build_cost_tables(
            self.slices[s].graph,
            Mesh(self.sub, self.shape),
            self.request.zero_stage,
            store=self.memo,
            workers=options.workers,
            runtime=options.runtime,
        )
        share = Deadline(max(0.1, deadline.left() * 0.05))
        return micro_batch_bound(tables, options.training, share, options.deterministic)

    def pipeline(self) -> PipelinePlan:
        done = [p for p in self.plans if p is not None]
        graph = self.request.graph
        return PipelinePlan(
            graph.name,
            graph.content_hash(),
            self.request.cluster,
            self.counts,
            done,
            self.request.options.training,
            memory_budget_bytes=self.budget,
        )

    def over_budget(self, ev: PipelineEvaluation) -> list[int]:
        """The stages over the budget with their micro-batches in flight, each given a smaller
        budget for the next round; :class:`InfeasibleError` after :data:`MEMORY_ROUNDS` re-plans."""
        budget = self.budget
        over = [c for c in ev.stages if budget is not None and c.memory_bytes > budget]
        if not over or budget is None:
            return []
        if self.rounds > MEMORY_ROUNDS:
            worst = max(over, key=lambda c: c.memory_bytes)
            raise InfeasibleError(
                "pipeline_memory",
                f"stage {worst.stage} of {self.stages} needs {format_bytes(worst.memory_bytes)} per device "
                f"with its {_count(worst.in_flight)} micro-batches in flight, over the budget "
                f"{format_bytes(budget)} after {MEMORY_ROUNDS} re-plans; use more stages, fewer "
                "micro-batches, checkpointing, or a larger budget",
            )
        for c in over:
            prev = self.budgets[c.stage]
            assert prev is not None
            # the overshoot, and a margin: the re-plan's stash may grow as its layout changes
            smaller = prev - (c.memory_bytes - budget) * 1.1 - 0.01 * budget
            if smaller <= 0:  # the micro-batches in flight alone take the budget
                raise InfeasibleError(
                    "pipeline_memory",
                    f"stage {c.stage} of {self.stages} needs {format_bytes(c.memory_bytes)} per device with "
                    f"its {_count(c.in_flight)} micro-batches in flight, and what they stash leaves nothing "
                    f"of the budget {format_bytes(budget)} for one micro-batch; use more stages, fewer "
                    "micro-batches, checkpointing, or a larger budget",
                )
            self.budgets[c.stage] = smaller
        return [c.stage for c in over]


def _count(micro_batches: float) -> str:
    """Micro-batches in flight as a person reads them: ``2``, or ``1.38`` under interleaving."""
    return f"{micro_batches:g}" if float(micro_batches).is_integer() else f"{micro_batches:.2f}"


def _renamed_hint(
    plans: list[Plan | None], slices: list[StageSlice], s: int, blocks: list[str]
) -> Plan | None:
    """A warm start for stage ``s``: the plan of an earlier stage with as many blocks, its op
    names moved by the distance between the two stages' first blocks (``layers.3.mlp`` ->
    ``layers.9.mlp``); ops it does not name start free (:func:`.on_mesh._hint_choices`)."""
    target = slices[s]
    for donor, p in zip(slices, plans):
        if p is None or donor.index == s or len(donor.blocks) != len(target.blocks):
            continue
        shift = blocks.index(target.blocks[0]) - blocks.index(donor.blocks[0])
        moved = {b: blocks[i + shift] for i, b in enumerate(blocks) if 0 <= i + shift < len(blocks)}
        signatures = {}
        for name, sig in p.signatures.items():
            new = _moved_name(name, moved)
            if new in target.graph.op_by_name:
                signatures[new] = sig
        return dataclasses.replace(p, signatures=signatures)
    return None


def _moved_name(name: str, moved: dict[str, str]) -> str:
    """``name`` with its block prefix (``layers.3`` in ``layers.3.mlp.fc1``) replaced per ``moved``."""
    block = layer_of(name)
    if block in moved and name.startswith(block):
        return moved[block] + name[len(block) :]
    return name
