"""Convolutions: ``conv1d`` / ``conv2d`` / ``conv3d`` and their gradients.

From OneFlow 0.9's ``oneflow/user/ops/conv_op.cpp`` (``GetSbpSignatures4Conv`` and the
gradients' ``GetSbp``): a convolution splits only its batch; every user op also runs
whole (all ``B``).

* ``conv*d(in, weight[, bias]) -> out``: ``(S(0), B, B) -> S(0)``; all ``B``;
* ``conv_data_grad(dy, filter, x_like[, _add_to_output]) -> dx``: ``dy``, ``x_like``,
  ``dx`` (and ``_add_to_output``) ``S(0)``, ``filter`` ``B``; all ``B``;
* ``conv_filter_grad(dy, x) -> filter_diff``: ``(S(0), S(0)) -> P`` (each rank's batch
  adds its part of the filter gradient); all ``B``;
* ``conv_bias_grad(dy) -> bias_diff``: ``(S(0)) -> P``; all ``B``.
"""

from __future__ import annotations

from autopar.ir.sbp import B, P, Split
from autopar.rules.families._common import partial_ok, port_map, sig, uniform
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__: list[str] = []


@register("conv1d", "conv2d", "conv3d", cost=CostKind.MEMORY)
def conv(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(0), B, B) -> S(0)``; all ``B``."""
    pm = port_map(ctx, ("in", "weight", "bias"), ("out",))
    return [sig(pm, {"in": Split(0)}, {"out": Split(0)}), uniform(ctx, B)]


@register("conv_data_grad", cost=CostKind.MEMORY)
def conv_data_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``dy``, ``x_like``, ``_add_to_output`` and ``dx`` ``S(0)``, ``filter`` ``B``; all ``B``."""
    pm = port_map(ctx, ("dy", "filter", "x_like", "_add_to_output"), ("dx",))
    batch = Split(0)
    return [
        sig(pm, {"dy": batch, "x_like": batch, "_add_to_output": batch}, {"dx": batch}),
        uniform(ctx, B),
    ]


@register("conv_filter_grad", cost=CostKind.MEMORY)
def conv_filter_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(0), S(0)) -> P``; all ``B``."""
    pm = port_map(ctx, ("dy", "x"), ("filter_diff",))
    sigs = [uniform(ctx, B)]
    if partial_ok(*ctx.outputs):
        sigs.insert(0, sig(pm, {"dy": Split(0), "x": Split(0)}, {"filter_diff": P}))
    return sigs


@register("conv_bias_grad", cost=CostKind.MEMORY)
def conv_bias_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(0)) -> P``; all ``B``."""
    pm = port_map(ctx, ("dy",), ("bias_diff",))
    sigs = [uniform(ctx, B)]
    if partial_ok(*ctx.outputs):
        sigs.insert(0, sig(pm, {"dy": Split(0)}, {"bias_diff": P}))
    return sigs
