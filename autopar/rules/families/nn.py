"""Neural-network layers: softmax (plain and fused), dropout, bias add, layer norm, RMS norm.

1-D signatures:

* softmax-like ops normalise over the last dim: any other dim may be split
  (``(S(d)) -> S(d)``, ``d < last``), never the last, never ``P`` out
  (``softmax(a) + softmax(b) != softmax(a + b)``).  Their gradients are linear in
  ``dy``: ``(y B, dy P) -> P``.  The causal (``tril``) variants also keep the
  second-to-last dim whole;
* ``dropout``: ``S(d)`` on any dim, ``B``; no ``P`` (a mask applied to each addend
  is not the mask of the sum unless every rank draws the same mask);
  ``dropout_grad`` is linear in ``dy``;
* ``bias_add`` (``a`` ``[.., C, ..]``, ``b`` ``[C]`` at ``axis``): ``(S(d), B) -> S(d)``
  for ``d != axis``, ``(S(axis), S(0)) -> S(axis)``, ``(P, P) -> P``;
* ``layer_norm`` / ``rms_norm``: split a dim before the normalised ones only
  (``(S(d), B) -> (S(d), S(d))`` with the statistics split alike); the
  gradient ``dx`` is linear in ``dy``; the parameter gradients sum over rows,
  so a row split gives ``P`` (data-parallel weight gradients) and a split of a
  normalised dim splits the parameter gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from autopar.ir.sbp import B, P, SbpValue, Split
from autopar.rules.families._common import (
    norm_dim,
    partial_ok,
    port_map,
    sig,
    uniform,
)
from autopar.rules.families.elementwise import broadcast_splits, linear_signatures
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__ = ["SOFTMAX_GRAD_OPS", "SOFTMAX_OPS"]

SOFTMAX_OPS: Mapping[str, tuple[tuple[str, ...], int]] = MappingProxyType(
    {
        "softmax": (("in",), 1),
        "log_softmax": (("in",), 1),
        "fused_scale_mask_softmax": (("x", "mask"), 1),
        "fused_scale_mask_softmax_dropout": (("x", "mask", "dropout_mask"), 1),
        "fused_tril_scale_softmax_mask_scale": (("x", "mask"), 2),
    }
)
"""Softmax-like forward ops: declared inputs, and how many trailing dims stay whole."""

SOFTMAX_GRAD_OPS: Mapping[str, tuple[tuple[str, ...], int]] = MappingProxyType(
    {
        "softmax_grad": (("y", "dy"), 1),
        "log_softmax_grad": (("prob", "dy"), 1),
        "fused_scale_mask_softmax_grad": (("y", "dy", "mask"), 1),
        "fused_scale_mask_softmax_dropout_grad": (("softmax_y", "dy", "mask", "dropout_mask"), 1),
        "fused_tril_scale_softmax_mask_scale_grad": (("softmax_y", "dy", "mask"), 2),
    }
)
"""Softmax-like gradients (linear in ``dy``): declared inputs and trailing whole dims."""


def _splits_before(ctx: RuleContext, limit: int) -> list[OneDSignature]:
    """Element-wise splits whose output dim is below ``limit``."""
    keep = []
    for ins, outs in broadcast_splits(ctx):
        value = outs[0]
        if isinstance(value, Split) and value.dim < limit:
            keep.append((ins, outs))
    return keep


@register(*SOFTMAX_OPS, cost=CostKind.MEMORY)
def softmax(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)) -> S(d)`` for ``d < last`` (``< last-1`` for causal variants), ``(B) -> B``;
    never a split of the softmax dim, never ``P``."""
    _, whole = SOFTMAX_OPS[ctx.op.type]
    limit = ctx.outputs[0].ndim - whole
    return [*_splits_before(ctx, limit), uniform(ctx, B)]


@register(*SOFTMAX_GRAD_OPS, cost=CostKind.MEMORY)
def softmax_grad(ctx: RuleContext) -> list[OneDSignature]:
    """As ``softmax``, plus ``dy`` ``P`` with the rest ``B`` ``-> P``."""
    declared, whole = SOFTMAX_GRAD_OPS[ctx.op.type]
    pm = port_map(ctx, declared)
    limit = ctx.outputs[0].ndim - whole
    sigs = [*_splits_before(ctx, limit), uniform(ctx, B)]
    dy = {i for i, name in enumerate(pm.inputs) if name == "dy"}
    return sigs + linear_signatures(ctx, dy)


@register("dropout", "random_mask_like", cost=CostKind.MEMORY)
def dropout(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)) -> (S(d), S(d))`` for every dim, ``(B) -> (B, B)``; no ``P``."""
    return [*broadcast_splits(ctx), uniform(ctx, B)]


def _bias_axis(ctx: RuleContext, a_ndim: int) -> int:
    return norm_dim(int(ctx.attr("axis", a_ndim - 1)), a_ndim)


def _bias_splits(ctx: RuleContext, a_ndim: int) -> list[tuple[dict[str, SbpValue], SbpValue]]:
    """(input values, output value) for each dim of ``a``: ``b`` ``B`` or ``S(0)`` on ``axis``."""
    axis = _bias_axis(ctx, a_ndim)
    out: list[tuple[dict[str, SbpValue], SbpValue]] = []
    for d in range(a_ndim):
        ins: dict[str, SbpValue] = {"a": Split(d), "b": Split(0) if d == axis else B}
        for name in ("dy", "mask", "_add_to_output"):
            ins[name] = Split(d)
        out.append((ins, Split(d)))
    return out


@register("bias_add", "fused_bias_add_gelu", "fused_bias_add_mask_scale", cost=CostKind.MEMORY)
def bias_add(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d), B) -> S(d)``, ``(S(axis), S(0)) -> S(axis)``, ``(B, B) -> B``;
    ``(P, P) -> P`` for ``bias_add`` and ``fused_bias_add_mask_scale`` (mask ``B``)."""
    pm = port_map(ctx, ("a", "b", "mask", "_add_to_output"), ("out",))
    a = pm.input("a")
    if a is None:
        raise ValueError(f"op {ctx.op.name!r} ({ctx.op.type}) needs an input a_0")
    sigs = [sig(pm, ins, {"out": o}) for ins, o in _bias_splits(ctx, a.ndim)]
    sigs.append(uniform(ctx, B))
    if ctx.op.type != "fused_bias_add_gelu" and partial_ok(a, *ctx.outputs):
        sigs.append(sig(pm, {"a": P, "b": P, "mask": B, "_add_to_output": P}, {"out": P}))
    return sigs


@register("fused_bias_add_gelu_grad", cost=CostKind.MEMORY)
def bias_add_gelu_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(a, b, dy) -> dx``: the ``bias_add`` splits with ``dy`` like ``a``; ``(B, B, P) -> P``."""
    pm = port_map(ctx, ("a", "b", "dy"), ("dx",))
    a = pm.input("a")
    if a is None:
        raise ValueError(f"op {ctx.op.name!r} ({ctx.op.type}) needs an input a_0")
    sigs = [sig(pm, ins, {"dx": o}) for ins, o in _bias_splits(ctx, a.ndim)]
    sigs.append(uniform(ctx, B))
    if partial_ok(*ctx.outputs):
        sigs.append(sig(pm, {"dy": P}, {"dx": P}))
    return sigs


# ------------------------------------------------------------------ normalisation


def _stat_begin(x_ndim: int, x_shape: tuple[int, ...], stat_shape: tuple[int, ...]) -> int:
    """First normalised dim, read off a statistics tensor (``mean``, ``inv_rms``).

    OneFlow's statistics have the shape of ``x``'s leading (row) dims.
    """
    if len(stat_shape) < x_ndim:
        return len(stat_shape)
    begin = 0
    while begin < x_ndim and stat_shape[begin] == x_shape[begin] and x_shape[begin] != 1:
        begin += 1
    return begin


def _norm_forward(
    ctx: RuleContext,
    x_name: str,
    params: tuple[str, ...],
    begin: int,
    params_begin: int,
    declared_in: tuple[str, ...],
    declared_out: tuple[str, ...],
) -> list[OneDSignature]:
    """Row splits ``d < begin``: x, outputs and statistics ``S(d)``, params ``B``
    (or ``S(d - params_begin)`` if the params cover ``d``)."""
    pm = port_map(ctx, declared_in, declared_out)
    sigs: list[OneDSignature] = []
    for d in range(begin):
        ins: dict[str, SbpValue] = {x_name: Split(d)}
        for p in params:
            ins[p] = Split(d - params_begin) if d >= params_begin else B
        outs: dict[str, SbpValue] = {}
        for name, spec in zip(pm.outputs, pm.output_specs, strict=True):
            outs[name] = Split(d) if d < spec.ndim else B
        sigs.append(sig(pm, ins, outs))
    sigs.append(uniform(ctx, B))
    return sigs


@register("layer_norm", cost=CostKind.MEMORY)
def layer_norm(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d), B, B) -> (S(d), S(d), S(d))`` for ``d < begin_norm_axis``; ``B``; no ``P``."""
    pm = port_map(ctx, ("x", "beta", "gamma"), ("y", "mean", "inv_variance"))
    x = pm.input("x") or ctx.inputs[0]
    begin = norm_dim(int(ctx.attr("begin_norm_axis", x.ndim - 1)), x.ndim)
    params_begin = norm_dim(int(ctx.attr("begin_params_axis", begin)), x.ndim)
    return _norm_forward(
        ctx,
        "x",
        ("beta", "gamma"),
        begin,
        params_begin,
        ("x", "beta", "gamma"),
        ("y", "mean", "inv_variance"),
    )


@register("rms_norm", cost=CostKind.MEMORY)
def rms_norm(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d), B) -> (S(d), S(d))`` for ``d`` before ``normalized_shape``; ``B``; no ``P``."""
    pm = port_map(ctx, ("x", "weight"), ("y", "inv_rms"))
    x = pm.input("x") or ctx.inputs[0]
    normalized = ctx.attr("normalized_shape")
    begin = x.ndim - len(normalized) if normalized is not None else x.ndim - 1
    return _norm_forward(ctx, "x", ("weight",), begin, begin, ("x", "weight"), ("y", "inv_rms"))


def _norm_grad(
    ctx: RuleContext,
    declared: tuple[str, ...],
    stats: tuple[str, ...],
    params: tuple[str, ...],
    begin: int,
    params_begin: int,
) -> list[OneDSignature]:
    pm = port_map(ctx, declared, ("dx",))
    sigs: list[OneDSignature] = []
    for d in range(begin):
        ins: dict[str, SbpValue] = {}
        for name, spec in zip(pm.inputs, pm.input_specs, strict=True):
            if name in stats:
                ins[name] = Split(d) if d < spec.ndim else B
            elif name in params:
                ins[name] = Split(d - params_begin) if d >= params_begin else B
            else:
                ins[name] = Split(d)
        sigs.append(sig(pm, ins, {"dx": Split(d)}))
    sigs.append(uniform(ctx, B))
    if partial_ok(*ctx.outputs):
        sigs.append(sig(pm, {"dy": P, "_add_to_output": P}, {"dx": P}))
    return sigs


@register("layer_norm_grad", cost=CostKind.MEMORY)
def layer_norm_grad(ctx: RuleContext) -> list[OneDSignature]:
    """Row splits of ``dy``, ``x``, statistics -> ``dx`` ``S(d)``; ``B``;
    ``dy`` ``P`` (rest ``B``) ``-> P``."""
    declared = ("dy", "x", "mean", "inv_variance", "gamma", "_add_to_output")
    pm = port_map(ctx, declared)
    x = pm.input("x") or ctx.inputs[0]
    begin = norm_dim(int(ctx.attr("begin_norm_axis", x.ndim - 1)), x.ndim)
    params_begin = norm_dim(int(ctx.attr("begin_params_axis", begin)), x.ndim)
    return _norm_grad(ctx, declared, ("mean", "inv_variance"), ("gamma",), begin, params_begin)


@register("rms_norm_grad", cost=CostKind.MEMORY)
def rms_norm_grad(ctx: RuleContext) -> list[OneDSignature]:
    """Row splits -> ``dx`` ``S(d)``; ``B``; ``dy`` ``P`` (rest ``B``) ``-> P``."""
    declared = ("dy", "x", "inv_rms", "weight")
    pm = port_map(ctx, declared)
    x = pm.input("x") or ctx.inputs[0]
    stat = pm.input("inv_rms")
    begin = _stat_begin(x.ndim, x.shape, stat.shape) if stat is not None else x.ndim - 1
    return _norm_grad(ctx, declared, ("inv_rms",), ("weight",), begin, begin)


def _param_grad(
    ctx: RuleContext,
    declared: tuple[str, ...],
    stats: tuple[str, ...],
    params_begin: int,
) -> list[OneDSignature]:
    """Parameter gradients: a row split (a dim before the parameter dims) of every input
    ``-> P``, and ``B``.  OneFlow 0.9 offers nothing else (``LayerNormParamGradOp::GetSbp``
    and ``RmsNormParamGradOp::GetSbp`` in ``oneflow/user/ops/layer_norm_op.cpp`` and
    ``rms_norm_op.cpp``: ``Split(inputs, i).PartialSum(outputs)`` for ``i`` below the
    parameter dims): a split of a parameter dim, or a partial ``dy``, is refused when pinned."""
    pm = port_map(ctx, declared)
    sigs: list[OneDSignature] = []
    if partial_ok(*ctx.outputs):
        for d in range(params_begin):
            ins: dict[str, SbpValue] = {
                name: Split(d) if name not in stats or d < spec.ndim else B
                for name, spec in zip(pm.inputs, pm.input_specs, strict=True)
            }
            sigs.append(sig(pm, ins, {}, out_default=P))
    sigs.append(uniform(ctx, B))
    return sigs


@register("layer_norm_param_grad", cost=CostKind.MEMORY)
def layer_norm_param_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(dy, x, mean, inv_variance) -> (beta_diff, gamma_diff)``: row split ``-> (P, P)``, ``B``."""
    declared = ("dy", "x", "mean", "inv_variance")
    pm = port_map(ctx, declared)
    x = pm.input("x") or ctx.inputs[0]
    params_begin = norm_dim(int(ctx.attr("begin_params_axis", x.ndim - 1)), x.ndim)
    return _param_grad(ctx, declared, ("mean", "inv_variance"), params_begin)


@register("rms_norm_param_grad", cost=CostKind.MEMORY)
def rms_norm_param_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(dy, x, inv_rms) -> weight_grad``: row split ``-> P``, ``B``."""
    declared = ("dy", "x", "inv_rms")
    pm = port_map(ctx, declared)
    x = pm.input("x") or ctx.inputs[0]
    stat = pm.input("inv_rms")
    begin = _stat_begin(x.ndim, x.shape, stat.shape) if stat is not None else x.ndim - 1
    return _param_grad(ctx, declared, ("inv_rms",), begin)
