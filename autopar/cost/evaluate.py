"""Re-evaluation of a plan: validity, step time, communication, memory.

It shares the cost model's pure functions (op rules, compute time, edge
pricing, boxing) with the cost tables but none of their caching, batching or
the solver, so it checks the solver's arithmetic and every edge, not the
model itself.  The independent check of the model is what OneFlow compiles
(``autopar oneflow fidelity``).

1. every op's signature must be one its rule offers (all-``B`` for ops with no rule);
2. every edge (producer output port -> consumer input port) must be boxable
   (finite cost), priced by :func:`autopar.cost.edges.edge_time` under the plan's
   runtime profile;
3. serial step time = sum of op compute times + sum of edge times; the
   overlapped step time lets data-parallel gradient reduction hide behind the
   backward pass: ``serial - min(gradient comm, backward compute)``;
   communication is broken down per mesh axis and per collective kind;
4. memory per device = model states (ZeRO stage, from each variable's SBP and
   the graph's dtypes) + activation peak along the topological order,
   including boxed input copies at their consumers and ZeRO-3's gathered
   parameters.

Every price is kept as a record: one :class:`OpCost` per op, one
:class:`EdgeCost` per boxed edge (and per ZeRO parameter gather), and the live
activation bytes at every position of the topological order
(``Evaluation.activation_profile``).  The totals are sums of these records, and
:mod:`autopar.cost.breakdown` (the report's per-op, per-edge and per-layer view)
reads them instead of pricing the plan a second time.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field

from autopar.cost.activation_spans import accumulation_buffer_bytes, activation_spans
from autopar.cost.compute import op_compute_time, rule_context
from autopar.cost.edges import EdgeKind, edge_kind, edge_time, placed_layout, same_layout
from autopar.cost.evaluation import EdgeCost, Evaluation, OpCost, PricingMemo
from autopar.cost.fusion import NO_KERNELS, Kernels, fused_kernels, priced_op
from autopar.cost.iteration import RunCounts, run_counts
from autopar.cost.memory import (
    MemoryBreakdown,
    Precision,
    activation_profile,
    boxed_copy_bytes,
    graph_state_bytes,
    variable_state_bytes,
    zero3_gather_buffer_bytes,
)
from autopar.cost.zero_gathers import optimizer_gather_plan, zero_gather_dtype, zero_gathers_per_step
from autopar.ir.graph import Graph, Op, Role
from autopar.ir.optimizer import model_port_index, weight_gradient_path
from autopar.ir.plan import Plan
from autopar.ir.sbp import NdSbp, Signature
from autopar.ir.training import TrainingConfig
from autopar.rules.megatron_lm import rules_for_source
from autopar.rules.registry import RuleSet
from autopar.runtimes.boxing import BoxingPlan
from autopar.runtimes.megatron_lm.linears import megatron_input_gradient_linears
from autopar.runtimes.profile import RuntimeProfile
from autopar.runtimes.registry import runtime_profile

__all__ = ["attach_evaluation", "evaluate"]


def evaluate(
    graph: Graph,
    plan: Plan,
    *,
    rules: RuleSet | None = None,
    precision: Precision | None = None,
    check_signatures: bool = True,
    memo: PricingMemo | None = None,
    training: TrainingConfig | None = None,
) -> Evaluation:
    """Recompute validity, step and iteration time, communication and memory of ``plan`` on ``graph``.

    ``precision`` None takes model-state bytes from the graph's dtypes
    (:func:`autopar.cost.memory.graph_state_bytes`); a :class:`Precision` imposes
    that policy instead.  ``memo`` shares the rules' answers between plans of
    one graph.  ``training`` (default: the plan's) sets the micro-batches per
    optimizer step and checkpointing the iteration is priced for
    (:mod:`autopar.cost.iteration`): any plan can be re-evaluated at another ``K``.

    The plan is priced as its runtime runs it, one rule for every plan (a solved one, a
    baseline, an imported one): where the runtime groups fan-out
    (:attr:`~autopar.runtimes.profile.RuntimeProfile.groups_fan_out`), a producer's tensor is
    boxed once per distinct destination N-D SBP and every consumer that takes it in that
    layout shares the copy (OneFlow's ``group_boxing_by_dst_parallel.cpp``: one boxing per
    tensor and destination placement and N-D SBP); where it fuses sibling linears
    (:attr:`~autopar.runtimes.profile.RuntimeProfile.fuses_sibling_linears`), their input
    gradients are reduced once.  The shared boxings are kept apart
    (``Evaluation.shared_edges``) and the iteration with every consumer's boxing priced on its
    own is ``Evaluation.per_edge_iteration_time_s``: the solver's objective, which the
    planner's verification checks (grouping never prices more than that).
    """
    pricing = _Pricing(
        graph,
        plan,
        rules or rules_for_source(plan.source),
        memo or PricingMemo(),
        runtime_profile(plan.runtime),
        training or plan.training,
    )
    _price_ops(pricing, check_signatures)
    _price_edges(pricing)
    memory = _price_memory(pricing, precision)
    return _summarise(pricing, memory)


@dataclass
class _Pricing:
    """What the three pricing steps of :func:`evaluate` share and fill in."""

    graph: Graph
    plan: Plan
    rules: RuleSet
    memo: PricingMemo
    runtime: RuntimeProfile
    training: TrainingConfig
    errors: list[str] = field(default_factory=list)
    ops: list[OpCost] = field(default_factory=list)
    edges: list[EdgeCost] = field(default_factory=list)
    shared: list[EdgeCost] = field(default_factory=list)
    """Boxings the runtime shares with an earlier consumer (not in the totals)."""
    copies: list[tuple[int, float]] = field(default_factory=list)
    tensor_sbp: dict[str, NdSbp] = field(default_factory=dict)
    backward_s: float = 0.0
    forward_s: float = 0.0
    fallback_ops: list[str] = field(default_factory=list)
    fallback_types: set[str] = field(default_factory=set)
    counts: RunCounts | None = None
    kernels: Kernels = NO_KERNELS

    def __post_init__(self) -> None:
        self.counts = run_counts(self.graph, self.training, self.runtime, self.plan.zero_stage)
        self.kernels = fused_kernels(self.graph, self.runtime)


def _price_ops(p: _Pricing, check_signatures: bool) -> None:
    """Op pricing: each op's signature checked against its rule, its compute time, and its
    ZeRO parameter gathers (as :class:`EdgeCost` records with ``zero_gather``)."""
    graph, plan, mesh = p.graph, p.plan, p.plan.mesh
    assert p.counts is not None
    lowering = p.runtime.lowering.value
    for op in graph.ops:
        sig = _checked_signature(p, op)
        if sig is None:
            continue
        ctx = rule_context(
            graph, priced_op(op, p.kernels), mesh.shape, plan.zero_stage, p.runtime.zero_sharding.value
        )
        if check_signatures:
            valid_sigs, fallback = p.memo.valid_signatures(p.rules, ctx, mesh, plan.zero_stage)
            if fallback:
                p.fallback_ops.append(op.name)
                p.fallback_types.add(op.type)
            if sig not in valid_sigs:
                p.errors.append(f"op {op.name!r} ({op.type}): signature {sig} is not one its rule offers")
        t = op_compute_time(p.rules.get(op.type), ctx, sig, mesh, lowering)
        gather = optimizer_gather_plan(ctx, sig, mesh, lowering)
        if gather is not None:
            # the ZeRO parameter all-gathers count as communication on the dp axes
            times = zero_gathers_per_step(plan.zero_stage)
            t -= gather.time_s * times
            p.edges.extend([_gather_cost(graph, op, gather, p.counts.gather())] * times)
        p.ops.append(OpCost(op.name, op.type, str(sig), t, *p.counts.op(op.name)))
        if op.role is Role.BACKWARD:
            p.backward_s += t
        elif op.role is Role.FORWARD:
            p.forward_s += t
        for port, sbp in zip(op.outputs, sig.outputs):
            p.tensor_sbp[op.outputs[port]] = sbp


def _checked_signature(p: _Pricing, op: Op) -> Signature | None:
    """The plan's signature of ``op``, or None (with the error recorded) when the plan lacks
    it or it does not match the op's ports or the mesh."""
    sig = p.plan.signatures.get(op.name)
    if sig is None:
        p.errors.append(f"op {op.name!r}: no signature in the plan")
        return None
    ins, outs = p.plan.ports.get(op.name, ([], []))
    if ins != list(op.inputs) or outs != list(op.outputs):
        p.errors.append(
            f"op {op.name!r}: plan ports {ins} -> {outs} differ from the graph's "
            f"{list(op.inputs)} -> {list(op.outputs)}"
        )
        return None
    if any(len(s) != p.plan.mesh.ndim for s in (*sig.inputs, *sig.outputs)):
        p.errors.append(f"op {op.name!r}: signature {sig} does not have {p.plan.mesh.ndim} mesh axes")
        return None
    return sig


def _gather_cost(graph: Graph, op: Op, gather: BoxingPlan, runs: tuple[int, int]) -> EdgeCost:
    """The record of one ZeRO parameter gather of optimizer op ``op``, in the dtype it moves
    (:func:`autopar.cost.zero_gathers.zero_gather_dtype`)."""
    model_index = model_port_index(op)
    assert model_index is not None  # a gather needs the parameter port
    model_port = list(op.inputs)[model_index]
    tensor = op.inputs[model_port]
    spec = graph.tensors[tensor]
    return EdgeCost(
        op.name,
        op.name,
        model_port,
        tensor,
        tuple(spec.shape),
        zero_gather_dtype(graph, op) or spec.dtype,  # the forward's copy (optimizer_gather_plan)
        gather.src,
        gather.dst,
        tuple(gather.steps),
        gather.time_s,
        zero_gather=True,
        per_micro_batch=runs[0],
        per_step=runs[1],
    )


def _price_edges(p: _Pricing) -> None:
    """Edge pricing: every producer -> consumer port whose layouts differ, priced by
    :func:`autopar.cost.edges.edge_time`, with the boxed copy each consumer receives; a boxing
    the runtime shares with an earlier consumer is recorded in ``p.shared`` (see
    :func:`evaluate`)."""
    graph, plan, mesh = p.graph, p.plan, p.plan.mesh
    assert p.counts is not None
    order_pos = {op.name: i for i, op in enumerate(graph.topological_order)}
    gradients = weight_gradient_path(graph)
    boxed: set[tuple[str, NdSbp]] = set()
    linear_of = _fused_linear_parts(p)
    reduced: set[tuple[str, int, NdSbp, NdSbp]] = set()
    for op in graph.ops:
        sig = plan.signatures.get(op.name)
        if sig is None or op.name not in plan.ports or plan.ports[op.name][0] != list(op.inputs):
            continue
        for port, dst in zip(op.inputs, sig.inputs):
            tensor = op.inputs[port]
            src = p.tensor_sbp.get(tensor)
            if src is None or src == dst:
                continue
            fused = p.kernels.same_kernel(graph.producer[tensor][0], op.name)
            kind = edge_kind(op, port, tensor in gradients, p.runtime.lowering.value, fused)
            if kind is EdgeKind.SHAPE_ONLY:
                continue
            if kind is EdgeKind.IN_PLACE:
                p.errors.append(
                    f"op {op.name!r} port {port!r} updates {tensor!r} in place: it must take the "
                    f"producer's layout {src}, not {dst}"
                )
                continue
            if kind is EdgeKind.FUSED:  # inside one kernel nothing moves: the layouts must agree
                if not same_layout(src, dst, mesh.shape):
                    p.errors.append(
                        f"op {op.name!r} port {port!r} reads {tensor!r} inside one fused kernel "
                        f"({p.kernels.instance[op.name]}): it must take the producer's layout {src}, "
                        f"not {dst}"
                    )
                continue
            spec = graph.tensors[tensor]
            p.copies.append(
                (order_pos[op.name], boxed_copy_bytes(spec.numel, spec.dtype, dst, mesh.shape, spec.shape))
            )
            placed = placed_layout(dst, mesh.shape)  # one boxing per layout as the devices hold it
            shared = p.runtime.groups_fan_out and (tensor, placed) in boxed
            boxed.add((tensor, placed))
            linear = linear_of.get(graph.producer[tensor][0]) if op.type in FUSED_GRADIENT_SUMS else None
            if linear is not None and not shared:
                shared = (op.name, linear, src, dst) in reduced  # reduced with its linear's other parts
                reduced.add((op.name, linear, src, dst))
            record = _edge_cost(p, op, port, tensor, src, dst, kind)
            if record is not None:
                (p.shared if shared else p.edges).append(record)


def _edge_cost(
    p: _Pricing, op: Op, port: str, tensor: str, src: NdSbp, dst: NdSbp, kind: EdgeKind
) -> EdgeCost | None:
    """The record of one boxed edge into ``op``'s ``port``; None (with the error recorded) when
    ``src`` cannot be boxed into ``dst``."""
    graph, mesh = p.graph, p.plan.mesh
    assert p.counts is not None
    spec = graph.tensors[tensor]
    producer = graph.producer[tensor][0]
    t_edge, bp = edge_time(spec, src, dst, mesh, kind, p.runtime)
    if bp is None or not math.isfinite(t_edge):
        p.errors.append(
            f"edge {producer!r} -> {op.name!r} port {port!r}: "
            f"cannot box {src} into {dst} for shape {list(spec.shape)}"
        )
        return None
    gradient = kind is EdgeKind.GRADIENT
    runs = p.counts.edge(producer, op.name, gradient)
    # the plan's steps carry the unbucketed time; a bucketed gradient edge
    # spreads its saving over its steps in proportion
    scale = t_edge / bp.time_s if bp.time_s > 0 else 0.0
    return EdgeCost(
        producer,
        op.name,
        port,
        tensor,
        tuple(spec.shape),
        spec.dtype,
        src,
        dst,
        tuple(dataclasses.replace(step, time_s=step.time_s * scale) for step in bp.steps),
        t_edge,
        gradient=gradient,
        per_micro_batch=runs[0],
        per_step=runs[1],
    )


FUSED_GRADIENT_SUMS = frozenset({"add_n", "add"})
"""Sum ops whose inputs a runtime that fuses sibling linears reduces per linear
(:func:`_fused_linear_parts`)."""


def _fused_linear_parts(p: _Pricing) -> dict[str, int]:
    """Under a runtime that fuses sibling linears (:attr:`RuntimeProfile.fuses_sibling_linears`):
    backward matmul op -> the linear whose input gradient it computes a part of
    (:func:`autopar.runtimes.megatron_lm.linears.megatron_input_gradient_linears`); else empty.

    Such a runtime computes the parts in one GEMM, so the parts' reductions into one sum
    op (``(S(0), P) -> (S(0), B)`` of a cross-attention's ``k`` and ``v`` input gradients,
    both added to the encoder output's gradient) are one collective: priced once, on the
    first part's edge.  A sum of one part each of several linears still reduces each
    linear once: Megatron-LM all-reduces every linear's input gradient."""
    if not p.runtime.fuses_sibling_linears:
        return {}
    return megatron_input_gradient_linears(p.graph, p.plan.mesh)


@dataclass(frozen=True)
class _Memory:
    breakdown: MemoryBreakdown
    profile: list[float]
    peak_position: int
    accumulation_bytes: float


def _price_memory(p: _Pricing, precision: Precision | None) -> _Memory:
    """Memory: model states (ZeRO stage, with the accumulation buffer of
    :func:`autopar.cost.activation_spans.accumulation_buffer_bytes`) + the activation peak along the
    topological order (checkpointing's spans, boxed copies, ZeRO-3's gathered parameters)."""
    graph, plan, mesh = p.graph, p.plan, p.plan.mesh
    params = grads = opt = acc = 0.0
    variable_sbp: dict[str, NdSbp] = {}
    for v in graph.variables:
        var_sbp = p.tensor_sbp.get(v.tensor)
        if var_sbp is None:
            continue
        variable_sbp[v.op] = var_sbp
        states = precision.state_bytes if precision is not None else graph_state_bytes(graph, v)
        shape, sharding = graph.tensors[v.tensor].shape, p.runtime.zero_sharding.value
        got = variable_state_bytes(shape, var_sbp, mesh.shape, plan.zero_stage, states, sharding)
        buffer = accumulation_buffer_bytes(
            shape, var_sbp, mesh.shape, plan.zero_stage, states, sharding, p.training, p.runtime
        )
        params += got[0]
        grads += got[1] + buffer
        opt += got[2]
        acc += buffer
    profile: list[float] = []
    if len(p.tensor_sbp) == len(graph.tensors):
        working = precision is Precision.MIXED
        profile = activation_profile(
            graph,
            p.tensor_sbp,
            mesh.shape,
            consumer_copies=p.copies,
            working_copy_is_state=working,
            spans=activation_spans(graph, p.training, working, p.kernels.internal),
        )
    peak_position = max(range(len(profile)), key=profile.__getitem__) if profile else 0
    gathered = zero3_gather_buffer_bytes(graph, variable_sbp, mesh.shape) if plan.zero_stage >= 3 else 0.0
    profile = [a + gathered for a in profile]
    activations = max(profile) if profile else gathered
    return _Memory(MemoryBreakdown(params, grads, opt, activations), profile, peak_position, acc)


def _summarise(p: _Pricing, memory: _Memory) -> Evaluation:
    """Totals of the records: the step (one micro-batch per step, as priced before
    iterations), the iteration (``K x micro-batch + once-per-step``) and communication per
    axis and per collective."""
    ops, edges, k = p.ops, p.edges, p.training.micro_batches
    compute = sum(o.compute_s for o in ops)
    comm_axis: dict[int, float] = defaultdict(float)
    bytes_axis: dict[int, float] = defaultdict(float)
    comm_kind: dict[str, float] = defaultdict(float)
    for e in edges:
        for step in e.steps:
            comm_axis[step.axis] += step.time_s
            bytes_axis[step.axis] += step.bytes_per_device
            comm_kind[step.collective.value] += step.time_s
    grad_comm = sum(e.time_s for e in edges if e.gradient)
    comm = sum(comm_axis.values())
    serial = compute + comm
    overlap = min(grad_comm, p.backward_s)
    records: list[OpCost | EdgeCost] = [*ops, *edges]
    micro = sum(r.cost_s * r.per_micro_batch for r in records)
    once = sum(r.cost_s * r.per_step for r in records)
    iteration = serial if p.training.is_default else k * micro + once
    shared = sum(e.cost_s * (e.per_micro_batch * k + e.per_step) for e in p.shared)
    shared_step = sum(e.cost_s for e in p.shared)
    # bucketed gradient reduction hides behind the backward of the micro-batch it follows:
    # the last one when it runs once per step, each one when it runs every micro-batch
    reductions = k if p.counts is not None and p.counts.gradient_per_micro_batch else 1
    hidden = _hidden_by_runtime(p, grad_comm, reductions)
    return Evaluation(
        valid=not p.errors,
        errors=p.errors,
        step_time_s=serial,
        step_time_overlapped_s=serial - overlap,
        grad_comm_time_s=grad_comm,
        backward_compute_time_s=p.backward_s,
        runtime=p.runtime.name,
        activation_peak_position=memory.peak_position,
        compute_time_s=compute,
        comm_time_s=comm,
        comm_time_s_per_axis={a: comm_axis.get(a, 0.0) for a in range(p.plan.mesh.ndim)},
        comm_bytes_per_axis={a: bytes_axis.get(a, 0.0) for a in range(p.plan.mesh.ndim)},
        comm_time_s_per_collective=dict(comm_kind),
        memory=memory.breakdown,
        fallback_ops=p.fallback_ops,
        fallback_op_types=sorted(p.fallback_types),
        boxed_edges=sum(1 for e in edges if not e.zero_gather),
        ops=ops,
        edges=edges,
        activation_profile=memory.profile,
        training=p.training,
        iteration_time_s=iteration,
        iteration_time_overlapped_s=iteration - reductions * overlap,
        micro_batch_time_s=micro,
        once_per_step_time_s=once,
        recompute_time_s=sum(r.cost_s for r in records if r.per_micro_batch > 1) * k,
        accumulation_bytes=memory.accumulation_bytes,
        shared_edges=p.shared,
        forward_compute_time_s=p.forward_s,
        hidden_comm_time_s=hidden,
        achieved_iteration_time_s=iteration - hidden,
        per_edge_iteration_time_s=(serial + shared_step) if p.training.is_default else iteration + shared,
    )


def _hidden_by_runtime(p: _Pricing, grad_comm: float, reductions: int) -> float:
    """Seconds of communication per optimizer step the plan's runtime hides behind compute:
    the gradient reduction behind the backward of the micro-batch it follows
    (:attr:`~autopar.runtimes.profile.RuntimeProfile.overlap_grad_comm`, at most that
    backward's compute) and the parameter gather behind the forward it feeds
    (:attr:`~autopar.runtimes.profile.RuntimeProfile.overlap_param_gather`: the
    once-per-step gather behind the first forward, a gather every micro-batch behind its
    own; each forward hides at most its compute).  Units: seconds."""
    hidden = 0.0
    if p.runtime.overlap_grad_comm:
        hidden += reductions * min(grad_comm, p.backward_s)
    if p.runtime.overlap_param_gather:
        once = sum(e.time_s * e.per_step for e in p.edges if e.zero_gather)
        # a gather every micro-batch (ZeRO-3: Megatron-FSDP prefetches the next layer's
        # parameters) hides behind that micro-batch's forward, the first one's with the
        # once-per-step gather
        every = sum(e.time_s * e.per_micro_batch for e in p.edges if e.zero_gather)
        k = p.training.micro_batches
        hidden += min(once + every, p.forward_s) + (k - 1) * min(every, p.forward_s)
    return hidden


def attach_evaluation(plan: Plan, ev: Evaluation) -> Plan:
    """Fill ``plan.predicted``, ``plan.memory`` and ``plan.diagnostics`` from ``ev``."""
    d = ev.to_dict()
    plan.predicted = {
        "step_time_s": ev.step_time_s,
        "step_time_overlapped_s": ev.step_time_overlapped_s,
        "grad_comm_time_s": ev.grad_comm_time_s,
        "backward_compute_time_s": ev.backward_compute_time_s,
        "runtime": ev.runtime,
        "compute_time_s": ev.compute_time_s,
        "comm_time_s": ev.comm_time_s,
        "comm_time_s_per_axis": d["comm_time_s_per_axis"],
        "comm_bytes_per_axis": d["comm_bytes_per_axis"],
        "comm_time_s_per_collective": d["comm_time_s_per_collective"],
        "micro_batches": ev.training.micro_batches,
        "checkpointing": ev.training.checkpointing,
        "iteration_time_s": ev.iteration_time_s,
        "iteration_time_overlapped_s": ev.iteration_time_overlapped_s,
        "achieved_iteration_time_s": ev.achieved_iteration_time_s,
        "hidden_comm_time_s": ev.hidden_comm_time_s,
        "micro_batch_time_s": ev.micro_batch_time_s,
        "once_per_step_time_s": ev.once_per_step_time_s,
        "recompute_time_s": ev.recompute_time_s,
    }
    plan.memory = {
        "per_device_bytes": ev.memory.total,
        **d["memory"],
        "budget_bytes": plan.memory_budget_bytes,
        "fits": plan.memory_budget_bytes is None or ev.memory.total <= plan.memory_budget_bytes,
    }
    plan.diagnostics = {
        **plan.diagnostics,
        "fallback_ops": ev.fallback_ops,
        "fallback_op_types": ev.fallback_op_types,
        "boxed_edges": ev.boxed_edges,
        "valid": ev.valid,
    }
    if not math.isfinite(ev.step_time_s):
        plan.diagnostics["errors"] = ev.errors[:20]
    return plan
