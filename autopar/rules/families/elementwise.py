"""Element-wise ops: unary, binary with numpy broadcasting, their gradients.

1-D signatures (``x`` the data input, ``dy`` the incoming gradient):

* every op: ``S(d)`` on every output dim ``d`` with each input split on the dim
  that carries ``d`` (``B`` where the input broadcasts: a missing or size-1
  dim), and all ``B``;
* ``P`` only where the op is linear in that input with the others fixed:

  - identity-like and scaling ops (``identity``, ``scalar_mul``, ``cast``
    between float dtypes ...): ``(P) -> P``;
  - ``broadcast_add`` / ``broadcast_sub`` / ``add_n``: all ``P`` ``-> P``;
  - ``broadcast_mul`` / ``multiply``: one input ``P``, the others ``B``;
  - ``broadcast_div``: ``(P, B) -> P``; ``where``: ``(B, P, P) -> P``;
  - a gradient ``(x, dy) -> dx`` is linear in ``dy``: ``(B, P) -> P`` (except
    ``rsqrt_grad`` and ``square_grad``, which OneFlow 0.9 refuses with ``dy`` ``P``);
  - binary gradients whose output is smaller than ``dz`` (``broadcast_div_grad``)
    sum over the broadcast dims, so splitting such a dim gives ``P``;
    ``broadcast_div_grad`` is also linear in ``z``: ``(dz B, z P, y B) -> P``.

Non-linear ops (``relu``, ``gelu``, ``scalar_add``, ``scalar_pow``, ``dropout``
...) never take or give ``P``: ``relu(a) + relu(b) != relu(a + b)``.  ``P`` is
offered only on floating-point tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from autopar.ir.sbp import B, P, SbpValue, Split
from autopar.rules.families._common import (
    broadcast_dim_map,
    is_float,
    partial_ok,
    port_map,
    uniform,
)
from autopar.rules.registry import CostKind, OneDSignature, RuleContext, register

__all__ = [
    "BINARY_GRAD_OPS",
    "BROADCAST_OPS",
    "LINEAR_UNARY_OPS",
    "NO_PARTIAL_GRAD_OPS",
    "UNARY_GRAD_OPS",
    "UNARY_OPS",
]

# ------------------------------------------------------------------ op lists

UNARY_OPS: tuple[str, ...] = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "celu", "cos",
    "cosh", "elu", "erf", "erfc", "erfinv", "exp", "expm1", "fast_gelu", "floor", "gelu",
    "hardshrink", "hardsigmoid", "hardswish", "hardtanh", "isfinite", "isinf", "isnan",
    "leaky_relu", "lgamma", "log", "log1p", "log2", "log10", "log_sigmoid", "logical_not",
    "mish", "not_equal_zero", "reciprocal", "reciprocal_no_nan", "relu", "rint", "round",
    "rsqrt", "selu", "sigmoid", "sigmoid_v2", "sign", "silu", "sin", "sinh", "softplus",
    "softshrink", "softsign", "sqrt", "square", "tan", "tanh", "threshold", "trunc",
    "clip_by_scalar", "clip_by_scalar_min", "clip_by_scalar_max",
    "scalar_add", "scalar_pow", "scalar_reverse_pow", "scalar_fmod", "scalar_floordiv",
    "scalar_logical_and", "scalar_logical_equal", "scalar_logical_greater",
    "scalar_logical_greater_equal", "scalar_logical_less", "scalar_logical_less_equal",
    "scalar_logical_not_equal", "scalar_logical_or", "scalar_logical_xor",
    # linear, but a math unary op in OneFlow 0.9 (math_unary_elementwise_op.cpp:
    # GetSbpFnUtil::SplitForEachAxis, no P): its compiled jobs box a P input to S first
    "negative",
)  # fmt: skip
"""Unary ops that are not linear, or that OneFlow 0.9 gives no ``P``: ``S(d)`` and ``B`` only."""

LINEAR_UNARY_OPS: tuple[str, ...] = (
    "identity", "amp_white_identity", "amp_black_identity", "pinned_identity", "copy",
    "to_contiguous", "cast_to_static_shape", "identity_buffer", "nvtx_start", "nvtx_end",
    "scalar_mul", "scalar_div", "cast", "mutable_cast_once",
)  # fmt: skip
"""Unary ops linear in their input: also ``(P) -> P`` (``cast`` only between float dtypes)."""

UNARY_GRAD_OPS: Mapping[str, tuple[str, str]] = MappingProxyType({
    **{
        f"{name}_grad": ("x", "dy")
        for name in (
            "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "celu",
            "cos", "cosh", "elu", "erf", "erfc", "exp", "expm1", "fast_gelu", "floor",
            "gelu", "hardsigmoid", "hardswish", "leaky_relu", "lgamma", "log", "log1p",
            "log2", "log10", "log_sigmoid", "mish", "negative", "reciprocal",
            "reciprocal_no_nan", "rint", "round", "rsqrt", "selu", "sign", "silu", "sin",
            "sinh", "softplus", "softsign", "sqrt", "square", "tan", "tanh", "threshold",
            "trunc", "not_equal_zero", "scalar_pow", "scalar_reverse_pow",
        )
    },
    **{f"{name}_grad": ("y", "dy") for name in (
        "relu", "sigmoid", "sigmoid_v2", "hardtanh", "hardshrink", "softshrink",
    )},
    **{f"{name}_grad": ("dy", "x") for name in (
        "clip_by_scalar", "clip_by_scalar_min", "clip_by_scalar_max",
    )},
    "dropout_grad": ("dy", "mask"),
    "fused_relu_dropout_grad": ("dy", "mask"),
})  # fmt: skip
"""``(x or y, dy) -> dx`` gradients (OneFlow's declared input order); linear in ``dy``."""

NO_PARTIAL_GRAD_OPS: frozenset[str] = frozenset({"rsqrt_grad", "square_grad", "negative_grad"})
"""Unary gradients OneFlow 0.9 refuses with ``dy`` ``P`` (though linear in ``dy``): no ``P``."""

BROADCAST_OPS: Mapping[str, tuple[tuple[str, ...], str]] = MappingProxyType({
    **{name: (("x", "y"), "all") for name in ("broadcast_add", "broadcast_sub")},
    **{name: (("x", "y"), "any") for name in ("broadcast_mul", "multiply")},
    "broadcast_div": (("x", "y"), "x"),
    **{name: (("x", "scalar"), "all") for name in (
        "scalar_add_by_tensor", "scalar_sub_by_tensor",
    )},
    "scalar_mul_by_tensor": (("x", "scalar"), "x"),
    "scalar_div_by_tensor": (("x", "scalar"), "x"),
    "fused_cast_scale": (("x", "scale_by_tensor"), "x"),
    "add_n": (("in",), "all"),
    "where": (("condition", "x", "y"), "x+y"),
    **{name: (("x", "y"), "none") for name in (
        "broadcast_pow", "broadcast_maximum", "broadcast_minimum", "broadcast_floor_mod",
        "broadcast_fmod", "broadcast_equal", "broadcast_not_equal", "broadcast_greater",
        "broadcast_greater_equal", "broadcast_less", "broadcast_less_equal",
        "broadcast_logical_and", "broadcast_logical_or", "broadcast_logical_xor",
        "elementwise_maximum", "elementwise_minimum", "pow", "floordiv", "xdivy", "xlogy",
        "atan2",
    )},
    "masked_fill": (("x", "mask"), "none"),
    "where_scalar_x": (("condition", "y"), "none"),
    "where_scalar_y": (("condition", "x"), "none"),
})  # fmt: skip
"""Broadcasting n-ary ops: declared inputs and which inputs may be ``P`` together.

``all``: every input ``P``; ``any``: one input ``P`` and the rest ``B``; a port
name (or ``a+b``): those ports ``P``, the rest ``B``; ``none``: no ``P``.
"""

BINARY_GRAD_OPS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "broadcast_div_grad": ("y", "z", "dz"),
    "broadcast_pow_x_grad": ("x", "y", "z", "dz"),
    "broadcast_pow_y_grad": ("x", "y", "z", "dz"),
    **{name: ("x", "y", "dz") for name in (
        "pow_x_grad", "pow_y_grad", "xdivy_x_grad", "xdivy_y_grad", "xlogy_x_grad",
        "xlogy_y_grad", "atan2_x_grad", "atan2_y_grad", "floordiv_x_grad", "floordiv_y_grad",
    )},
    "elementwise_minimum_backward": ("dz", "x", "y"),
    "elementwise_maximum_backward": ("dz", "x", "y"),
})  # fmt: skip
"""Gradients of binary ops, linear in ``dz``; outputs smaller than ``dz`` sum (``P``)."""

LINEAR_GRAD_INPUTS: Mapping[str, tuple[str, ...]] = MappingProxyType({"broadcast_div_grad": ("z",)})
"""Other inputs a binary gradient is linear in: ``broadcast_div_grad``'s ``dy = -dz * z / y``
is linear in ``z`` too; OneFlow 0.9 offers ``(y B, z P, dz B) -> dy P``
(``oneflow/user/ops/broadcast_div_grad_op.cpp``, ``BroadcastDivGradOp::GetSbp``) and its
inference takes it for a mean loss whose sum is a partial sum (the held-out jobs)."""


# ------------------------------------------------------------------ shared builders


def broadcast_splits(ctx: RuleContext) -> list[OneDSignature]:
    """One signature per output dim ``d``: ``S(d)`` out, inputs split where they hold ``d``.

    All outputs share the first output's shape (element-wise ops).  An input
    that broadcasts along ``d`` (missing or size 1) takes ``B``.
    """
    full = ctx.outputs[0].shape if ctx.outputs else ctx.inputs[0].shape
    maps = [broadcast_dim_map(spec.shape, full) for spec in ctx.inputs]
    out_maps = [broadcast_dim_map(spec.shape, full) for spec in ctx.outputs]
    sigs: list[OneDSignature] = []
    for d in range(len(full)):
        if not any(d in m for m in maps):
            continue
        ins: tuple[SbpValue, ...] = tuple(Split(m[d]) if d in m else B for m in maps)
        outs: tuple[SbpValue, ...] = tuple(Split(m[d]) if d in m else B for m in out_maps)
        sigs.append((ins, outs))
    return sigs


def _partial_sets(kind: str, names: Sequence[str]) -> list[set[int]]:
    """Positions of the inputs that are ``P`` together, per ``P`` signature."""
    if kind == "none":
        return []
    if kind == "all":
        return [set(range(len(names)))]
    if kind == "any":
        return [{i} for i in range(len(names))]
    wanted = set(kind.split("+"))
    return [{i for i, n in enumerate(names) if n in wanted}]


def linear_signatures(ctx: RuleContext, partial_inputs: set[int]) -> list[OneDSignature]:
    """``P`` on the inputs at ``partial_inputs`` (the rest ``B``) gives ``P`` outputs."""
    specs = [ctx.inputs[i] for i in partial_inputs] + list(ctx.outputs)
    if not partial_inputs or not partial_ok(*specs):
        return []
    ins = tuple(P if i in partial_inputs else B for i in range(len(ctx.inputs)))
    return [(ins, tuple(P for _ in ctx.outputs))]


# ------------------------------------------------------------------ rules


@register(*UNARY_OPS, cost=CostKind.MEMORY)
def unary(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)) -> S(d)`` for every dim, ``(B) -> B``; never ``P`` (not linear)."""
    return [*broadcast_splits(ctx), uniform(ctx, B)]


@register(*LINEAR_UNARY_OPS, cost=CostKind.MEMORY)
def linear_unary(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d)) -> S(d)``, ``(B) -> B``, ``(P) -> P`` (linear; ``cast`` float to float only)."""
    sigs = [*broadcast_splits(ctx), uniform(ctx, B)]
    if ctx.op.type in ("cast", "mutable_cast_once") and not all(
        is_float(s) for s in (*ctx.inputs, *ctx.outputs)
    ):
        return sigs
    if partial_ok(*ctx.inputs, *ctx.outputs):
        sigs.append(uniform(ctx, P))
    return sigs


@register(*UNARY_GRAD_OPS, cost=CostKind.MEMORY)
def unary_grad(ctx: RuleContext) -> list[OneDSignature]:
    """``(S(d), S(d)) -> S(d)``, all ``B``, and ``dy`` ``P`` with ``x`` ``B`` ``-> P``
    (not ``rsqrt_grad`` / ``square_grad``: OneFlow 0.9 refuses ``dy`` ``P`` there)."""
    pm = port_map(ctx, UNARY_GRAD_OPS[ctx.op.type])
    sigs = [*broadcast_splits(ctx), uniform(ctx, B)]
    if ctx.op.type in NO_PARTIAL_GRAD_OPS:
        return sigs
    dy = {i for i, name in enumerate(pm.inputs) if name == "dy"}
    return sigs + linear_signatures(ctx, dy)


@register(*BROADCAST_OPS, cost=CostKind.MEMORY)
def broadcast_binary(ctx: RuleContext) -> list[OneDSignature]:
    """Split any output dim (broadcast inputs ``B``), all ``B``, and the op's linear ``P``s."""
    declared, kind = BROADCAST_OPS[ctx.op.type]
    pm = port_map(ctx, declared)
    sigs = [*broadcast_splits(ctx), uniform(ctx, B)]
    for positions in _partial_sets(kind, pm.inputs):
        sigs += linear_signatures(ctx, positions)
    return sigs


def binary_grad_splits(ctx: RuleContext, grad_port: int) -> list[OneDSignature]:
    """Split every dim of the incoming gradient; inputs broadcast there take ``B``,
    outputs that lack the dim were summed over it and take ``P``."""
    full = ctx.inputs[grad_port].shape
    maps = [broadcast_dim_map(spec.shape, full) for spec in ctx.inputs]
    out_maps = [broadcast_dim_map(spec.shape, full) for spec in ctx.outputs]
    sigs: list[OneDSignature] = []
    for d in range(len(full)):
        outs: tuple[SbpValue, ...] = tuple(Split(m[d]) if d in m else P for m in out_maps)
        if any(v == P for v in outs) and not partial_ok(*ctx.outputs):
            continue
        ins: tuple[SbpValue, ...] = tuple(Split(m[d]) if d in m else B for m in maps)
        sigs.append((ins, outs))
    return sigs


@register(*BINARY_GRAD_OPS, cost=CostKind.MEMORY)
def binary_grad(ctx: RuleContext) -> list[OneDSignature]:
    """Split any dim of ``dz`` (outputs summed over it ``P``), all ``B``, ``dz`` ``P`` ``-> P``."""
    pm = port_map(ctx, BINARY_GRAD_OPS[ctx.op.type])
    grad = [i for i, name in enumerate(pm.inputs) if name == "dz"]
    if not grad:
        return [uniform(ctx, B)]
    sigs = [*binary_grad_splits(ctx, grad[0]), uniform(ctx, B)]
    linear_in = [i for i, name in enumerate(pm.inputs) if name in LINEAR_GRAD_INPUTS.get(ctx.op.type, ())]
    linear = [s for i in (grad[0], *linear_in) for s in linear_signatures(ctx, {i})]
    return sigs + linear
