"""OneFlow 0.9's greedy SBP inference, emulated on an autopar graph (core; no OneFlow needed).

OneFlow infers each op's N-D SBP signature as it builds the job
(``Operator::InferNdSbpSignature`` -> ``GreedilyFindMinCopyCostNdSbp``,
``oneflow/core/operator/operator.cpp``; costs in
``oneflow/core/framework/sbp_infer_util.cpp``): ops are visited in
topological order and, among the op's candidate signatures, it takes the one
with

1. the lowest *priority* summed over the inputs
   (``ComputeSbpInferPriority``: 0 when the producer's N-D SBP already is the
   signature's input SBP, else 1), then
2. the lowest copy cost summed over the inputs (``ComputeCopyCostWithMiddleNodes``),
3. ties to the earlier candidate (a strict ``<`` on both).

Sources (variables, graph inputs, constants) keep the layout the user gave them.

:func:`infer_like_oneflow` reproduces this with autopar's rules as the
candidate lists and, as the copy cost, the bytes per device OneFlow 0.9 moves
for the hop (:func:`autopar.oneflow.lowering.lower_hop`: OneFlow's lazy copy
cost is a byte count too).  What it cannot reproduce exactly: OneFlow's own
candidate order (ties go to the first of autopar's rule order), and the
cost penalties ``sbp_infer_util.cpp`` adds for a ``P`` at the consumer.
:func:`agreement` measures how many op signatures agree with a reference plan
(OneFlow's own choice, read back with ``autopar oneflow import-plan``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from autopar.costs import EdgeKind, edge_kind, op_signatures, rule_context
from autopar.graph import DTYPE_BYTES, Graph
from autopar.oneflow.lowering import lower_hop
from autopar.plan import Plan
from autopar.rules.registry import RuleSet, default_rules
from autopar.sbp import NdSbp, Signature

__all__ = ["SOURCE_TYPES", "Agreement", "agreement", "infer_like_oneflow"]

SOURCE_TYPES = frozenset({"variable", "input", "constant"})
"""Op types whose layout is given (parameters, data, folded constants), not inferred."""


def infer_like_oneflow(
    graph: Graph,
    mesh_shape: tuple[int, ...],
    sources: Mapping[str, Signature],
    *,
    zero_stage: int = 0,
    rules: RuleSet | None = None,
    producers: Mapping[str, Signature] | None = None,
) -> dict[str, Signature]:
    """op -> signature OneFlow's greedy inference picks, given the signatures of the source ops.

    ``sources``: the signature of every op of :data:`SOURCE_TYPES` (and any op
    to keep fixed), e.g. from a plan of the same graph.  ``producers``: when
    given, every op decides from *these* signatures of its producers instead of
    from the ones inferred before it (one decision per op, no cascade).
    """
    rules = rules if rules is not None else default_rules()
    chosen: dict[str, Signature] = {}
    tensor_sbp: dict[str, NdSbp] = {}
    for op in graph.topological_order:
        if op.name in sources:
            sig = sources[op.name]
        else:
            ctx = rule_context(graph, op, mesh_shape, zero_stage)
            candidates, _ = op_signatures(rules, ctx)
            best: tuple[int, float] | None = None
            sig = candidates[0]
            for cand in candidates:
                priority = 0
                cost = 0.0
                for (port, tensor), want in zip(op.inputs.items(), cand.inputs):
                    have = tensor_sbp.get(tensor)
                    if have is None or have == want:
                        continue
                    priority += 1
                    if edge_kind(op, port) is not EdgeKind.BOXING:
                        continue
                    spec = graph.tensors[tensor]
                    cost += lower_hop(spec.shape, DTYPE_BYTES[spec.dtype], have, want, mesh_shape).total_bytes
                if best is None or (priority, cost) < best:
                    best = (priority, cost)
                    sig = cand
        chosen[op.name] = sig
        given = producers[op.name] if producers is not None and op.name in producers else sig
        for tensor, sbp in zip(op.outputs.values(), given.outputs):
            tensor_sbp[tensor] = sbp
    return chosen


@dataclass
class Agreement:
    """How many inferred op signatures equal a reference plan's."""

    ops: int
    agreed: int
    by_type: dict[str, tuple[int, int]] = field(default_factory=dict)
    """op type -> (agreed, ops)"""
    examples: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.agreed / self.ops if self.ops else 1.0


def agreement(
    graph: Graph, reference: Plan, *, rules: RuleSet | None = None, cascade: bool = True
) -> Agreement:
    """Run :func:`infer_like_oneflow` from ``reference``'s source layouts and compare op by op.

    ``cascade=False`` decides every op from the reference's producer layouts
    (measures the per-op decision rule alone; with ``cascade`` one early
    difference propagates, as it would in OneFlow).
    """
    sources = {op.name: reference.signatures[op.name] for op in graph.ops if op.type in SOURCE_TYPES}
    inferred = infer_like_oneflow(
        graph,
        tuple(reference.mesh.shape),
        sources,
        zero_stage=reference.zero_stage,
        rules=rules,
        producers=None if cascade else reference.signatures,
    )
    result = Agreement(0, 0)
    per_type: dict[str, list[int]] = {}
    for op in graph.ops:
        if op.name in sources:
            continue
        same = inferred[op.name] == reference.signatures[op.name]
        result.ops += 1
        result.agreed += same
        counts = per_type.setdefault(op.type, [0, 0])
        counts[0] += same
        counts[1] += 1
        if not same and len(result.examples) < 20:
            result.examples.append(
                f"{op.name} ({op.type}): inferred {inferred[op.name]}, "
                f"OneFlow {reference.signatures[op.name]}"
            )
    result.by_type = {t: (a, n) for t, (a, n) in sorted(per_type.items())}
    return result
