"""Pipeline-parallel plans: stages of blocks on sub-meshes, priced under the 1F1B schedule.

A :class:`PipelinePlan` cuts a graph into ``S`` stages (:mod:`autopar.pipeline.split`),
each on its own ``world / S`` devices (whole nodes, or a slice of one node), each with
its own :class:`~autopar.ir.plan.Plan` of the stage's graph: an N-D SBP per op, ZeRO over the
stage's data-parallel axes.  Its wire format is ``autopar.pipeline/v1``
(docs/plan-format.md, "Pipeline plans"); a one-stage plan is the stage's ``autopar.plan/v1``.

The iteration (1F1B, PipeDream-flush; Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", sec. 2.2; Harlap et al. 2018,
PipeDream) is priced by :func:`autopar.pipeline.schedule.one_f_one_b_iteration`, the memory of a stage by
:func:`stage_memory_bytes`, the point-to-point traffic between stages by
:func:`boundary_time`.  :func:`evaluate_pipeline` re-checks all of it from the graph.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autopar.cost.activation_spans import activation_spans, variable_memory_bytes
from autopar.cost.compute import boundary_bytes_per_device, stage_boundary_link
from autopar.cost.evaluate import evaluate
from autopar.cost.evaluation import Evaluation
from autopar.cost.fusion import fused_kernels
from autopar.cost.memory import graph_state_bytes, shard_bytes
from autopar.errors import ConfigError, PlanError
from autopar.hardware.cluster import Cluster
from autopar.hardware.collectives import all_reduce_time, send_recv_time
from autopar.hardware.mesh import AxisLink
from autopar.ir.blocks import layer_of
from autopar.ir.graph import DTYPE_BYTES, Graph, Role
from autopar.ir.plan import Plan, format_bytes
from autopar.ir.sbp import NdSbp
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.schedule import interleaved_in_flight, interleaved_iteration, interleaving_refusal
from autopar.pipeline.split import RECV_SUFFIX, StageSlice, split_graph, stage_devices
from autopar.runtimes.profile import Lowering
from autopar.runtimes.registry import runtime_profile

__all__ = [
    "PipelineEvaluation",
    "StageCost",
    "boundary_floors",
    "boundary_time",
    "evaluate_pipeline",
    "priced",
    "rescheduled",
    "stage_cluster",
    "stage_link",
    "stage_memory_bytes",
    "stash_by_layer",
    "stash_bytes",
]


def stage_memory_bytes(
    peak_one_micro_batch: float, stash_bytes: float, in_flight: float, extra: float = 0.0
) -> float:
    """Bytes per device of a stage: ``peak + (m - 1) * stash + extra``.

    ``peak``: the stage's peak with one micro-batch (model states, one micro-batch's live
    activations, boxed copies; :func:`autopar.cost.evaluate.evaluate`); ``stash``: the
    activations one micro-batch keeps from its forward to its backward
    (:func:`stash_bytes`: with per-block checkpointing only the blocks' inputs);
    ``m``: micro-batches in flight (:func:`autopar.pipeline.schedule.interleaved_in_flight`);
    ``extra``: the model states of a copied parameter beyond the copy's own parameter bytes (the tied word
    embedding's gradient and optimizer states on the last stage)."""
    return peak_one_micro_batch + (in_flight - 1) * stash_bytes + extra


def stage_link(cluster: Cluster, stages: int) -> AxisLink:
    """The link between the devices of adjacent stages: across nodes when a stage holds whole
    nodes, inside a node when stages are slices of one node
    (:func:`autopar.cost.compute.stage_boundary_link`)."""
    per_stage = stage_devices(cluster.world_size, stages)
    return stage_boundary_link(cluster, per_stage >= cluster.devices_per_node and cluster.nodes > 1)


def boundary_time(bytes_per_device: float, link: AxisLink) -> float:
    """Seconds of one boundary transfer: a point-to-point send of ``bytes_per_device`` on
    ``link`` (:func:`autopar.hardware.collectives.send_recv_time`; every device of the stage receives its
    piece at once)."""
    return send_recv_time(bytes_per_device, link)


def stage_cluster(cluster: Cluster, stages: int) -> Cluster:
    """The cluster one stage runs on: ``world / S`` devices as whole nodes, or a slice of a
    node (``ConfigError`` when neither divides)."""
    per_stage = stage_devices(cluster.world_size, stages)
    per_node = cluster.devices_per_node
    if per_stage % per_node == 0:
        return dataclasses.replace(cluster, nodes=per_stage // per_node)
    if per_node % per_stage == 0:
        return dataclasses.replace(cluster, nodes=1, devices_per_node=per_stage)
    raise ConfigError(
        "bad_pipeline",
        f"{stages} stages give {per_stage} devices each, neither whole nodes of {per_node} nor a "
        "slice of one node; use a number of stages that does",
    )


@dataclass
class StageCost:
    """One stage, re-evaluated."""

    stage: int
    blocks: tuple[str, ...]
    evaluation: Evaluation
    receive_time_s: float
    """Seconds per micro-batch of its receives (part of ``evaluation``'s micro-batch)."""
    once_comm_s: float
    stash_bytes: float
    extra_bytes: float
    in_flight: float
    memory_bytes: float
    tied_time_s: float = 0.0
    """Seconds per micro-batch moving a tied parameter or its gradient (``oneflow-0.9``)."""

    @property
    def micro_batch_time_s(self) -> float:
        """The stage's time per micro-batch: forward, recompute, backward, receives."""
        return self.evaluation.micro_batch_time_s + self.tied_time_s

    @property
    def once_per_step_s(self) -> float:
        return self.evaluation.once_per_step_time_s + self.once_comm_s


@dataclass
class PipelineEvaluation:
    """A pipeline plan recomputed from the graph."""

    stages: list[StageCost]
    iteration_time_s: float
    memory_per_device_bytes: float
    errors: list[str]
    achieved_iteration_time_s: float = math.nan
    """The iteration as the stages' runtime runs it: each stage's once-per-step work less the
    communication it hides (:attr:`autopar.cost.evaluation.Evaluation.hidden_comm_time_s`)."""
    virtual_stages: int = 1

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def bubble_fraction(self) -> float:
        """Share of the iteration the slowest stage waits in the fill and drain."""
        busy = len(self.stages) and max(s.micro_batch_time_s for s in self.stages)
        k = self.stages[0].evaluation.training.micro_batches if self.stages else 1
        if self.virtual_stages > 1:  # the bubble of interleaved 1F1B: over v, for v times the sends
            busy = max(
                s.micro_batch_time_s + (self.virtual_stages - 1) * s.receive_time_s for s in self.stages
            )
        return 1 - (k * busy) / self.iteration_time_s if self.iteration_time_s > 0 else 0.0

    def predicted(self) -> dict[str, Any]:
        return {
            "iteration_time_s": self.iteration_time_s,
            "achieved_iteration_time_s": self.achieved_iteration_time_s,
            "memory_per_device_bytes": self.memory_per_device_bytes,
            "bubble_fraction": self.bubble_fraction,
            "stages": [
                {
                    "stage": s.stage,
                    "blocks": len(s.blocks),
                    "first_block": s.blocks[0] if s.blocks else None,
                    "last_block": s.blocks[-1] if s.blocks else None,
                    "devices": 0,
                    "mesh_shape": [],
                    "micro_batch_time_s": s.micro_batch_time_s,
                    "tied_time_s": s.tied_time_s,
                    "receive_time_s": s.receive_time_s,
                    "once_per_step_time_s": s.once_per_step_s,
                    "memory_per_device_bytes": s.memory_bytes,
                    "stash_bytes": s.stash_bytes,
                    "in_flight": _count(s.in_flight),
                }
                for s in self.stages
            ],
        }


def _count(micro_batches: float) -> int | float:
    """Micro-batches in flight as written in a plan: a whole number as an ``int`` (``2``, not
    ``2.0``); interleaved 1F1B's fractions of a device's layers as they are."""
    return int(micro_batches) if float(micro_batches).is_integer() else micro_batches


def stash_bytes(graph: Graph, plan: Plan) -> float:
    """Bytes per device one micro-batch keeps from the end of the stage's forward to its
    backward: every activation a forward op produced that is live past the last forward op
    (:func:`autopar.cost.activation_spans.activation_spans`: with checkpointing, a recomputed block keeps
    only its inputs), at the plan's layout (:func:`autopar.cost.memory.shard_bytes`).  The
    parameters' working copies are shared by the micro-batches: not stashed."""
    return sum(stash_by_layer(graph, plan).values())


def stash_by_layer(graph: Graph, plan: Plan) -> dict[str, float]:
    """:func:`stash_bytes` by the layer of each stashed tensor's producer
    (:func:`autopar.ir.blocks.layer_of`: ``layers.3``, or ``embedding`` for what the stage runs
    outside its blocks), bytes per device."""
    order = graph.topological_order
    last_forward = max((i for i, op in enumerate(order) if op.role is Role.FORWARD), default=0)
    out: dict[str, float] = {}
    fused = fused_kernels(graph, runtime_profile(plan.runtime)).internal
    for tname, start, end in activation_spans(graph, plan.training, True, fused):
        if not start <= last_forward < end:
            continue
        pname, port = graph.producer[tname]
        if graph.op_by_name[pname].role is not Role.FORWARD:
            continue
        spec = graph.tensors[tname]
        layer = layer_of(pname)
        out[layer] = out.get(layer, 0.0) + shard_bytes(
            spec.shape, DTYPE_BYTES[spec.dtype], plan.output_sbp(pname, port), plan.mesh.shape
        )
    return out


def _copy_extra_bytes(graph: Graph, sl: StageSlice, plan: Plan) -> float:
    """Model states of the parameters stage ``sl`` holds as copies, beyond the copy's parameter
    bytes its frozen variable already counts: the gradient, its accumulation buffer and the
    optimizer states, laid out as the stage's plan lays the copy out."""
    extra = 0.0
    runtime = runtime_profile(plan.runtime)
    by_op = {v.op: v for v in graph.variables}
    copy_vars = {v.op: v for v in sl.graph.variables}
    for name in sl.tied_copies:
        v = by_op[name]
        spec = graph.tensors[v.tensor]
        sbp = plan.output_sbp(name, next(iter(sl.graph.op_by_name[name].outputs)))
        args = (spec.shape, sbp, plan.mesh.shape, plan.zero_stage)
        full = sum(
            variable_memory_bytes(
                *args, graph_state_bytes(graph, v), runtime.zero_sharding.value, plan.training, runtime
            )
        )
        own = sum(
            variable_memory_bytes(
                *args,
                graph_state_bytes(sl.graph, copy_vars[name]),
                runtime.zero_sharding.value,
                plan.training,
                runtime,
            )
        )
        extra += full - own
    return extra


def _received_layout(plan: Plan, tensor: str) -> NdSbp:
    """The layout of ``tensor`` as the receiving stage's ``.recv`` op produces it."""
    return plan.output_sbp(f"{tensor}{RECV_SUFFIX}", "out")


@dataclass
class _BoundaryCosts:
    receives: list[float]
    """Seconds per micro-batch each stage spends receiving (already in its own micro-batch)."""
    once: list[float]
    """Seconds once per step."""
    tied: list[float]
    """Seconds per micro-batch of a tied parameter moved between stages (``oneflow-0.9``)."""


TIED_TRANSFERS_PER_MICRO_BATCH = {"to_copy": 2, "to_owner": 1}
"""Under ``oneflow-0.9`` a tied parameter's stages exchange it every micro-batch, as its owner
lays it out: counted on the compiled 2-stage tiny GPT (tests/oneflow/test_pipeline_apply.py:
OneFlow 0.9 moves the word embedding, 128 KiB per device as the owner holds it, twice into
the head's stage and its gradient once back, every micro-batch; LiBai moves it with
``to_stage``).  The intra-stage solve does not see these trips: the re-check prices them."""


def _owner_piece(graph: Graph, copy_stage: StageSlice, owner: Plan, shape: tuple[int, ...]) -> float:
    """Bytes per device of the tied parameter of ``shape`` that ``copy_stage`` holds a copy of, as
    its owner's plan lays the parameter out (what OneFlow 0.9 sends between the stages)."""
    for name in copy_stage.tied_copies:
        port, tensor = next(iter(graph.op_by_name[name].outputs.items()))
        spec = graph.tensors[tensor]
        if tuple(spec.shape) == tuple(shape):
            sbp = owner.output_sbp(name, port)
            return shard_bytes(spec.shape, DTYPE_BYTES[spec.dtype], sbp, owner.mesh.shape)
    raise PlanError("bad_plan", f"no tied parameter of shape {list(shape)} in stage {copy_stage.index}")


def _boundary_costs(
    graph: Graph, slices: list[StageSlice], stages: list[Plan], link: AxisLink
) -> _BoundaryCosts:
    """The boundaries' time.  A per-micro-batch receive is already in the stage's own
    micro-batch (its ``pipeline_recv`` op's time, :func:`autopar.cost.compute.receive_time`): it is
    only reported.  A once-per-step tensor (clipping's norms) costs its receiver one
    :func:`boundary_time` per step.  A tied parameter's gradient: as the runtime runs it,
    an all-reduce of the two copies' gradients once per step on both stages (Megatron-LM's
    ``_allreduce_word_embedding_grads``; runtimes ``megatron-lm`` and ``ideal``), or under
    ``oneflow-0.9`` the parameter sent to the reading stage and its gradient back every
    micro-batch as its owner lays it out (:data:`TIED_TRANSFERS_PER_MICRO_BATCH`)."""
    n = len(slices)
    out = _BoundaryCosts([0.0] * n, [0.0] * n, [0.0] * n)
    for sl in slices:
        for b in sl.receives:
            spec = graph.tensors[b.tensor]
            dst_plan = stages[b.dst]
            got = _received_layout(dst_plan, b.tensor)
            nbytes = boundary_bytes_per_device(spec.numel, spec.dtype, got, dst_plan.mesh.shape)
            if b.tied_gradient and runtime_profile(dst_plan.runtime).lowering is Lowering.ONEFLOW_0_9:
                # OneFlow moves the parameter as its owner holds it
                piece = _owner_piece(graph, slices[b.src], dst_plan, spec.shape)
                send = boundary_time(piece, link)
                out.tied[b.src] += TIED_TRANSFERS_PER_MICRO_BATCH["to_copy"] * send
                out.tied[b.dst] += TIED_TRANSFERS_PER_MICRO_BATCH["to_owner"] * send
            elif b.tied_gradient:
                t = all_reduce_time(2 * nbytes, link)  # T = both copies' bytes on a 2-device ring
                out.once[b.src] += t
                out.once[b.dst] += t
            elif b.per == "step":
                out.once[b.dst] += boundary_time(nbytes, link)
            else:
                out.receives[b.dst] += boundary_time(nbytes, link)
    return out


def boundary_floors(
    graph: Graph, slices: list[StageSlice], devices: int, link: AxisLink, runtime: str
) -> tuple[list[float], list[float]]:
    """What the boundaries outside the stages' own problems cost at least, whatever the stages'
    layouts: (per micro-batch, once per step) seconds per stage of :func:`_boundary_costs`'s
    tied-parameter and once-per-step terms with every tensor split over all ``devices`` of a
    stage (the fewest bytes any layout gives a device; the times grow with the bytes).  For
    the pipeline's lower bound (``autopar_solver.planner.pipeline_bounds``)."""
    n = len(slices)
    per_micro, once = [0.0] * n, [0.0] * n
    oneflow = runtime_profile(runtime).lowering is Lowering.ONEFLOW_0_9
    for sl in slices:
        for b in sl.receives:
            spec = graph.tensors[b.tensor]
            least = spec.numel * DTYPE_BYTES[spec.dtype] / devices
            if b.tied_gradient and oneflow:
                send = boundary_time(least, link)
                per_micro[b.src] += TIED_TRANSFERS_PER_MICRO_BATCH["to_copy"] * send
                per_micro[b.dst] += TIED_TRANSFERS_PER_MICRO_BATCH["to_owner"] * send
            elif b.tied_gradient:
                t = all_reduce_time(2 * least, link)
                once[b.src] += t
                once[b.dst] += t
            elif b.per == "step":
                once[b.dst] += boundary_time(least, link)
    return per_micro, once


def evaluate_pipeline(
    graph: Graph,
    plan: PipelinePlan,
    *,
    slices: list[StageSlice] | None = None,
) -> PipelineEvaluation:
    """Re-check ``plan`` on ``graph``: split the graph as the plan says, evaluate every stage's
    plan on its stage graph (:func:`autopar.cost.evaluate.evaluate`), price the boundaries, each
    stage's memory with its micro-batches in flight, and the 1F1B iteration.  ``slices``: the
    split a caller already made of ``plan.counts`` with this cluster's link (the solver,
    round after round), so it is not made again."""
    link = stage_link(plan.cluster, len(plan.counts))
    if slices is None:
        slices = split_graph(graph, plan.counts, link.crosses_nodes)
    if len(slices) != len(plan.stages):
        raise PlanError("bad_plan", f"{len(plan.stages)} stage plans for {len(slices)} stages")
    errors: list[str] = []
    bc = _boundary_costs(graph, slices, plan.stages, link)
    k = plan.training.micro_batches
    costs = []
    for sl, sp in zip(slices, plan.stages):
        if sp.graph_hash != sl.graph.content_hash():
            errors.append(f"stage {sl.index}: its plan is for another graph than the split gives")
        ev = evaluate(sl.graph, sp, training=sp.training)
        errors.extend(f"stage {sl.index}: {e}" for e in ev.errors)
        stash = stash_bytes(sl.graph, sp)
        extra = _copy_extra_bytes(graph, sl, sp)
        costs.append(
            StageCost(
                sl.index,
                sl.blocks,
                ev,
                bc.receives[sl.index],
                bc.once[sl.index],
                stash,
                extra,
                0.0,  # in flight and memory: the schedule's (_scheduled)
                0.0,
                bc.tied[sl.index],
            )
        )
    return _scheduled(costs, plan.counts, k, plan.virtual_stages, plan.memory_budget_bytes, errors)


def rescheduled(
    ev: PipelineEvaluation, counts: Sequence[int], k: int, v: int, budget: float | None
) -> PipelineEvaluation:
    """A valid evaluation ``ev`` of a plan with block ``counts`` priced under ``v`` virtual
    stages per device: the same stages, each with the micro-batches in flight of that schedule,
    and its iteration; what :func:`evaluate_pipeline` gives the plan with ``virtual_stages = v``
    (the search prices the schedules of a cut without evaluating its stages again)."""
    if ev.errors:
        raise PlanError("bad_plan", f"cannot reschedule a pipeline that does not verify: {ev.errors[0]}")
    costs = [dataclasses.replace(c) for c in ev.stages]
    return _scheduled(costs, counts, k, v, budget, [])


def _scheduled(
    costs: list[StageCost],
    counts: Sequence[int],
    k: int,
    v: int,
    budget: float | None,
    errors: list[str],
) -> PipelineEvaluation:
    """The stages ``costs`` under ``v`` virtual stages per device (1: 1F1B): each stage's
    micro-batches in flight and memory, Megatron-LM's refusal of the interleaving (every
    stage's blocks must divide into ``v`` chunks), the iteration, the budget."""
    n = len(costs)
    for c in costs:
        c.in_flight = interleaved_in_flight(c.stage, n, k, v)
        peak = c.evaluation.memory.total
        c.memory_bytes = stage_memory_bytes(peak, c.stash_bytes, c.in_flight, c.extra_bytes)
    refusal = next((r for c in sorted(set(counts)) if (r := interleaving_refusal(n, c, k, v))), None)
    if refusal is not None:
        errors.append(refusal)
    micro = [c.micro_batch_time_s for c in costs]
    sends = [c.receive_time_s for c in costs]
    iteration = interleaved_iteration(micro, [c.once_per_step_s for c in costs], sends, k, v)
    achieved = interleaved_iteration(
        micro, [c.once_per_step_s - c.evaluation.hidden_comm_time_s for c in costs], sends, k, v
    )
    memory = max(c.memory_bytes for c in costs)
    if budget is not None and memory > budget:
        errors.append(f"memory {format_bytes(memory)} per device exceeds the budget " + format_bytes(budget))
    return PipelineEvaluation(costs, iteration, memory, errors, achieved, v)


def priced(plan: PipelinePlan, ev: PipelineEvaluation) -> PipelinePlan:
    """``plan`` with ``ev``'s figures as its prediction (devices and meshes per stage filled in)."""
    predicted = ev.predicted()
    for row, sp in zip(predicted["stages"], plan.stages):
        row["devices"] = sp.mesh.size
        row["mesh_shape"] = list(sp.mesh.shape)
    plan.predicted = predicted
    return plan
