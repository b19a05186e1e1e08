"""Losses: (sparse) softmax cross entropy and its model-split (``_ms``) forms, NLL.

For ``sparse_softmax_cross_entropy(prediction [N, V], label [N]) -> (prob [N, V],
out [N])``:

* ``(S(0), S(0)) -> (S(0), S(0))``: split the rows (data parallel);
* ``(S(1), B) -> (S(1), B)``: vocab-parallel cross entropy (Megatron's
  ``vocab_parallel_cross_entropy``; OneFlow rewrites the op into its ``_ms``
  form): each device holds a vocab slice, the row max, the sum of exponentials
  and the target logit are all-reduced inside the op (3 all-reduces of ``N``
  floats, negligible next to gathering ``[N, V]`` logits) and every device ends
  with the whole per-row loss;
* ``(B, B) -> (B, B)``.

The gradients take ``dy`` ``P`` with the rest ``B`` (``dx`` is linear in ``dy``)
and keep the vocab split: ``(label B, dy B, prob S(1)) -> S(1)``.
``sparse_cross_entropy(_ms)`` (no softmax) gives a masked, partial loss under a
vocab split: ``(S(1), B) -> P``.  ``nll`` with the class dim split reads the
target's log-probability on the device that owns it: ``(S(1), B, S(0)) -> (P, P)``.
"""

from __future__ import annotations

from autopar.ir.sbp import B, P, Split
from autopar.rules.families._common import partial_ok, port_map, sig, uniform
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__: list[str] = []


@register("sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_ms", cost=CostKind.MEMORY)
def sparse_softmax_cross_entropy(ctx: RuleContext) -> list[OneDSignature]:
    """Rows ``(S(i), S(i)) -> (S(i), S(i))``; vocab ``(S(last), B) -> (S(last), B)``;
    ``(B, B) -> (B, B)``; no ``P``."""
    pm = port_map(ctx, ("prediction", "label"), ("prob", "out"))
    pred = pm.input("prediction") or ctx.inputs[0]
    last = pred.ndim - 1
    sigs = [
        sig(pm, {"prediction": Split(i), "label": Split(i)}, {"prob": Split(i), "out": Split(i)})
        for i in range(last)
    ]
    sigs.append(sig(pm, {"prediction": Split(last), "label": B}, {"prob": Split(last), "out": B}))
    sigs.append(uniform(ctx, B))
    return sigs


@register(
    "sparse_softmax_cross_entropy_grad",
    "sparse_softmax_cross_entropy_ms_grad",
    cost=CostKind.MEMORY,
)
def sparse_softmax_cross_entropy_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(label, dy, prob) -> prediction_diff``: rows ``S(i)``;
    vocab ``(B, B, S(last)) -> S(last)``; ``(B, P, B) -> P``; all ``B``."""
    pm = port_map(ctx, ("label", "dy", "prob"), ("prediction_diff",))
    prob = pm.input("prob") or ctx.outputs[0]
    last = prob.ndim - 1
    sigs = [
        sig(pm, {"label": Split(i), "dy": Split(i), "prob": Split(i)}, {"prediction_diff": Split(i)})
        for i in range(last)
    ]
    sigs.append(sig(pm, {"label": B, "dy": B, "prob": Split(last)}, {"prediction_diff": Split(last)}))
    sigs.append(uniform(ctx, B))
    if partial_ok(*ctx.outputs):
        sigs.append(sig(pm, {"dy": P}, {"prediction_diff": P}))
    return sigs


@register("sparse_cross_entropy", "sparse_cross_entropy_ms", cost=CostKind.MEMORY)
def sparse_cross_entropy(ctx: RuleContext) -> list[OneDSignature]:
    """``out = -log(prediction[label])``: rows; vocab ``(S(last), B) -> P`` (masked); ``B``."""
    pm = port_map(ctx, ("prediction", "label"), ("out",))
    pred = pm.input("prediction") or ctx.inputs[0]
    last = pred.ndim - 1
    sigs = [sig(pm, {"prediction": Split(i), "label": Split(i)}, {"out": Split(i)}) for i in range(last)]
    if partial_ok(*ctx.outputs):
        sigs.append(sig(pm, {"prediction": Split(last), "label": B}, {"out": P}))
    sigs.append(uniform(ctx, B))
    return sigs


@register("sparse_cross_entropy_grad", "sparse_cross_entropy_ms_grad", cost=CostKind.MEMORY)
def sparse_cross_entropy_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(prediction, label, dy) -> prediction_diff``: rows; vocab ``(S(last), B, B) -> S(last)``;
    ``(B, B, P) -> P``; ``B``."""
    pm = port_map(ctx, ("prediction", "label", "dy"), ("prediction_diff",))
    pred = pm.input("prediction") or ctx.inputs[0]
    last = pred.ndim - 1
    sigs = [
        sig(pm, {"prediction": Split(i), "label": Split(i), "dy": Split(i)}, {"prediction_diff": Split(i)})
        for i in range(last)
    ]
    sigs.append(sig(pm, {"prediction": Split(last), "label": B, "dy": B}, {"prediction_diff": Split(last)}))
    sigs.append(uniform(ctx, B))
    if partial_ok(*ctx.outputs):
        sigs.append(sig(pm, {"dy": P}, {"prediction_diff": P}))
    return sigs


@register("softmax_cross_entropy", cost=CostKind.MEMORY)
def softmax_cross_entropy(ctx: RuleContext) -> list[OneDSignature]:
    """Dense labels: rows ``(S(i), S(i)) -> (S(i), S(i))``; ``B``."""
    pm = port_map(ctx, ("prediction", "label"), ("prob", "out"))
    pred = pm.input("prediction") or ctx.inputs[0]
    sigs = [uniform(ctx, Split(i)) for i in range(pred.ndim - 1)]
    sigs.append(uniform(ctx, B))
    return sigs


@register("softmax_cross_entropy_grad", cost=CostKind.MEMORY)
def softmax_cross_entropy_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(dy, label, prob) -> prediction_diff``: rows; ``(P, B, B) -> P``; ``B``."""
    pm = port_map(ctx, ("dy", "label", "prob"), ("prediction_diff",))
    prob = pm.input("prob") or ctx.outputs[0]
    sigs = [uniform(ctx, Split(i)) for i in range(prob.ndim - 1)]
    sigs.append(uniform(ctx, B))
    if pm.has_input("dy") and partial_ok(*ctx.outputs):
        sigs.append(sig(pm, {"dy": P}, {"prediction_diff": P}))
    return sigs


@register("nll", cost=CostKind.MEMORY)
def nll(ctx: RuleContext) -> list[OneDSignature]:
    """``(input [N, C], target [N], weight [C]) -> (output, out_weight)``: rows ``S(0)``;
    class split ``(S(1), B, S(0)) -> (P, P)``; all ``B``."""
    pm = port_map(ctx, ("input", "target", "weight"), ("output", "out_weight"))
    x = pm.input("input") or ctx.inputs[0]
    target = pm.input("target")
    n_rows = target.ndim if target is not None else x.ndim - 1
    sigs = [
        sig(
            pm,
            {"input": Split(i), "target": Split(i), "weight": B},
            {"output": Split(i), "out_weight": Split(i)},
        )
        for i in range(n_rows)
    ]
    if partial_ok(*ctx.outputs) and x.ndim > n_rows:
        sigs.append(
            sig(pm, {"input": Split(n_rows), "target": B, "weight": Split(0)}, {"output": P, "out_weight": P})
        )
    sigs.append(uniform(ctx, B))
    return sigs


@register("nll_grad", cost=CostKind.MEMORY)
def nll_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(out_grad, input, target, weight) -> in_grad``: rows; class split
    ``(B, S(1), B, S(0)) -> S(1)``; ``(P, B, B, B) -> P``; ``B``."""
    pm = port_map(ctx, ("out_grad", "input", "target", "weight"), ("in_grad",))
    x = pm.input("input") or ctx.outputs[0]
    target = pm.input("target")
    n_rows = target.ndim if target is not None else x.ndim - 1
    sigs = [
        sig(
            pm,
            {"out_grad": Split(i), "input": Split(i), "target": Split(i), "weight": B},
            {"in_grad": Split(i)},
        )
        for i in range(n_rows)
    ]
    if x.ndim > n_rows:
        sigs.append(
            sig(
                pm,
                {"out_grad": B, "input": Split(n_rows), "target": B, "weight": Split(0)},
                {"in_grad": Split(n_rows)},
            )
        )
    sigs.append(uniform(ctx, B))
    if partial_ok(*ctx.outputs):
        sigs.append(sig(pm, {"out_grad": P}, {"in_grad": P}))
    return sigs
