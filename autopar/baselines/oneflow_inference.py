"""OneFlow 0.9's greedy SBP inference, emulated on an autopar graph (core; no OneFlow needed).

OneFlow infers each op's N-D SBP signature as it builds the job, visiting ops
in topological order (``Operator::InferNdSbpSignature`` ->
``Operator::GreedilyFindMinCopyCostNdSbp``, ``oneflow/core/operator/operator.cpp``;
costs in ``oneflow/core/framework/sbp_infer_util.cpp``, OneFlow v0.9.0 with its
defaults ``SBP_INFER_RULE_TAG=1`` and ``ONEFLOW_PENALTY_FOR_PARTIAL_IN_CONSUMER_POLICY=2``).
Ported here:

1. **Candidate order.** OneFlow's N-D candidates are the direct product of the
   op's 1-D signatures (``DfsGetNdSbpSignature``: axis 0 outermost), the
   all-``B`` signature last among the 1-D ones (``GetSbpSignaturesIf``);
   candidates whose split dims do not divide are then removed from the tail,
   each replaced by the list's last entry (``FilterNdSbpSignatureListByLogicalShape``),
   which reorders the list.  autopar's rules give the valid set;
   :func:`oneflow_candidate_order` rebuilds OneFlow's order from it, the 1-D
   signatures ordered splits (by dim) < ``P`` < ``B``, outputs first.
2. **Priority** per input (``ComputeSbpInferPriority``): 0 when the producer's
   N-D SBP equals the input's after ``InOutParallelDimReduce``, else 1, or 2
   for an input that may not be boxed (an in-place port); a candidate with a
   priority above 1.5 is rejected.
3. **Choice.** The first candidate whose inputs all match wins at once
   (``kAllMatch``); otherwise the candidate with the least summed copy cost,
   where a later candidate wins ties (``total_copy_cost <= min_copy_cost``)
   and the first zero-cost one stops the search.
4. **Copy cost** (``ComputeCopyCostWithMiddleNodes``): 0 when both ends reduce
   to the same SBP (``NdSbpDimReduce``); else the direct cost
   (``ComputeLazyCopyCostBetweenNdSbp``) when it is supported, else the
   cheapest route through one or two middle N-D SBPs (``BoxingCollector``).
   Each hop costs ``AUTO_PARALLEL_TRANSFER_COST`` (``GetTransferCost()``, 1.65e4 in
   OneFlow 0.9.0: :data:`TRANSFER_COST`) plus a byte count (:func:`lazy_copy_cost`), so
   bytes decide between routes of different hop counts once a tensor passes about 16 KiB:
   ``x (S(0), B) + y (S(0), P)`` of 32 KiB takes ``(S(0), S(2))`` (a local slice and a
   reduce-scatter) over ``(S(0), B)`` (one all-reduce).

Sources (variables, graph inputs, constants) keep the layout the user gave them.
What it cannot reproduce exactly: OneFlow's per-op 1-D signature order (item 1
uses one canonical order for every op) and middle nodes chosen among routes of
equal cost.  :func:`agreement` measures how many op signatures agree with a
reference plan (OneFlow's own choice, read back with ``autopar oneflow import-plan``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from autopar.baselines.megatron.layout import _libai_layout
from autopar.baselines.problem import Baseline, BaselineKind, _Problem
from autopar.cost.compute import op_signatures, rule_context
from autopar.cost.edges import EdgeKind, edge_kind
from autopar.ir.graph import DTYPE_BYTES, Graph, Op
from autopar.ir.plan import Plan
from autopar.ir.sbp import B, Broadcast, NdSbp, P, Partial, SbpValue, Signature, Split
from autopar.rules.registry import RuleSet, default_rules
from autopar.runtimes.oneflow_09.copy_cost import (
    UNSUPPORTED_BOXING,
    VALID_MAX_COPY_COST,
    cheapest_middle_route,
    lazy_copy_cost,
)
from autopar.runtimes.oneflow_09.copy_cost import reduce_nd_sbp_dims as _reduce_one
from autopar.runtimes.oneflow_09.copy_cost import reduce_pair as _reduce_pair
from autopar.runtimes.registry import runtime_profile

__all__ = [
    "ONEFLOW_OFFERS",
    "ONEFLOW_ONE_D_ORDER",
    "ONEFLOW_PARTIAL_ORDER",
    "SOURCE_TYPES",
    "Agreement",
    "agreement",
    "copy_cost_with_middle_nodes",
    "infer_like_oneflow",
    "oneflow_candidate_order",
]


class InferredBaseline(Baseline):
    """OneFlow's SBP inference from LiBai's layout (:func:`_inferred_plan`)."""

    kind = BaselineKind.INFERRED

    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        layout = _libai_layout(problem)
        sharding = runtime_profile(problem.runtime).zero_sharding.value
        sources = {
            op.name: problem.source_signature(op, layout)
            for op in problem.graph.ops
            if op.type in SOURCE_TYPES
        }
        return infer_like_oneflow(
            problem.graph,
            tuple(problem.mesh.shape),
            sources,
            zero_stage=problem.zero_stage,
            rules=problem.rules,
            zero_sharding=sharding,
        )


SOURCE_TYPES = frozenset({"variable", "input", "constant"})
"""Op types whose layout is given (parameters, data, folded constants), not inferred."""


@lru_cache(maxsize=65536)
def copy_cost_with_middle_nodes(
    shape: tuple[int, ...], nbytes: float, src: NdSbp, dst: NdSbp, hierarchy: tuple[int, ...]
) -> float:
    """OneFlow 0.9's copy cost of an edge (``ComputeCopyCostWithMiddleNodes``).

    0 when both ends reduce to the same SBP; the direct hop's
    :func:`lazy_copy_cost` when OneFlow boxes it directly; else the cheapest
    route through one, then two, middle N-D SBPs (``BoxingCollector``, middle
    SBPs whose split dims divide).  Unitless, as :func:`lazy_copy_cost`.
    """
    if _reduce_one(src.values, hierarchy) == _reduce_one(dst.values, hierarchy):
        return 0.0
    direct = lazy_copy_cost(nbytes, src, dst, hierarchy)
    if direct <= VALID_MAX_COPY_COST or len(hierarchy) != 2:
        return direct
    values: list[SbpValue] = [B, Partial(), *(Split(d) for d in range(len(shape)))]
    states = [
        NdSbp(combo)
        for combo in itertools.product(values, repeat=2)
        if all(not isinstance(v, Split) or shape[v.dim] % n == 0 for v, n in zip(combo, hierarchy))
    ]
    if not states:
        return UNSUPPORTED_BOXING
    first = {m: lazy_copy_cost(nbytes, src, m, hierarchy) for m in states}
    last = {m: lazy_copy_cost(nbytes, m, dst, hierarchy) for m in states}
    return cheapest_middle_route(nbytes, hierarchy, states, first, last)[0]


def _value_rank(v: SbpValue) -> tuple[int, int]:
    if isinstance(v, Split):
        return (0, v.dim)
    return (1, 0) if isinstance(v, Partial) else (2, 0)


OneD = tuple[tuple[SbpValue, ...], tuple[SbpValue, ...]]
"""A 1-D signature: the inputs' and the outputs' SBP on one mesh axis."""


def _no_partial_input(single: OneD) -> bool:
    return not any(isinstance(v, Partial) for v in single[0])


ONEFLOW_OFFERS: dict[str, Callable[[OneD], bool]] = {
    # BroadcastMatmulGradBOp::GetSbp (oneflow/user/ops/matmul_op.cpp): S(i) x S(i) -> P over
    # every dim but the last, S(last) x B -> S(0), B x S(last) -> S(1); no partial input,
    # although (B, P) -> P would be valid arithmetic (autopar's matmul rule offers it).
    "broadcast_matmul_grad_b": _no_partial_input,
    # SoftmaxGradOp::GetSbp (oneflow/user/ops/softmax_op.cpp): y, dy, dx split alike on
    # every dim but the last; no partial dy.
    "softmax_grad": _no_partial_input,
}
"""Op types whose 1-D signatures in OneFlow 0.9 are fewer than autopar's rules offer: a
predicate keeps OneFlow's (the all-``B`` signature always stays)."""


def _matmul_grad_b_order(single: OneD) -> tuple[int, int]:
    """OneFlow's order of ``broadcast_matmul_grad_b``'s 1-D signatures
    (``BroadcastMatmulGradBOp::GetSbp``, oneflow/user/ops/matmul_op.cpp, built in this order):
    ``S(i) x S(i) -> P`` for each dim ``i`` but the last, ascending; then
    ``S(last) x B -> S(0)``; then ``B x S(last) -> S(1)``; the all-``B`` one last."""
    (a, b), _ = single
    if isinstance(a, Split) and isinstance(b, Split):
        return (0, a.dim)
    if isinstance(a, Split):
        return (1, 0)
    return (2, 0) if isinstance(b, Split) else (3, 0)


ONEFLOW_ONE_D_ORDER: dict[str, Callable[[OneD], tuple[int, int]]] = {
    "broadcast_matmul_grad_b": _matmul_grad_b_order,
}
"""Op types whose 1-D signatures OneFlow 0.9 lists in an order of its own (its ``GetSbp``'s
build order), replacing the canonical one of :func:`oneflow_candidate_order`; it decides
which candidate wins a tie of copy costs (a later one does)."""

ONEFLOW_PARTIAL_ORDER: dict[str, tuple[tuple[SbpValue, ...], ...]] = {
    # GenPartialSbpSign<BinaryFuncMul> (oneflow/user/ops/math_binary_broadcast_ops.cpp):
    # B x P -> P is built before P x B -> P
    "broadcast_mul": ((B, P), (P, B)),
}
"""Op types whose partial-sum 1-D signatures OneFlow lists in an order of its own (inputs)."""


def oneflow_candidate_order(
    candidates: Sequence[Signature], ndim: int, op_type: str | None = None
) -> list[Signature]:
    """``candidates`` in the order OneFlow 0.9 would list them (item 1 of the module doc).

    The product of the 1-D signatures (ordered splits < ``P`` < ``B``, outputs
    first, then inputs, or for ``op_type`` in :data:`ONEFLOW_ONE_D_ORDER` its own
    order; axis 0 outermost; for ``op_type`` in
    :data:`ONEFLOW_PARTIAL_ORDER` its partial-sum signatures in OneFlow's order,
    for ``op_type`` in :data:`ONEFLOW_OFFERS` only the 1-D signatures OneFlow
    offers), then ``FilterNdSbpSignatureListByLogicalShape``'s removal from the
    tail of every product entry autopar's rules do not offer, each replaced by
    the last entry.
    """

    def one_d(sig: Signature, axis: int) -> OneD:
        return tuple(i[axis] for i in sig.inputs), tuple(o[axis] for o in sig.outputs)

    partial_order = ONEFLOW_PARTIAL_ORDER.get(op_type or "", ())

    own_order = ONEFLOW_ONE_D_ORDER.get(op_type or "")

    def key(s: OneD) -> tuple[tuple[tuple[int, int], ...], int, tuple[tuple[int, int], ...]]:
        if own_order is not None:
            return (own_order(s),), 0, ()
        position = partial_order.index(s[0]) if s[0] in partial_order else 0
        return tuple(map(_value_rank, s[1])), position, tuple(map(_value_rank, s[0]))

    offers = ONEFLOW_OFFERS.get(op_type or "")
    by_key = {tuple(one_d(c, a) for a in range(ndim)): c for c in candidates}
    found = {one_d(c, a) for c in candidates for a in range(ndim)}
    if offers is not None:
        found = {s for s in found if offers(s) or all(isinstance(v, Broadcast) for v in (*s[0], *s[1]))}
    singles = sorted(found, key=key)
    if len(singles) ** ndim > 50_000:
        return list(candidates)
    order = list(itertools.product(singles, repeat=ndim))
    for i in range(len(order) - 1, -1, -1):
        if order[i] not in by_key:
            order[i] = order[-1]
            order.pop()
    return [by_key[k] for k in order]


def infer_like_oneflow(
    graph: Graph,
    mesh_shape: tuple[int, ...],
    sources: Mapping[str, Signature],
    *,
    zero_stage: int = 0,
    rules: RuleSet | None = None,
    producers: Mapping[str, Signature] | None = None,
    zero_sharding: str = "one_axis",
) -> dict[str, Signature]:
    """op -> signature OneFlow's greedy inference picks, given the signatures of the source ops.

    ``sources``: the signature of every op of :data:`SOURCE_TYPES` (and any op
    to keep fixed), e.g. from a plan of the same graph.  ``producers``: when
    given, every op decides from *these* signatures of its producers instead of
    from the ones inferred before it (one decision per op, no cascade).
    """
    rules = rules if rules is not None else default_rules()
    hierarchy = tuple(int(n) for n in mesh_shape)
    chosen: dict[str, Signature] = {}
    tensor_sbp: dict[str, NdSbp] = {}
    for op in graph.topological_order:
        if op.name in sources:
            sig = sources[op.name]
        else:
            ctx = rule_context(graph, op, mesh_shape, zero_stage, zero_sharding)
            offered, _ = op_signatures(rules, ctx)
            candidates = oneflow_candidate_order(offered, len(hierarchy), op.type) or list(offered)
            sig = candidates[0]
            if not op.inputs:
                # nothing to infer from: a global tensor created in the program (arange,
                # ones, ...) takes the nd_sbp it is created with, broadcast in LiBai
                sig = next((c for c in candidates if all(v == B for o in c.outputs for v in o)), sig)
            elif len(candidates) > 1:
                sig = (
                    _split_softmax_signature(graph, op, candidates, tensor_sbp)
                    or _greedily_find_min_copy_cost(graph, op.inputs, candidates, tensor_sbp, hierarchy, op)
                    or sig
                )
        chosen[op.name] = sig
        given = producers[op.name] if producers is not None and op.name in producers else sig
        for tensor, sbp in zip(op.outputs.values(), given.outputs):
            tensor_sbp[tensor] = sbp
    return chosen


SPLIT_SOFTMAX_STAGES = frozenset({"reduce_max_device_stage", "reduce_max_global_stage"})
"""The max stages ``SplitSparseSoftmaxCrossEntropyOpPass`` writes with a signature of its own."""


def _split_softmax_signature(
    graph: Graph, op: Op, candidates: Sequence[Signature], tensor_sbp: Mapping[str, NdSbp]
) -> Signature | None:
    """The signature OneFlow's ``SplitSparseSoftmaxCrossEntropyOpPass``
    (``oneflow/core/job_rewriter/split_sparse_softmax_cross_entropy_op_pass.cpp``) gives the
    max stages of a vocabulary-split cross entropy instead of inferring it
    (``AddNdSbpSignature4OpName``): ``reduce_max_device_stage`` every port in the
    prediction's N-D SBP; ``reduce_max_global_stage`` its ``in``, ``device_count`` and
    ``out`` in that SBP with the split of the vocabulary (the last dim) made ``B``.  None
    for any other op, or when no candidate has that layout."""
    if op.type not in SPLIT_SOFTMAX_STAGES or not op.inputs:
        return None
    first = next(iter(op.inputs.values()))
    if op.type == "reduce_max_device_stage":
        given = tensor_sbp.get(first)
        fixed = [i for i, _ in enumerate(op.outputs)]
    else:
        device = graph.op_by_name[graph.producer[first][0]]
        prediction = next(iter(device.inputs.values()), None)
        if device.type != "reduce_max_device_stage" or prediction is None:
            return None
        last = Split(len(graph.tensors[prediction].shape) - 1)
        have = tensor_sbp.get(prediction)
        given = None if have is None else NdSbp(tuple(B if v == last else v for v in have))
        fixed = [0]  # out; mask is left to the rule
    if given is None:
        return None
    for cand in candidates:
        if all(i == given for i in cand.inputs) and all(cand.outputs[i] == given for i in fixed):
            return cand
    return None


def _greedily_find_min_copy_cost(
    graph: Graph,
    inputs: Mapping[str, str],
    candidates: Sequence[Signature],
    tensor_sbp: Mapping[str, NdSbp],
    hierarchy: tuple[int, ...],
    op: object,
) -> Signature | None:
    """``Operator::GreedilyFindMinCopyCostNdSbp`` under ``kAllMatch`` (item 3 of the module doc)."""
    selected: Signature | None = None
    min_cost = VALID_MAX_COPY_COST
    for cand in candidates:
        total = 0.0
        priority = 0.0
        for (port, tensor), want in zip(inputs.items(), cand.inputs):
            have = tensor_sbp.get(tensor)
            if have is None:
                continue
            rs, rd, _ = _reduce_pair(have.values, want.values, hierarchy)
            in_place = edge_kind(op, port) is EdgeKind.IN_PLACE  # type: ignore[arg-type]
            p = 0.0 if rs == rd else (2.0 if in_place else 1.0)
            priority += p
            if p > 1.5:
                total = UNSUPPORTED_BOXING
                break
            spec = graph.tensors[tensor]
            nbytes = float(math.prod(spec.shape) * DTYPE_BYTES[spec.dtype])
            total += copy_cost_with_middle_nodes(tuple(spec.shape), nbytes, have, want, hierarchy)
        if priority == 0.0:
            return cand
        if total <= min_cost:
            selected, min_cost = cand, total
            if total == 0.0:
                break
    return selected


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
    # an op without inputs (arange, constant-like ops) takes the N-D SBP the job gives it
    # (its nd_sbp attribute, set where the program creates the global tensor): not inferred
    sources = {
        op.name: reference.signatures[op.name] for op in graph.ops if op.type in SOURCE_TYPES or not op.inputs
    }
    inferred = infer_like_oneflow(
        graph,
        tuple(reference.mesh.shape),
        sources,
        zero_stage=reference.zero_stage,
        rules=rules,
        producers=None if cascade else reference.signatures,
        zero_sharding=runtime_profile(reference.runtime).zero_sharding.value,
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
