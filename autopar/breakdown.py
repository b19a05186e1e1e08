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

import math
from dataclasses import dataclass, field

from autopar.boxing import BoxingStep, boxing_plan
from autopar.costs import EdgeKind, edge_kind, op_compute_time, optimizer_gather_plan, rule_context
from autopar.graph import DTYPE_BYTES, Graph
from autopar.memory import MIXED_PRECISION_ADAM, StateBytes, activation_profile, variable_state_bytes
from autopar.plan import Plan
from autopar.rules.registry import RuleSet, default_rules
from autopar.sbp import NdSbp

__all__ = [
    "EdgeCost",
    "MemoryTimeline",
    "OpCost",
    "PlanBreakdown",
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
    -> ``decoder.layers.1``); else the first two components of a name with three or
    more (``encoder.final_norm.weight.cast`` -> ``encoder.final_norm``), the first of
    a two-component name (``embedding.word`` -> ``embedding``), and ``(top level)``
    for a name without dots.
    """
    parts = op_name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    if len(parts) == 1:
        return TOP_LEVEL
    return ".".join(parts[: 2 if len(parts) > 2 else 1])


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
    def peak(self) -> float:
        return self.model_states + (max(self.activations) if self.activations else 0.0)

    @property
    def peak_position(self) -> int:
        if not self.activations:
            return 0
        return max(range(len(self.activations)), key=self.activations.__getitem__)


@dataclass
class PlanBreakdown:
    """Per-op compute, per-edge communication and their per-layer sums."""

    ops: list[OpCost]
    edges: list[EdgeCost]
    layer_compute_s: dict[str, float] = field(default_factory=dict)
    layer_comm_s: dict[str, float] = field(default_factory=dict)
    comm_s: dict[tuple[str, int], float] = field(default_factory=dict)
    """(collective, mesh axis) -> seconds."""
    comm_bytes: dict[tuple[str, int], float] = field(default_factory=dict)
    """(collective, mesh axis) -> bytes sent per device."""

    def most_expensive_edges(self, n: int = 10) -> list[EdgeCost]:
        """The ``n`` costliest edges, most expensive first (ties by consumer name)."""
        return sorted(self.edges, key=lambda e: (-e.time_s, e.consumer, e.port))[:n]


def breakdown(graph: Graph, plan: Plan, *, rules: RuleSet | None = None) -> PlanBreakdown:
    """Price every op and every boxed edge of ``plan`` on ``graph`` (ops the plan lacks are skipped).

    Mirrors :func:`autopar.evaluate.evaluate`: an op's compute time is
    :func:`op_compute_time` less its ZeRO gather, which becomes an
    :class:`EdgeCost` with ``zero_gather=True``; an input edge is boxed when the
    producer's output SBP differs from the consumer's input SBP and the port is
    a data edge (:func:`edge_kind`).
    """
    rules = rules or default_rules()
    mesh = plan.mesh
    ops: list[OpCost] = []
    edges: list[EdgeCost] = []
    tensor_sbp: dict[str, NdSbp] = {}
    for op in graph.ops:
        sig = plan.signatures.get(op.name)
        ports = plan.ports.get(op.name)
        if sig is None or ports is None or ports != (list(op.inputs), list(op.outputs)):
            continue
        ctx = rule_context(graph, op, mesh.shape, plan.zero_stage)
        t = op_compute_time(rules.get(op.type), ctx, sig, mesh)
        gather = optimizer_gather_plan(ctx, sig, mesh)
        if gather is not None:
            t -= gather.time_s
            model_port = next(
                p for p in op.inputs if p.startswith("model_") and not p.startswith("model_diff")
            )
            tensor = op.inputs[model_port]
            spec = graph.tensors[tensor]
            edges.append(
                EdgeCost(
                    op.name,
                    op.name,
                    model_port,
                    tensor,
                    tuple(spec.shape),
                    spec.dtype,
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
            if src is None or src == dst or edge_kind(op, port) is not EdgeKind.BOXING:
                continue
            spec = graph.tensors[tensor]
            bp = boxing_plan(spec.shape, DTYPE_BYTES[spec.dtype], src, dst, mesh)
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
                    bp.steps,
                    bp.time_s,
                )
            )

    result = PlanBreakdown(ops, edges)
    for oc in ops:
        result.layer_compute_s[oc.layer] = result.layer_compute_s.get(oc.layer, 0.0) + oc.compute_s
    for e in edges:
        layer = layer_of(e.consumer)
        result.layer_comm_s[layer] = result.layer_comm_s.get(layer, 0.0) + e.time_s
        if not math.isfinite(e.time_s):
            continue
        for s in e.steps:
            key = (s.collective.value, s.axis)
            result.comm_s[key] = result.comm_s.get(key, 0.0) + s.time_s
            result.comm_bytes[key] = result.comm_bytes.get(key, 0.0) + s.bytes_per_device
    return result


def memory_timeline(graph: Graph, plan: Plan, states: StateBytes = MIXED_PRECISION_ADAM) -> MemoryTimeline:
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
        sbp = tensor_sbp.get(v.tensor)
        if sbp is None:
            continue
        p, g, o = variable_state_bytes(
            graph.tensors[v.tensor].shape, sbp, plan.mesh.shape, plan.zero_stage, states
        )
        params += p
        grads += g
        opt += o
    activations: list[float] = []
    if len(tensor_sbp) == len(graph.tensors):
        activations = activation_profile(graph, tensor_sbp, plan.mesh.shape)
    return MemoryTimeline(params, grads, opt, activations)
