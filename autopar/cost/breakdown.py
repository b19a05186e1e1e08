"""Where a plan's time and memory go: per op, per boxing edge, per layer, over the step.

The evaluator (:func:`autopar.cost.evaluate.evaluate`) prices a plan once and keeps
every price as a record (:class:`~autopar.cost.evaluation.OpCost`,
:class:`~autopar.cost.evaluation.EdgeCost`, the activation profile); this module groups
those records for a report, so the parts are the evaluator's own:

* sum of :attr:`OpCost.compute_s` = ``Evaluation.compute_time_s``;
* sum of edge and gather step times = ``Evaluation.comm_time_s``;
* model states + max of the activation timeline = ``Evaluation.memory.total``.

One micro-batch (:func:`micro_batch_time`) is the part of a step that runs once
per micro-batch under gradient accumulation: what a profiler's per-iteration
trace shows.

Layers are module scopes read from op names (``encoder.layers.3.mlp.wi_0.matmul``
belongs to ``encoder.layers.3``): see :func:`layer_of`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from autopar.cost.evaluate import evaluate
from autopar.cost.evaluation import EdgeCost, Evaluation, OpCost, PricingMemo
from autopar.ir.blocks import TOP_LEVEL as TOP_LEVEL
from autopar.ir.blocks import layer_of
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.rules.registry import RuleSet

__all__ = [
    "MemoryTimeline",
    "MicroBatchTime",
    "PlanBreakdown",
    "breakdown",
    "memory_timeline",
    "micro_batch_time",
    "module_of",
    "per_collective",
]


def module_of(variable_op: str) -> str:
    """The module that owns a variable: its name without the last component (``...q.weight`` -> ``...q``)."""
    return variable_op.rsplit(".", 1)[0] if "." in variable_op else variable_op


@dataclass(frozen=True)
class MemoryTimeline:
    """Per-device bytes at each position of the topological order.

    Model states are held for the whole step (the memory model of
    :mod:`autopar.cost.memory`); activations vary with liveness.
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

    ``evaluation``: the plan's :func:`autopar.cost.evaluate.evaluate` result, when
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
    result.comm_s = per_collective(result.edges, "time_s")
    result.comm_bytes = per_collective(result.edges, "bytes_per_device")
    return result


def per_collective(edges: Iterable[EdgeCost], field_name: str) -> dict[tuple[str, int], float]:
    """(collective, mesh axis) -> the sum of the steps' ``field_name`` (``time_s`` or
    ``bytes_per_device``) over ``edges``."""
    out: dict[tuple[str, int], float] = {}
    for e in edges:
        for s in e.steps:
            key = (s.collective.value, s.axis)
            out[key] = out.get(key, 0.0) + float(getattr(s, field_name))
    return out


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


@dataclass(frozen=True)
class MicroBatchTime:
    """Seconds of one micro-batch's forward and backward (see :func:`micro_batch_time`)."""

    compute_s: float
    comm_s: dict[tuple[str, int], float]
    """(collective, mesh axis) -> seconds."""

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.comm_s.values())

    def share(self, *collectives: str) -> float:
        """Fraction of :attr:`total_s` spent in ``collectives`` (names as ``Collective`` values)."""
        part = sum(t for (c, _), t in self.comm_s.items() if c in collectives)
        return part / self.total_s if self.total_s > 0 else 0.0


def micro_batch_time(graph: Graph, evaluation: Evaluation) -> MicroBatchTime:
    """The part of a modelled iteration that runs once per micro-batch: a view of the records.

    Formula (seconds): ``sum(OpCost.compute_s x OpCost.per_micro_batch)`` plus, per
    (collective, axis), ``sum(step time x EdgeCost.per_micro_batch)``: each record's runs
    per micro-batch (:class:`autopar.cost.iteration.RunCounts`): 0 for what runs once per
    optimizer step (the ops of :func:`once_per_step_ops`, the reduction of accumulated
    gradients, a ZeRO gather after the update), 2 for a recomputed block's forward compute
    and boxing, else 1.  What runtime puts the reduction and gather where is
    :data:`autopar.cost.iteration.ACCUMULATION` (OneFlow 0.9 gathers ZeRO parameters after
    the repeat op, so every micro-batch).  This is the span a profiler's per-iteration
    trace shows (the LiBai MT5 report's 357 ms and 1000 ms are such spans: 8
    micro-batches per 512-sample step, ``../shared/seed/mt5-throughput-issue.txt``).
    ``graph`` is unused (kept for callers); the evaluation already classified each record.
    """
    del graph
    compute = sum(o.compute_s * o.per_micro_batch for o in evaluation.ops)
    comm: dict[tuple[str, int], float] = {}
    for e in evaluation.edges:
        for s in e.steps:
            key = (s.collective.value, s.axis)
            comm[key] = comm.get(key, 0.0) + s.time_s * e.per_micro_batch
    return MicroBatchTime(compute, {k: v for k, v in comm.items() if v or k in _keys(evaluation)})


def _keys(evaluation: Evaluation) -> set[tuple[str, int]]:
    """(collective, axis) pairs of the records that run per micro-batch."""
    return {(s.collective.value, s.axis) for e in evaluation.edges if e.per_micro_batch for s in e.steps}
