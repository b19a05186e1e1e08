"""Embedding lookups and their gradients: ``gather``, ``embedding``,
``unsorted_segment_sum(_like)``, ``embedding_grad``, ``one_hot``.

``out = gather(in [V, H], indices [N...], axis=0)`` has shape ``[N..., H]``:

* ``(B, S(i)) -> S(i)``: split the indices (data parallel);
* ``(S(1), B) -> S(last)``: split the hidden dim of the table;
* ``(S(0), B) -> P``: vocab-parallel table (Megatron's VocabParallelEmbedding):
  each device looks up the ids in its row range, writes zeros for the others,
  and the sum over devices is the full lookup;
* ``(P, B) -> P`` (linear in the table), ``(B, B) -> B``.

Its gradient ``out [V, H] = unsorted_segment_sum_like(data [N..., H],
segment_ids [N...], like [V, H])`` adds each row of ``data`` into row
``segment_ids`` of ``out``:

* ``(S(i), S(i), B) -> P``: split the ids (data parallel) -> partial weight
  gradient, reduced later (all-reduce, or reduce-scatter under ZeRO);
* ``(B, B, S(0)) -> S(0)``: vocab-parallel table: every device keeps the rows it
  owns (the backward of the vocab-parallel lookup, whose ``P`` output's
  gradient arrives as ``B``);
* ``(S(last), B, S(1)) -> S(1)``: hidden split;
* ``(P, B, B) -> P``, ``(B, B, B) -> B``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from autopar.ir.sbp import B, P, Split
from autopar.rules.families._common import norm_dim, partial_ok, port_map, sig, uniform
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__: list[str] = []

_GATHER_PORTS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {"gather": ("in", "indices"), "embedding": ("weight", "indices")}
)
_SEGMENT_PORTS: Mapping[str, tuple[tuple[str, ...], str, str, str]] = MappingProxyType(
    {
        # op: (OneFlow's declared inputs, data port, segment-ids port, like port)
        "unsorted_segment_sum_like": (("data", "segment_ids", "like"), "data", "segment_ids", "like"),
        "unsorted_segment_sum": (("data", "segment_ids"), "data", "segment_ids", "like"),
        "embedding_grad": (("dy", "weight", "indices"), "dy", "indices", "weight"),
    }
)


@register("gather", "embedding", cost=CostKind.MEMORY)
def gather(ctx: RuleContext) -> list[OneDSignature]:
    """``(B, S(i)) -> S(axis+i)``; ``(S(d), B) -> S(d')`` for ``d != axis``;
    ``(S(axis), B) -> P`` (vocab-parallel); ``(P, B) -> P``; ``(B, B) -> B``."""
    table_name, ids_name = _GATHER_PORTS[ctx.op.type]
    pm = port_map(ctx, (table_name, ids_name), ("out",))
    table = pm.input(table_name)
    ids = pm.input(ids_name)
    if table is None or ids is None:
        raise ValueError(f"op {ctx.op.name!r} ({ctx.op.type}) needs inputs {table_name}_0 and {ids_name}_0")
    axis = norm_dim(int(ctx.attr("axis", 0)), table.ndim)
    sigs = [sig(pm, {table_name: B, ids_name: Split(i)}, {"out": Split(axis + i)}) for i in range(ids.ndim)]
    for d in range(table.ndim):
        if d == axis:
            continue
        e = d if d < axis else d - 1 + ids.ndim
        sigs.append(sig(pm, {table_name: Split(d), ids_name: B}, {"out": Split(e)}))
    sigs.append(uniform(ctx, B))
    if partial_ok(table, *ctx.outputs):
        sigs.append(sig(pm, {table_name: Split(axis), ids_name: B}, {"out": P}))
        sigs.append(sig(pm, {table_name: P, ids_name: B}, {"out": P}))
    return sigs


@register(*_SEGMENT_PORTS, cost=CostKind.MEMORY)
def unsorted_segment_sum(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(axis+i), S(i), B) -> P``; ``(B, B, S(axis)) -> S(axis)`` (vocab shard);
    other dims of ``data`` map to ``out``; ``(P, B, B) -> P``; ``(B, B, B) -> B``."""
    declared, data_name, ids_name, like_name = _SEGMENT_PORTS[ctx.op.type]
    out_name = "dx" if ctx.op.type == "embedding_grad" else "out"
    pm = port_map(ctx, declared, (out_name,))
    data = pm.input(data_name)
    ids = pm.input(ids_name)
    out = ctx.outputs[0]
    if data is None or ids is None:
        raise ValueError(f"op {ctx.op.name!r} ({ctx.op.type}) needs inputs {data_name}_0 and {ids_name}_0")
    axis = norm_dim(int(ctx.attr("axis", 0)), out.ndim)
    float_out = partial_ok(*ctx.outputs)
    sigs: list[OneDSignature] = []
    if float_out:
        sigs += [
            sig(pm, {data_name: Split(axis + i), ids_name: Split(i), like_name: B}, {out_name: P})
            for i in range(ids.ndim)
        ]
    for e in range(out.ndim):
        if e == axis:
            continue
        d = e if e < axis else e - 1 + ids.ndim
        sigs.append(sig(pm, {data_name: Split(d), ids_name: B, like_name: Split(e)}, {out_name: Split(e)}))
    sigs.append(sig(pm, {data_name: B, ids_name: B, like_name: Split(axis)}, {out_name: Split(axis)}))
    sigs.append(uniform(ctx, B))
    if float_out and partial_ok(data):
        sigs.append(sig(pm, {data_name: P, ids_name: B, like_name: B}, {out_name: P}))
    return sigs


@register("one_hot", cost=CostKind.MEMORY)
def one_hot(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)) -> S(d)`` for every dim of ``indices``, ``(B) -> B``."""
    ids = ctx.inputs[0]
    return [((Split(d),), (Split(d),)) for d in range(ids.ndim)] + [((B,), (B,))]
