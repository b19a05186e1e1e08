"""System ops: variables, inputs, outputs, ticks and schedules, constants and fills.

* ``variable`` (outputs ``{"out": param}``): ``B`` or ``S(d)`` on each axis, never
  ``P`` -- a parameter holds values, not addends;
* ``input``: ``B`` or ``S(d)`` (data parallel is ``S(0)``);
* ``output`` / ``return``: whatever arrives, ``P`` included;
* ticks, callbacks, learning-rate and loss-scale schedules carry control or
  scalars: all ``B``; ``cast_to_tick`` accepts any layout of its data input;
* generators (``constant``, ``normal``, ``arange`` ...) write ``B`` or their
  slice ``S(d)``; ``ones_like`` / ``zero_like`` follow their ``like`` input
  (which lends only its shape, so a ``P`` like gives ``B`` -- or ``P`` for zeros);
* ``hierarchical_parallel_cast`` is OneFlow's layout cast (an identity): its
  ``nd_sbp`` attr fixes the N-D SBP of both ``in`` and ``out`` (OneFlow boxes the
  producer's layout into it on the edge before the op), so it has one N-D
  signature; ``grad_mode`` / ``grad_nd_sbp`` only steer the backward cast, which
  is its own op.  ``hierarchical_parallel_cast_like`` takes ``like``'s layout.
"""

from __future__ import annotations

import itertools

from autopar.ir.sbp import B, NdSbp, P, SbpValue, Signature, Split, local_shape, parse_sbp
from autopar.rules.families._common import all_splits, partial_ok, port_map, sig, uniform
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__ = ["TICK_OPS"]

TICK_OPS = (
    "tick", "sink_tick", "src_tick", "device_tick", "acc_tick", "acc_ctrl_tick",
    "dst_subset_tick", "src_subset_tick", "wait_and_send_ids", "callback_notify",
    "foreign_watch", "learning_rate_schedule", "dynamic_loss_scale_schedule",
    "adam_bias_correction_factor", "esac", "case",
)  # fmt: skip
"""Control and scalar ops: every port ``B``."""


@register("variable", "input", cost=CostKind.FREE)
def source(ctx: RuleContext) -> list[OneDSignature]:
    """``() -> S(d)`` for every dim, ``() -> B``; never ``P``."""
    return _source_signatures(ctx)


def _source_signatures(ctx: RuleContext) -> list[OneDSignature]:
    out = ctx.outputs[0] if ctx.outputs else None
    ndim = out.ndim if out is not None else 0
    return [
        uniform(ctx, B),
        *((tuple(B for _ in ctx.inputs), tuple(s for _ in ctx.outputs)) for s in all_splits(ndim)),
    ]


@register("pipeline_recv", cost=CostKind.RECEIVE)
def received(ctx: RuleContext) -> list[OneDSignature]:
    """A tensor another pipeline stage sends (:mod:`autopar.pipeline.split`): ``() -> S(d)``
    for every dim, ``() -> B``, as a graph input; never ``P`` (the sender completes its sums).
    Its time is the receive of the chosen layout's piece (:func:`autopar.cost.compute.receive_time`)."""
    return _source_signatures(ctx)


@register("output", "return", "foreign_output", cost=CostKind.FREE)
def sink(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)) -> S(d)``, ``(B) -> B``, ``(P) -> P``: the value leaves the step as it is."""
    ndim = ctx.inputs[0].ndim if ctx.inputs else 0
    sigs = [uniform(ctx, B), *(uniform(ctx, s) for s in all_splits(ndim))]
    if partial_ok(*ctx.inputs, *ctx.outputs):
        sigs.append(uniform(ctx, P))
    return sigs


@register(*TICK_OPS, cost=CostKind.FREE)
def tick(ctx: RuleContext) -> list[OneDSignature]:
    """Every port ``B``."""
    return [uniform(ctx, B)]


@register("cast_to_tick", cost=CostKind.FREE)
def cast_to_tick(ctx: RuleContext) -> list[OneDSignature]:
    """``(any) -> B``: only the arrival of the data matters."""
    if not ctx.inputs:
        return [uniform(ctx, B)]
    values: list[SbpValue] = [B, P, *all_splits(ctx.inputs[0].ndim)]
    outs = tuple(B for _ in ctx.outputs)
    return [((v, *(B for _ in ctx.inputs[1:])), outs) for v in values]


@register(
    "constant",
    "empty",
    "normal",
    "uniform",
    "uniform_int",
    "eye",
    "arange",
    "randperm",
    cost=CostKind.MEMORY,
)
def generator(ctx: RuleContext) -> list[OneDSignature]:
    """``() -> B`` and ``() -> S(d)`` (each device writes its slice; ``arange`` ``S(0)`` only,
    ``randperm`` ``B`` only)."""
    out = ctx.outputs[0]
    dims = list(range(out.ndim))
    if ctx.op.type == "arange":
        dims = [0]
    elif ctx.op.type == "randperm":
        dims = []
    return [uniform(ctx, B), *(uniform(ctx, Split(d)) for d in dims)]


@register("ones_like", "zero_like", "zeros_like", cost=CostKind.MEMORY)
def like(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)) -> S(d)``, ``(B) -> B``, ``(P) -> B``; ``zero_like`` also ``(P) -> P``."""
    x = ctx.inputs[0]
    sigs = [uniform(ctx, s) for s in all_splits(x.ndim)]
    sigs += [uniform(ctx, B), ((P,), (B,))]
    if ctx.op.type != "ones_like" and partial_ok(*ctx.outputs):
        sigs.append(uniform(ctx, P))
    return sigs


@register("fill_", "fill_tensor_", cost=CostKind.MEMORY)
def fill(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)[, B]) -> S(d)``, all ``B``; a filled value is not an addend (no ``P``)."""
    pm = port_map(ctx, ("in", "value"), ("out",))
    x = pm.input("in") or ctx.inputs[0]
    sigs = [sig(pm, {"in": s, "value": B}, {"out": s}) for s in all_splits(x.ndim)]
    return [*sigs, uniform(ctx, B)]


@register("assign", cost=CostKind.MEMORY)
def assign(ctx: RuleContext) -> list[OneDSignature]:
    """``ref`` and ``value`` alike: ``S(d)`` or ``B``."""
    x = ctx.inputs[0]
    return [uniform(ctx, s) for s in all_splits(x.ndim)] + [uniform(ctx, B)]


def _target_layout(ctx: RuleContext) -> NdSbp | None:
    """The ``nd_sbp`` attr as an :class:`NdSbp` on the mesh, or None if absent or unreadable.

    One value on a multi-axis mesh applies to every axis (OneFlow's 1-D form).
    """
    raw = ctx.attr("nd_sbp")
    if isinstance(raw, str):
        raw = [raw]
    if not raw:
        return None
    try:
        values = [parse_sbp(str(v).strip()) for v in raw]
    except ValueError:
        return None
    n = len(ctx.mesh_shape)
    if len(values) == 1 and n > 1:
        values = values * n
    if len(values) != n:
        return None
    return NdSbp(tuple(values))


@register("hierarchical_parallel_cast", cost=CostKind.FREE, nd=True)
def hierarchical_parallel_cast(ctx: RuleContext) -> list[Signature]:
    """``in`` and ``out`` both take the ``nd_sbp`` attr (one N-D signature; the boxing into it
    is the edge's).  Without a readable ``nd_sbp``: any layout, ``in`` = ``out`` (an identity)."""
    target = _target_layout(ctx)
    specs = (*ctx.inputs, *ctx.outputs)
    if target is not None and all(local_shape(s.shape, target, ctx.mesh_shape) is not None for s in specs):
        return [Signature(tuple(target for _ in ctx.inputs), tuple(target for _ in ctx.outputs))]
    ndim = ctx.inputs[0].ndim if ctx.inputs else 0
    one_d: list[SbpValue] = [B, *all_splits(ndim)]
    if partial_ok(*specs):
        one_d.append(P)
    sigs = []
    for combo in itertools.product(one_d, repeat=len(ctx.mesh_shape)):
        nd = NdSbp(tuple(combo))
        sigs.append(Signature(tuple(nd for _ in ctx.inputs), tuple(nd for _ in ctx.outputs)))
    return sigs


@register("hierarchical_parallel_cast_like", cost=CostKind.FREE)
def hierarchical_parallel_cast_like(ctx: RuleContext) -> list[OneDSignature]:
    """``(in, like) -> out``: all three take ``like``'s layout: ``S(d)``, ``B``, ``P``."""
    ndim = ctx.inputs[0].ndim if ctx.inputs else 0
    sigs = [uniform(ctx, B), *(uniform(ctx, s) for s in all_splits(ndim))]
    if partial_ok(*ctx.inputs, *ctx.outputs):
        sigs.append(uniform(ctx, P))
    return sigs
