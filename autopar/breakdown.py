"""Where a plan's time and memory go: per op, per boxing edge, per layer, over the step.

The evaluator (:func:`autopar.evaluate.evaluate`) prices a plan once and keeps
every price as a record (:class:`~autopar.evaluate.OpCost`,
:class:`~autopar.evaluate.EdgeCost`, the activation profile); this module groups
those records for a report, so the parts are the evaluator's own:

* sum of :attr:`OpCost.compute_s` = ``Evaluation.compute_time_s``;
* sum of edge and gather step times = ``Evaluation.comm_time_s``;
* model states + max of the activation timeline = ``Evaluation.memory.total``.

Layers are module scopes read from op names (``encoder.layers.3.mlp.wi_0.matmul``
belongs to ``encoder.layers.3``): see :func:`layer_of`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autopar.evaluate import EdgeCost, Evaluation, OpCost, PricingMemo, evaluate
from autopar.graph import Graph
from autopar.plan import Plan
from autopar.rules.registry import RuleSet

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


def breakdown(
    graph: Graph,
    plan: Plan,
    *,
    rules: RuleSet | None = None,
    memo: PricingMemo | None = None,
    check_signatures: bool = True,
    evaluation: Evaluation | None = None,
) -> PlanBreakdown:
    """Group the evaluator's per-op and per-edge records of ``plan`` per layer and per collective.

    ``evaluation``: the plan's :func:`autopar.evaluate.evaluate` result, when
    the caller has it (else it is computed with ``rules``, ``memo`` and
    ``check_signatures``).  Ops the plan lacks are reported in ``errors``.
    """
    ev = evaluation or evaluate(graph, plan, rules=rules, memo=memo, check_signatures=check_signatures)
    result = PlanBreakdown(list(ev.ops), list(ev.edges), list(ev.errors), list(ev.fallback_ops))
    for oc in result.ops:
        layer = layer_of(oc.name)
        result.layer_compute_s[layer] = result.layer_compute_s.get(layer, 0.0) + oc.compute_s
    for e in result.edges:
        layer = layer_of(e.consumer)
        result.layer_comm_s[layer] = result.layer_comm_s.get(layer, 0.0) + e.time_s
        for s in e.steps:
            key = (s.collective.value, s.axis)
            result.comm_s[key] = result.comm_s.get(key, 0.0) + s.time_s
            result.comm_bytes[key] = result.comm_bytes.get(key, 0.0) + s.bytes_per_device
    return result


def memory_timeline(graph: Graph, plan: Plan, *, evaluation: Evaluation | None = None) -> MemoryTimeline:
    """Model states per device and live activation bytes per position of the topological order.

    Both are the evaluator's (:attr:`Evaluation.memory`,
    :attr:`Evaluation.activation_profile`): model states from each variable's
    planned SBP and the ZeRO stage; activations live from producer to last
    consumer, with boxed copies at their consumers and ZeRO-3's gathered
    parameters.  Empty activations when the plan lacks ops.
    """
    ev = evaluation or evaluate(graph, plan, check_signatures=False)
    return MemoryTimeline(ev.memory.params, ev.memory.grads, ev.memory.optimizer, list(ev.activation_profile))
