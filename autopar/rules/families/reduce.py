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
output's layout (``B`` when the output is ``P``).
"""

from __future__ import annotations

from autopar.rules.families._common import norm_dims, partial_ok, port_map, sig
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register
from autopar.sbp import B, P, SbpValue, Split

__all__ = ["LINEAR_REDUCE_OPS", "ORDER_REDUCE_OPS", "kept_dim_map"]

LINEAR_REDUCE_OPS = ("reduce_sum", "reduce_mean")
ORDER_REDUCE_OPS = ("reduce_max", "reduce_min", "reduce_prod", "reduce_all", "reduce_any")


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

    Kept dim: ``(S(d), S(d')) -> S(d')``; reduced dim: ``(S(d), B) -> P``;
    ``(P, B) -> P``; ``(B, B) -> B``.
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
        sigs.append(sig(pm, {"x": P, "like": B}, {"y": P}))
    sigs.append(sig(pm, {}, {}))
    return sigs


@register("broadcast_like", cost=CostKind.MEMORY)
def broadcast_like(ctx: RuleContext) -> list[OneDSignature]:
    """``y = broadcast x along broadcast_axes`` to ``like``'s shape.

    A dim ``x`` has: ``(S(d), S(e)) -> S(e)``; an added dim: ``(B, S(e)) -> S(e)``;
    ``(P, B) -> P``; ``(B, B) -> B``.
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
