"""Views and data movement: reshape-like ops, transpose, expand, slice, concat.

Every op here is linear, so ``(P) -> P`` and ``(B) -> B`` always hold (on
float tensors for ``P``).  Splits map through the op:

* ``reshape`` / ``reshape_like`` / ``flatten`` / ``expand_dims`` / ``squeeze``:
  both shapes are cut into the smallest blocks of dims with equal products; the
  leading dim of a block maps to the leading dim of its image
  (``[B*S, H] -> [B, S, H]``: ``S(0) -> S(0)`` and ``S(1) -> S(2)``; splitting
  ``S`` inside ``B*S`` would not be contiguous, so it is not offered);
* ``transpose``: ``S(perm[j]) -> S(j)``;
* ``expand``: a kept dim maps across; an expanded dim is not split (OneFlow 0.9
  offers no ``(B) -> S`` there);
* ``slice`` / ``narrow`` and their grads: only dims the op does not cut;
* ``concat`` / ``split_like`` / ``stack``: any dim but the concatenated one.

Pure views (reshape-like) cost nothing; ops that copy (transpose, slice,
concat, expand) are memory-bound.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.ir.sbp import B, NdSbp, P, Signature, Split
from autopar.rules.families._common import (
    norm_dim,
    partial_ok,
    port_map,
    reshape_dim_map,
    sig,
    uniform,
)
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__ = ["RESHAPE_OPS", "reshape_splits_fit"]

RESHAPE_OPS = ("reshape", "flatten", "expand_dims", "squeeze")


def _linear_tail(ctx: RuleContext) -> list[OneDSignature]:
    sigs = [uniform(ctx, B)]
    if partial_ok(*ctx.inputs, *ctx.outputs):
        sigs.append(uniform(ctx, P))
    return sigs


def _reshape_fits(ctx: RuleContext, signature: Signature) -> bool:
    """Whether a reshape (``reshape_like``: its ``in``) may map its N-D input splits onto its
    output's (:func:`reshape_splits_fit`)."""
    at = port_map(ctx, ("in", "like"), ("out",)).inputs.index("in") if ctx.op.type == "reshape_like" else 0
    x, y = ctx.inputs[at], ctx.outputs[0]
    return reshape_splits_fit(signature.inputs[at], signature.outputs[0], x.shape, y.shape, ctx.mesh_shape)


def reshape_splits_fit(
    src: NdSbp, dst: NdSbp, in_shape: Sequence[int], out_shape: Sequence[int], mesh_shape: Sequence[int]
) -> bool:
    """Whether a reshape may map the splits of ``src`` onto those of ``dst``.

    OneFlow 0.9 (``ReshapeUserOpUtil::GetGroupStartInAxis2OutAxis``,
    ``oneflow/user/ops/reshape_user_op_util.cpp``) pairs the leading dims of the
    blocks and offers ``S(d) -> S(e)`` on an axis of size ``n`` when the two dims
    are equal (any split OneFlow accepts, uneven included: both sides are cut by
    the same ``BalancedSplitter``) or both divide by ``n``.  For unequal dims autopar
    asks that both divide by the product of the axes cutting them: rows of
    different sizes then hold the same elements on every device (OneFlow's per-axis
    test alone would also pass ``12 -> 6`` on ``[2, 2]``, whose nested shards differ).
    """
    cuts_in: dict[int, int] = {}
    cuts_out: dict[int, int] = {}
    unequal: set[tuple[int, int]] = set()
    for a, b, n in zip(src, dst, mesh_shape):
        if isinstance(a, Split) and isinstance(b, Split):
            cuts_in[a.dim] = cuts_in.get(a.dim, 1) * n
            cuts_out[b.dim] = cuts_out.get(b.dim, 1) * n
            if in_shape[a.dim] != out_shape[b.dim]:
                unequal.add((a.dim, b.dim))
    return all(in_shape[d] % cuts_in[d] == 0 and out_shape[e] % cuts_out[e] == 0 for d, e in unequal)


@register(*RESHAPE_OPS, cost=CostKind.FREE, fits=_reshape_fits)
def reshape(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)) -> S(d')`` for each leading dim of a reshape block, ``(B) -> B``, ``(P) -> P``
    (N-D products where :func:`reshape_splits_fit`)."""
    x, y = ctx.inputs[0], ctx.outputs[0]
    sigs: list[OneDSignature] = [
        ((Split(d),), (Split(e),)) for d, e in reshape_dim_map(x.shape, y.shape).items()
    ]
    return sigs + _linear_tail(ctx)


@register("reshape_like", cost=CostKind.FREE, fits=_reshape_fits)
def reshape_like(ctx: RuleContext) -> list[OneDSignature]:
    """As ``reshape``; ``like`` follows the output (``B`` when the output is ``P``)."""
    pm = port_map(ctx, ("in", "like"), ("out",))
    x = pm.input("in")
    y = ctx.outputs[0]
    if x is None:
        raise ValueError(f"op {ctx.op.name!r} (reshape_like) needs an input in_0")
    sigs = [
        sig(pm, {"in": Split(d), "like": Split(e)}, {"out": Split(e)})
        for d, e in reshape_dim_map(x.shape, y.shape).items()
    ]
    sigs.append(sig(pm, {}, {}))
    if partial_ok(x, y):
        sigs.append(sig(pm, {"in": P, "like": B}, {"out": P}))
    return sigs


@register("transpose", cost=CostKind.MEMORY)
def transpose(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(perm[j])) -> S(j)`` for every output dim ``j``, ``(B) -> B``, ``(P) -> P``."""
    x = ctx.inputs[0]
    perm = [norm_dim(int(p), x.ndim) for p in ctx.attr("perm", list(range(x.ndim)))]
    sigs: list[OneDSignature] = [((Split(p),), (Split(j),)) for j, p in enumerate(perm)]
    return sigs + _linear_tail(ctx)


@register("expand", cost=CostKind.MEMORY)
def expand(ctx: RuleContext) -> list[OneDSignature]:
    """Kept dim ``(S(i)) -> S(j)``; ``(B) -> B``; ``(P) -> P``.

    No split of an expanded dim: OneFlow 0.9's ``ExpandOp::GetSbp``
    (``oneflow/user/ops/expand_op.cpp``) offers ``S`` only where the input dim equals
    the output's, ``P -> P``, and the all-``B`` signature every user op has.
    """
    x, y = ctx.inputs[0], ctx.outputs[0]
    offset = y.ndim - x.ndim
    sigs: list[OneDSignature] = []
    for j in range(y.ndim):
        i = j - offset
        if 0 <= i < x.ndim and x.shape[i] == y.shape[j]:
            sigs.append(((Split(i),), (Split(j),)))
    return sigs + _linear_tail(ctx)


def _uncut_dims(
    shape: Sequence[int], start: Sequence[int], stop: Sequence[int], step: Sequence[int]
) -> list[int]:
    """Dims a ``slice`` leaves whole: start 0, stop >= size, step 1."""
    dims = []
    for d, size in enumerate(shape):
        if d >= len(start):
            dims.append(d)
            continue
        st = int(start[d])
        sp = int(stop[d])
        stp = int(step[d]) if d < len(step) else 1
        st = st + size if st < 0 else st
        sp = sp + size if sp < 0 else sp
        if st == 0 and sp >= size and stp == 1:
            dims.append(d)
    return dims


def _same_dims(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """Dims where two same-rank shapes agree (the dims a slice or pad leaves whole)."""
    if len(a) != len(b):
        return []
    return [d for d in range(len(a)) if a[d] == b[d]]


@register("slice", "slice_grad", "narrow", "narrow_grad", cost=CostKind.MEMORY)
def slice_like(ctx: RuleContext) -> list[OneDSignature]:
    """Any dim the op leaves whole: ``(S(d)) -> S(d)``; ``(B) -> B``; ``(P) -> P``.

    ``narrow_grad``'s ``like`` input follows the output.
    """
    pm = port_map(ctx, ("dy", "like") if ctx.op.type == "narrow_grad" else ())
    x = ctx.inputs[0]
    y = ctx.outputs[0]
    if ctx.op.type in ("slice", "slice_grad") and ctx.attr("start") is not None:
        shape = x.shape if ctx.op.type == "slice" else y.shape
        whole = _uncut_dims(shape, ctx.attr("start"), ctx.attr("stop"), ctx.attr("step", []))
        whole = [d for d in whole if d in _same_dims(x.shape, y.shape)]
    else:
        whole = _same_dims(x.shape, y.shape)
    sigs = [uniform(ctx, Split(d)) for d in whole]
    sigs.append(uniform(ctx, B))
    if partial_ok(x, y):
        sigs.append(sig(pm, {"like": B}, {}, default=P))
    return sigs


@register("concat", cost=CostKind.MEMORY)
def concat(ctx: RuleContext) -> list[OneDSignature]:
    """All inputs ``S(d)`` for ``d != axis`` ``-> S(d)``; all ``B``; all ``P`` ``-> P``."""
    y = ctx.outputs[0]
    axis = norm_dim(int(ctx.attr("axis", 0)), y.ndim)
    sigs = [uniform(ctx, Split(d)) for d in range(y.ndim) if d != axis]
    return sigs + _linear_tail(ctx)


@register("split_like", cost=CostKind.MEMORY)
def split_like(ctx: RuleContext) -> list[OneDSignature]:
    """``in`` and every ``like`` / ``out`` ``S(d)`` for ``d != axis``; all ``B``;
    ``(P, B...) -> P``."""
    pm = port_map(ctx, ("in", "like"), ("out",))
    x = ctx.inputs[0]
    axis = norm_dim(int(ctx.attr("axis", 0)), x.ndim)
    sigs = [uniform(ctx, Split(d)) for d in range(x.ndim) if d != axis]
    sigs.append(uniform(ctx, B))
    if partial_ok(*ctx.inputs, *ctx.outputs):
        sigs.append(sig(pm, {"in": P, "like": B}, {"out": P}))
    return sigs


@register("stack", cost=CostKind.MEMORY)
def stack(ctx: RuleContext) -> list[OneDSignature]:
    """Every input ``S(d)`` ``-> S(d or d+1)`` (dims after ``axis`` shift); all ``B``; all ``P``."""
    y = ctx.outputs[0]
    x = ctx.inputs[0]
    axis = norm_dim(int(ctx.attr("axis", 0)), y.ndim)
    sigs: list[OneDSignature] = []
    for d in range(x.ndim):
        e = d if d < axis else d + 1
        sigs.append((tuple(Split(d) for _ in ctx.inputs), (Split(e),)))
    return sigs + _linear_tail(ctx)
