"""Where a plan's time and memory go: per op, per boxing edge, per layer, over the step.

The evaluator (:mod:`autopar.evaluate`) sums a plan's costs; this module keeps
them apart so a report can show *which* ops and edges cost what.  It prices
with the same pure functions the evaluator uses (:func:`autopar.costs.op_compute_time`,
:func:`autopar.costs.optimizer_gather_plan`, :func:`autopar.boxing.boxing_plan`,
:func:`autopar.memory.activation_profile`), so the parts add up to the
evaluator's totals:

* sum of :attr:`OpCost.compute_s` = ``Evaluation.compute_time_s``;
* sum of edge and gather step times = ``Evaluation.comm_time_s``;
* model states + max of the activation timeline = ``Evaluation.memory.total``.

Layers are module scopes read from op names (``encoder.layers.3.mlp.wi_0.matmul``
belongs to ``encoder.layers.3``): see :func:`layer_of`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from autopar.boxing import BoxingStep
from autopar.cluster import Mesh
from autopar.costs import (
    EdgeKind,
    edge_kind,
    edge_time,
    op_compute_time,
    op_signatures,
    optimizer_gather_plan,
    rule_context,
    zero_gathers_per_step,
)
from autopar.graph import Graph
from autopar.memory import (
    activation_profile,
    boxed_copy_bytes,
    graph_state_bytes,
    variable_state_bytes,
    zero3_gather_buffer_bytes,
)
from autopar.optimizer import model_port_index, weight_gradient_path
from autopar.plan import Plan
from autopar.rules.registry import RuleContext, RuleSet, default_rules
from autopar.runtime import runtime_profile
from autopar.sbp import NdSbp, Signature

__all__ = [
    "EdgeCost",
    "MemoryTimeline",
    "OpCost",
    "PlanBreakdown",
    "PricingMemo",
    "breakdown",
    "layer_of",
    "memory_timeline",
    "module_of",
]

TOP_LEVEL = "(top level)"
"""Layer of ops whose name has no dot (graph inputs such as ``input_ids``)."""


def layer_of(op_name: str) -> str:
    """The layer (module scope) of an op, from its dotted name.

    Up to the first numeric component when there is one (``decoder.layers.1.mlp.wo``
    -> ``decoder.layers.1``); else the first component (``encoder.final_norm.weight.cast``
    -> ``encoder``, ``shared.weight`` -> ``shared``); ``(top level)`` for a name
    without dots (graph inputs such as ``input_ids``).
    """
    parts = op_name.split(".")
    if len(parts) == 1:
        return TOP_LEVEL
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]


def module_of(variable_op: str) -> str:
    """The module that owns a variable: its name without the last component (``...q.weight`` -> ``...q``)."""
    return variable_op.rsplit(".", 1)[0] if "." in variable_op else variable_op


@dataclass(frozen=True)
class EdgeCost:
    """One producer -> consumer edge that needs boxing (or the ZeRO gather inside an optimizer op)."""

    producer: str
    consumer: str
    port: str
    tensor: str
    shape: tuple[int, ...]
    dtype: str
    src: NdSbp
    dst: NdSbp
    steps: tuple[BoxingStep, ...]
    time_s: float
    """Seconds: sum of the steps' ring-collective times (``inf`` when the move is impossible)."""
    zero_gather: bool = False
    """True for the ZeRO parameter all-gather of an optimizer op (not a graph edge)."""

    @property
    def bytes_per_device(self) -> float:
        return sum(s.bytes_per_device for s in self.steps)

    @property
    def collectives(self) -> str:
        """``all-reduce@1, all-gather@0``: the steps' collectives and mesh axes."""
        return ", ".join(f"{s.collective.value}@{s.axis}" for s in self.steps) or "local"


@dataclass(frozen=True)
class OpCost:
    """One op's chosen signature and its compute time (the ZeRO gather counts as communication)."""

    name: str
    type: str
    layer: str
    signature: str
    compute_s: float


@dataclass(frozen=True)
class MemoryTimeline:
    """Per-device bytes at each position of the topological order.

    Model states are held for the whole step (the memory model of
    :mod:`autopar.memory`); activations vary with liveness.
    """

    params: float
    grads: float
    optimizer: float
    activations: list[float]

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def activation_peak(self) -> float:
        return max(self.activations) if self.activations else 0.0

    @property
    def peak(self) -> float:
        return self.model_states + (max(self.activations) if self.activations else 0.0)

    @property
    def peak_position(self) -> int:
        if not self.activations:
            return 0
        return max(range(len(self.activations)), key=self.activations.__getitem__)


@dataclass
class PlanBreakdown:
    """Per-op compute, per-edge communication, their per-layer sums, and what is invalid."""

    ops: list[OpCost]
    edges: list[EdgeCost]
    errors: list[str] = field(default_factory=list)
    """What the evaluator would reject: missing ops, signatures no rule offers, impossible boxing."""
    fallback_ops: list[str] = field(default_factory=list)
    """Ops with no rule (priced all-``B``)."""
    layer_compute_s: dict[str, float] = field(default_factory=dict)
    layer_comm_s: dict[str, float] = field(default_factory=dict)
    comm_s: dict[tuple[str, int], float] = field(default_factory=dict)
    """(collective, mesh axis) -> seconds."""
    comm_bytes: dict[tuple[str, int], float] = field(default_factory=dict)
    """(collective, mesh axis) -> bytes sent per device."""

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def compute_time_s(self) -> float:
        return sum(o.compute_s for o in self.ops)

    @property
    def comm_time_s(self) -> float:
        return sum(e.time_s for e in self.edges)

    @property
    def boxed_edges(self) -> int:
        return sum(1 for e in self.edges if not e.zero_gather and math.isfinite(e.time_s))

    def comm_time_s_per_axis(self, ndim: int) -> dict[int, float]:
        return {a: sum(t for (_, ax), t in self.comm_s.items() if ax == a) for a in range(ndim)}

    def comm_bytes_per_axis(self, ndim: int) -> dict[int, float]:
        return {a: sum(b for (_, ax), b in self.comm_bytes.items() if ax == a) for a in range(ndim)}

    def most_expensive_edges(self, n: int = 10) -> list[EdgeCost]:
        """The ``n`` costliest edges, most expensive first (ties by consumer name)."""
        return sorted(self.edges, key=lambda e: (-e.time_s, e.consumer, e.port))[:n]


class PricingMemo:
    """What plans of one graph on one mesh share: boxing searches per tensor shape, valid signatures.

    Pass the same memo to :func:`breakdown` for several plans of one graph (a
    report comparing plans) to price each distinct shape's boxing once.
    """

    def __init__(self) -> None:
        self.signatures: dict[tuple[str, str, int], tuple[frozenset[Signature], bool]] = {}

    def valid_signatures(
        self, rules: RuleSet, ctx: RuleContext, mesh: Mesh, zero_stage: int
    ) -> tuple[frozenset[Signature], bool]:
        key = (mesh.key(), ctx.op.name, zero_stage)
        found = self.signatures.get(key)
        if found is None:
            sigs, fallback = op_signatures(rules, ctx)
            found = self.signatures[key] = (frozenset(sigs), fallback)
        return found


def breakdown(
    graph: Graph,
    plan: Plan,
    *,
    rules: RuleSet | None = None,
    memo: PricingMemo | None = None,
    check_signatures: bool = True,
) -> PlanBreakdown:
    """Price every op and every boxed edge of ``plan`` on ``graph``, and collect what is invalid.

    Mirrors :func:`autopar.evaluate.evaluate`: an op's compute time is
    :func:`op_compute_time` less its ZeRO gather, which becomes an
    :class:`EdgeCost` with ``zero_gather=True``; an input edge is boxed when the
    producer's output SBP differs from the consumer's input SBP and the port is
    a data edge (:func:`edge_kind`); an in-place port must keep the producer's
    layout.  Ops the plan lacks are reported in ``errors`` and skipped.
    """
    rules = rules or default_rules()
    memo = memo or PricingMemo()
    mesh = plan.mesh
    runtime = runtime_profile(plan.runtime)
    lowering = runtime.lowering.value
    gradients = weight_gradient_path(graph)
    ops: list[OpCost] = []
    edges: list[EdgeCost] = []
    errors: list[str] = []
    fallback_ops: list[str] = []
    tensor_sbp: dict[str, NdSbp] = {}
    for op in graph.ops:
        sig = plan.signatures.get(op.name)
        ports = plan.ports.get(op.name)
        if sig is None or ports is None:
            errors.append(f"op {op.name!r}: no signature in the plan")
            continue
        if ports != (list(op.inputs), list(op.outputs)):
            errors.append(f"op {op.name!r}: plan ports {ports} differ from the graph's")
            continue
        if any(len(x) != mesh.ndim for x in (*sig.inputs, *sig.outputs)):
            errors.append(f"op {op.name!r}: signature {sig} does not have {mesh.ndim} mesh axes")
            continue
        ctx = rule_context(graph, op, mesh.shape, plan.zero_stage)
        if check_signatures:
            valid_sigs, fallback = memo.valid_signatures(rules, ctx, mesh, plan.zero_stage)
            if fallback:
                fallback_ops.append(op.name)
            if sig not in valid_sigs:
                errors.append(f"op {op.name!r} ({op.type}): signature {sig} is not one its rule offers")
        t = op_compute_time(rules.get(op.type), ctx, sig, mesh, lowering)
        gather = optimizer_gather_plan(ctx, sig, mesh, lowering)
        if gather is not None:
            times = zero_gathers_per_step(plan.zero_stage)
            t -= gather.time_s * times
            model_index = model_port_index(op)
            assert model_index is not None  # a gather needs the parameter port
            model_port = list(op.inputs)[model_index]
            tensor = op.inputs[model_port]
            spec = graph.tensors[tensor]
            for _ in range(times):  # ZeRO-3 gathers before forward and again before backward
                edges.append(
                    EdgeCost(
                        op.name,
                        op.name,
                        model_port,
                        tensor,
                        tuple(spec.shape),
                        spec.dtype,  # the parameter, in its own dtype (optimizer_gather_plan)
                        gather.src,
                        gather.dst,
                        gather.steps,
                        gather.time_s,
                        zero_gather=True,
                    )
                )
        ops.append(OpCost(op.name, op.type, layer_of(op.name), str(sig), t))
        for port, sbp in zip(ports[1], sig.outputs):
            tensor_sbp[op.outputs[port]] = sbp

    for op in graph.ops:
        sig = plan.signatures.get(op.name)
        ports = plan.ports.get(op.name)
        if sig is None or ports is None or ports[0] != list(op.inputs):
            continue
        for port, dst in zip(ports[0], sig.inputs):
            tensor = op.inputs[port]
            src = tensor_sbp.get(tensor)
            if src is None or src == dst:
                continue
            kind = edge_kind(op, port, tensor in gradients)
            if kind is EdgeKind.SHAPE_ONLY:
                continue
            if kind is EdgeKind.IN_PLACE:
                errors.append(f"op {op.name!r} port {port!r} updates {tensor!r} in place: it must take {src}")
                continue
            spec = graph.tensors[tensor]
            t_edge, bp = edge_time(spec, src, dst, mesh, kind, runtime)
            if bp is None or not math.isfinite(t_edge):
                errors.append(f"edge into {op.name!r} port {port!r}: cannot box {src} into {dst}")
                continue
            # a bucketed gradient edge spreads its saving over its steps, as the evaluator does
            scale = t_edge / bp.time_s if bp.time_s > 0 else 0.0
            edges.append(
                EdgeCost(
                    graph.producer[tensor][0],
                    op.name,
                    port,
                    tensor,
                    tuple(spec.shape),
                    spec.dtype,
                    src,
                    dst,
                    tuple(dataclasses.replace(step, time_s=step.time_s * scale) for step in bp.steps),
                    t_edge,
                )
            )

    result = PlanBreakdown(ops, edges, errors, fallback_ops)
    for oc in ops:
        result.layer_compute_s[oc.layer] = result.layer_compute_s.get(oc.layer, 0.0) + oc.compute_s
    for e in edges:
        layer = layer_of(e.consumer)
        result.layer_comm_s[layer] = result.layer_comm_s.get(layer, 0.0) + e.time_s
        for s in e.steps:
            key = (s.collective.value, s.axis)
            result.comm_s[key] = result.comm_s.get(key, 0.0) + s.time_s
            result.comm_bytes[key] = result.comm_bytes.get(key, 0.0) + s.bytes_per_device
    return result


def memory_timeline(graph: Graph, plan: Plan) -> MemoryTimeline:
    """Model states per device and live activation bytes per position of the topological order.

    Model states: :func:`autopar.memory.variable_state_bytes` of each variable
    under its planned SBP and the plan's ZeRO stage.  Activations:
    :func:`autopar.memory.activation_profile` (bytes / split factor, live from
    producer to last consumer).  Empty activations when the plan lacks ops.
    """
    tensor_sbp: dict[str, NdSbp] = {}
    for op in graph.ops:
        sig = plan.signatures.get(op.name)
        ports = plan.ports.get(op.name)
        if sig is None or ports is None or ports[1] != list(op.outputs):
            continue
        for port, sbp in zip(ports[1], sig.outputs):
            tensor_sbp[op.outputs[port]] = sbp
    params = grads = opt = 0.0
    for v in graph.variables:
        var_sbp = tensor_sbp.get(v.tensor)
        if var_sbp is None:
            continue
        p, g, o = variable_state_bytes(
            graph.tensors[v.tensor].shape,
            var_sbp,
            plan.mesh.shape,
            plan.zero_stage,
            graph_state_bytes(graph, v),
        )
        params += p
        grads += g
        opt += o
    activations: list[float] = []
    if len(tensor_sbp) == len(graph.tensors):
        # boxed input copies live at their consumers, as the evaluator counts them
        pos = {op.name: i for i, op in enumerate(graph.topological_order)}
        gradients = weight_gradient_path(graph)
        copies = []
        for op in graph.ops:
            sig = plan.signatures.get(op.name)
            if sig is None:
                continue
            for port, dst in zip(op.inputs, sig.inputs):
                tensor = op.inputs[port]
                src = tensor_sbp.get(tensor)
                kind = edge_kind(op, port, tensor in gradients)
                if src is None or src == dst or kind in (EdgeKind.SHAPE_ONLY, EdgeKind.IN_PLACE):
                    continue
                spec = graph.tensors[tensor]
                copies.append((pos[op.name], boxed_copy_bytes(spec.numel, spec.dtype, dst, plan.mesh.shape)))
        activations = activation_profile(graph, tensor_sbp, plan.mesh.shape, consumer_copies=copies)
        if plan.zero_stage >= 3:
            variable_sbp = {v.op: tensor_sbp[v.tensor] for v in graph.variables if v.tensor in tensor_sbp}
            extra = zero3_gather_buffer_bytes(graph, variable_sbp, plan.mesh.shape)
            activations = [a + extra for a in activations]
    return MemoryTimeline(params, grads, opt, activations)
