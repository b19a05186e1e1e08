"""Reductions: ``reduce_sum`` and friends, ``reduce_sum_like``, ``broadcast_like``,
``square_sum``, ``count_not_finite``.

For ``y = reduce(x, axis, keepdims)``:

* a dim that is kept: ``(S(d)) -> S(d')`` where ``d'`` is ``d`` renumbered
  after the reduced dims are dropped (``d' = d`` with ``keepdims``);
* a reduced dim, sum-like reduction (``reduce_sum``, ``reduce_mean``,
  ``square_sum``, counts): ``(S(d)) -> P`` -- each device sums its slice.
  ``reduce_mean`` divides by the logical count, so the addends still add up
  to the mean.  ``reduce_max`` / ``min`` / ``prod`` / ``all`` / ``any`` are not
  sums: no split of a reduced dim;
* ``(P) -> P`` for the linear ones (``reduce_sum``, ``reduce_mean``), and
  ``(B) -> B``.

``broadcast_like(x, like)`` is the adjoint: the dims it adds take ``x`` ``B``,
and ``(P, B) -> P``.  ``like`` inputs only lend their shape; they follow the
output's layout (``B`` when the output is ``P``), and ``broadcast_like`` also
takes a ``P`` ``like`` as OneFlow does.

Two-stage max / min (OneFlow's rewrite of ``sparse_softmax_cross_entropy_ms``
when the logits are split on the vocab dim): ``reduce_max_device_stage(in) ->
(out, mask, count)`` reduces each device's slice; its ``out`` / ``count`` keep
the reduced dim with size = the number of slices (the product of the mesh axes
splitting it), so their logical shape fixes which axes split that dim (full
N-D rule).  ``reduce_max_global_stage(in, device_count) -> (out, mask)`` then
combines the per-device maxima once they are gathered (``B`` on those axes).
Max and min are not sums: never ``P``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from autopar.ir.sbp import B, NdSbp, P, SbpValue, Signature, Split
from autopar.rules.families._common import PortMap, norm_dims, partial_ok, port_map, sig, uniform
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__ = [
    "DEVICE_STAGE_GRAD_OPS",
    "DEVICE_STAGE_OPS",
    "GLOBAL_STAGE_GRAD_OPS",
    "GLOBAL_STAGE_OPS",
    "LINEAR_REDUCE_OPS",
    "ORDER_REDUCE_OPS",
    "kept_dim_map",
]

LINEAR_REDUCE_OPS = ("reduce_sum", "reduce_mean")
ORDER_REDUCE_OPS = ("reduce_max", "reduce_min", "reduce_prod", "reduce_all", "reduce_any")
DEVICE_STAGE_OPS = ("reduce_max_device_stage", "reduce_min_device_stage")
DEVICE_STAGE_GRAD_OPS = ("reduce_max_device_stage_grad", "reduce_min_device_stage_grad")
GLOBAL_STAGE_OPS = ("reduce_max_global_stage", "reduce_min_global_stage")
GLOBAL_STAGE_GRAD_OPS = ("reduce_max_global_stage_grad", "reduce_min_global_stage_grad")


def kept_dim_map(ndim: int, reduced: list[int], out_ndim: int) -> dict[int, int]:
    """Input dim -> output dim for the dims a reduction keeps.

    With keepdims (``out_ndim == ndim``) dims keep their index; otherwise the
    reduced dims are dropped and later dims shift left.
    """
    keep = [d for d in range(ndim) if d not in reduced]
    if out_ndim == ndim:
        return {d: d for d in keep}
    return {d: i for i, d in enumerate(keep)}


def _reduce_signatures(
    in_ndim: int, out_ndim: int, reduced: list[int], sum_like: bool
) -> list[tuple[SbpValue, SbpValue]]:
    pairs: list[tuple[SbpValue, SbpValue]] = []
    for d, e in kept_dim_map(in_ndim, reduced, out_ndim).items():
        pairs.append((Split(d), Split(e)))
    if sum_like:
        pairs += [(Split(d), P) for d in reduced]
    pairs.append((B, B))
    return pairs


@register(*LINEAR_REDUCE_OPS, *ORDER_REDUCE_OPS, cost=CostKind.MEMORY)
def reduce(ctx: RuleContext) -> list[OneDSignature]:
    """Kept dim ``(S(d)) -> S(d')``; reduced dim ``(S(d)) -> P`` (sum/mean only);
    ``(P) -> P`` (sum/mean only); ``(B) -> B``."""
    x, y = ctx.inputs[0], ctx.outputs[0]
    reduced = norm_dims(ctx.attr("axis"), x.ndim)
    linear = ctx.op.type in LINEAR_REDUCE_OPS and partial_ok(x, y)
    sigs: list[OneDSignature] = [((a,), (b,)) for a, b in _reduce_signatures(x.ndim, y.ndim, reduced, linear)]
    if linear:
        sigs.append(((P,), (P,)))
    return sigs


@register("square_sum", "count_not_finite", cost=CostKind.MEMORY)
def full_sum(ctx: RuleContext) -> list[OneDSignature]:
    """Sum over every element (``y`` is ``[1]``): ``(S(d)) -> P``, ``(B) -> B``.

    ``square_sum`` squares first, so a ``P`` input is not allowed.
    """
    x, y = ctx.inputs[0], ctx.outputs[0]
    sigs: list[OneDSignature] = [((B,), (B,))]
    if ctx.op.type == "count_not_finite" or partial_ok(y):
        sigs += [((Split(d),), (P,)) for d in range(x.ndim)]
    return sigs


@register(
    "multi_square_sum",
    "multi_count_not_finite",
    "multi_reduce_sum_pow_abs",
    cost=CostKind.MEMORY,
)
def multi_sum(ctx: RuleContext) -> list[OneDSignature]:
    """Sum over several tensors (gradient-norm clipping, overflow checks): all ``B`` ``-> B``;
    every input split on the same dim ``-> P``."""
    sigs: list[OneDSignature] = [(tuple(B for _ in ctx.inputs), tuple(B for _ in ctx.outputs))]
    if not ctx.inputs:
        return sigs
    common = min(s.ndim for s in ctx.inputs)
    for d in range(common):
        sigs.append((tuple(Split(d) for _ in ctx.inputs), tuple(P for _ in ctx.outputs)))
    return sigs


@register("reduce_sum_like", cost=CostKind.MEMORY)
def reduce_sum_like(ctx: RuleContext) -> list[OneDSignature]:
    """``y = reduce_sum(x, axis)`` shaped like ``like``.

    Kept dim: ``(S(d), S(d')) -> S(d')``; reduced dim: ``(S(d), B) -> P`` and
    ``(S(d), P) -> P`` (``like`` lends only its shape); ``(B, P) -> B``; ``(B, B) -> B``.
    No ``(P, B) -> P``: OneFlow 0.9 refuses it.  Source: ``reduce_sum_like``'s
    ``SetGetSbpFn`` (``oneflow/user/ops/reduce_like_ops.cpp``).
    """
    pm = port_map(ctx, ("x", "like"), ("y",))
    x = pm.input("x")
    y = ctx.outputs[0]
    if x is None:
        raise ValueError(f"op {ctx.op.name!r} (reduce_sum_like) needs an input x_0")
    reduced = norm_dims(ctx.attr("axis"), x.ndim)
    sigs: list[OneDSignature] = []
    for d, e in kept_dim_map(x.ndim, reduced, y.ndim).items():
        sigs.append(sig(pm, {"x": Split(d), "like": Split(e)}, {"y": Split(e)}))
    if partial_ok(x, y):
        sigs += [sig(pm, {"x": Split(d), "like": B}, {"y": P}) for d in reduced]
        sigs += [sig(pm, {"x": Split(d), "like": P}, {"y": P}) for d in reduced]
        sigs.append(sig(pm, {"x": B, "like": P}, {"y": B}))
    sigs.append(sig(pm, {}, {}))
    return sigs


@register("broadcast_like", cost=CostKind.MEMORY)
def broadcast_like(ctx: RuleContext) -> list[OneDSignature]:
    """``y = broadcast x along broadcast_axes`` to ``like``'s shape.

    A dim ``x`` has: ``(S(d), S(e)) -> S(e)``; an added dim: ``(B, S(e)) -> S(e)``;
    ``(P, B) -> P``, ``(P, P) -> P``, ``(B, P) -> B`` (``like`` lends only its shape);
    ``(B, B) -> B``.
    """
    pm = port_map(ctx, ("x", "like"), ("y",))
    x = pm.input("x")
    y = ctx.outputs[0]
    if x is None:
        raise ValueError(f"op {ctx.op.name!r} (broadcast_like) needs an input x_0")
    added = norm_dims(ctx.attr("broadcast_axes"), y.ndim)
    # y dim -> x dim: x has y's dims minus the added ones (or keeps them at size 1).
    if x.ndim == y.ndim:
        to_x = {e: e for e in range(y.ndim) if e not in added and x.shape[e] == y.shape[e]}
    else:
        keep = [e for e in range(y.ndim) if e not in added]
        to_x = {e: i for i, e in enumerate(keep)}
    sigs: list[OneDSignature] = []
    for e in range(y.ndim):
        xv: SbpValue = Split(to_x[e]) if e in to_x else B
        sigs.append(sig(pm, {"x": xv, "like": Split(e)}, {"y": Split(e)}))
    if partial_ok(x, y):
        sigs.append(sig(pm, {"x": P, "like": B}, {"y": P}))
        sigs.append(sig(pm, {"x": P, "like": P}, {"y": P}))
    if partial_ok(pm.input("like")):
        sigs.append(sig(pm, {"x": B, "like": P}, {"y": B}))
    sigs.append(sig(pm, {}, {}))
    return sigs


@register("var", cost=CostKind.MEMORY)
def variance(ctx: RuleContext) -> list[OneDSignature]:
    """``var(input, dim, keepdim)``: kept dims ``(S(d)) -> S(d')``, ``(B) -> B`` (not linear)."""
    x, y = ctx.inputs[0], ctx.outputs[0]
    reduced = norm_dims(ctx.attr("dim"), x.ndim)
    return [((a,), (b,)) for a, b in _reduce_signatures(x.ndim, y.ndim, reduced, False)]


@register("argmax", cost=CostKind.MEMORY)
def argmax(ctx: RuleContext) -> list[OneDSignature]:
    """``argmax`` over the last dim: ``(S(d)) -> S(d)`` for ``d < last``, ``(B) -> B``."""
    x = ctx.inputs[0]
    return [((Split(d),), (Split(d),)) for d in range(x.ndim - 1)] + [((B,), (B,))]


def _stage_signatures(
    ctx: RuleContext, pm: PortMap, split_dims: Sequence[int], reduced: Sequence[int], stage_size: int | None
) -> list[Signature]:
    """N-D products of "every port ``S(d)``" (``d`` in ``split_dims``) and all ``B``, keeping
    those whose axes splitting the reduced dim multiply to ``stage_size`` (the size of that dim
    in the stage's ``out`` / ``count``; None: no check)."""
    one_d: list[SbpValue] = [B, *(Split(d) for d in split_dims)]
    mesh = ctx.mesh_shape
    sigs: list[Signature] = []
    for combo in itertools.product(one_d, repeat=len(mesh)):
        if stage_size is not None:
            cut = {Split(d) for d in reduced}
            slices = math.prod(m for m, v in zip(mesh, combo, strict=True) if v in cut)
            if slices != stage_size:
                continue
        nd = NdSbp(tuple(combo))
        sigs.append(Signature(tuple(nd for _ in pm.inputs), tuple(nd for _ in pm.outputs)))
    return sigs


def _stage_size(spec_shape: Sequence[int] | None, reduced: Sequence[int]) -> int | None:
    if spec_shape is None or len(reduced) != 1 or reduced[0] >= len(spec_shape):
        return None
    return int(spec_shape[reduced[0]])


@register(*DEVICE_STAGE_OPS, cost=CostKind.MEMORY, nd=True)
def reduce_device_stage(ctx: RuleContext) -> list[Signature]:
    """``in -> (out, mask, count)``, every port alike on each axis: ``S(d)`` for any dim, or
    ``B``; the axes splitting the reduced dim must multiply to its size in ``out`` (*N-D*)."""
    pm = port_map(ctx, ("in",), ("out", "mask", "count"))
    x = pm.input("in") or ctx.inputs[0]
    reduced = norm_dims(ctx.attr("axis"), x.ndim)
    out = pm.output("out")
    size = _stage_size(out.shape if out else None, reduced)
    return _stage_signatures(ctx, pm, range(x.ndim), reduced, size)


@register(*DEVICE_STAGE_GRAD_OPS, cost=CostKind.MEMORY, nd=True)
def reduce_device_stage_grad(ctx: RuleContext) -> list[Signature]:
    """``(out_diff, mask, count) -> in_diff``: every port ``S(d)`` on the reduced dim, or ``B``;
    the axes splitting it must multiply to its size in ``count`` (*N-D*)."""
    pm = port_map(ctx, ("out_diff", "mask", "count"), ("in_diff",))
    mask = pm.input("mask") or ctx.outputs[0]
    reduced = norm_dims(ctx.attr("axis"), mask.ndim)
    count = pm.input("count")
    size = _stage_size(count.shape if count else None, reduced)
    return _stage_signatures(ctx, pm, reduced, reduced, size)


@register(*GLOBAL_STAGE_OPS, cost=CostKind.MEMORY)
def reduce_global_stage(ctx: RuleContext) -> list[OneDSignature]:
    """``(in, device_count) -> (out, mask)``: every port ``S(0)`` (when dim 0 is not reduced),
    or every port ``B``; never ``P``."""
    pm = port_map(ctx, ("in", "device_count"), ("out", "mask"))
    x = pm.input("in") or ctx.inputs[0]
    reduced = norm_dims(ctx.attr("axis"), x.ndim)
    sigs = [uniform(ctx, B)]
    if x.ndim > 0 and 0 not in reduced:
        sigs.append(uniform(ctx, Split(0)))
    return sigs


@register(*GLOBAL_STAGE_GRAD_OPS, cost=CostKind.MEMORY)
def reduce_global_stage_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(out_diff, mask, device_count) -> in_diff``: every port ``B`` (OneFlow offers no other)."""
    return [uniform(ctx, B)]
