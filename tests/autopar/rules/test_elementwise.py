"""Element-wise family: splits on every dim, broadcasting, P only through linear ops."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.rules import CostKind
from autopar.rules.families.elementwise import (
    BINARY_GRAD_OPS,
    BROADCAST_OPS,
    LINEAR_UNARY_OPS,
    NO_PARTIAL_GRAD_OPS,
    UNARY_GRAD_OPS,
    UNARY_OPS,
)
from tests.autopar.rules.helpers import (
    assert_all_fit,
    make_ctx,
    partial_outputs,
    printed,
    replicated,
    rule_for,
)
from tests.autopar.rules.oracle import check_all

H = (8, 16, 32)


@pytest.mark.parametrize(
    "op_type",
    [
        "relu",
        "gelu",
        "fast_gelu",
        "tanh",
        "scalar_add",
        "scalar_pow",
        "rsqrt",
        "log",
        "floor",
        "square",
        "sqrt",
        "clip_by_scalar",
    ],
)
def test_nonlinear_unary_splits_every_dim_and_never_partial(op_type):
    ctx = make_ctx(op_type, {"x_0": H}, {"y_0": H}, mesh=(2,))
    assert printed(ctx) == {"(S(0)) -> S(0)", "(S(1)) -> S(1)", "(S(2)) -> S(2)", "(B) -> B"}
    assert not partial_outputs(ctx)


@pytest.mark.parametrize("op_type", ["scalar_mul", "scalar_div", "identity", "amp_white_identity"])
def test_linear_unary_passes_partial_through(op_type):
    ctx = make_ctx(op_type, {"in_0": H}, {"out_0": H}, mesh=(2,))
    assert "(P) -> P" in printed(ctx)


def test_negative_takes_no_partial_sum_as_oneflow_0_9():
    """``negative`` is linear, but OneFlow 0.9 registers it as a math unary op
    (``math_unary_elementwise_op.cpp``: ``SplitForEachAxis`` only): no ``P`` in or out,
    and its gradient takes no ``P`` ``dy`` either."""
    ctx = make_ctx("negative", {"x_0": H}, {"y_0": H}, mesh=(2,))
    assert printed(ctx) == {"(S(0)) -> S(0)", "(S(1)) -> S(1)", "(S(2)) -> S(2)", "(B) -> B"}
    grad = make_ctx("negative_grad", {"x_0": H, "dy_0": H}, {"dx_0": H}, mesh=(2,))
    assert not partial_outputs(grad)


def test_cast_is_linear_only_between_float_dtypes():
    f2f = make_ctx("cast", {"in_0": (H, "float32")}, {"out_0": (H, "float16")}, mesh=(2,))
    f2i = make_ctx("cast", {"in_0": (H, "float32")}, {"out_0": (H, "int64")}, mesh=(2,))
    assert "(P) -> P" in printed(f2f)
    assert "(P) -> P" not in printed(f2i)
    assert "(S(2)) -> S(2)" in printed(f2i)


def test_unary_grad_is_linear_in_dy_only():
    ctx = make_ctx("relu_grad", {"y_0": H, "dy_0": H}, {"dx_0": H}, mesh=(2,))
    got = printed(ctx)
    assert "(B, P) -> P" in got
    assert "(P, B) -> P" not in got
    assert "(P, P) -> P" not in got
    assert "(S(1), S(1)) -> S(1)" in got


def test_unary_grad_finds_dy_by_name_whatever_the_port_order():
    ctx = make_ctx("gelu_grad", {"dy_0": H, "x_0": H}, {"dx_0": H}, mesh=(2,))
    assert "(P, B) -> P" in printed(ctx)  # dy first here
    assert "(B, P) -> P" not in printed(ctx)


def test_broadcast_add_with_a_bias_vector():
    ctx = make_ctx("broadcast_add", {"x_0": H, "y_0": (32,)}, {"z_0": H}, mesh=(2,))
    assert printed(ctx) == {
        "(S(0), B) -> S(0)",
        "(S(1), B) -> S(1)",
        "(S(2), S(0)) -> S(2)",
        "(B, B) -> B",
        "(P, P) -> P",
    }


def test_broadcast_size_one_dims_are_broadcast_not_split():
    ctx = make_ctx("broadcast_mul", {"x_0": (8, 1, 32), "y_0": (8, 16, 32)}, {"z_0": (8, 16, 32)}, mesh=(2,))
    got = printed(ctx)
    assert "(B, S(1)) -> S(1)" in got
    assert "(S(1), S(1)) -> S(1)" not in got


def test_partial_rules_follow_linearity():
    mul = printed(make_ctx("broadcast_mul", {"x_0": H, "y_0": H}, {"z_0": H}, mesh=(2,)))
    assert {"(P, B) -> P", "(B, P) -> P"} <= mul and "(P, P) -> P" not in mul
    div = printed(make_ctx("broadcast_div", {"x_0": H, "y_0": H}, {"z_0": H}, mesh=(2,)))
    assert "(P, B) -> P" in div and "(B, P) -> P" not in div
    sub = printed(make_ctx("broadcast_sub", {"x_0": H, "y_0": H}, {"z_0": H}, mesh=(2,)))
    assert "(P, P) -> P" in sub and "(P, B) -> P" not in sub
    where = printed(
        make_ctx("where", {"condition_0": (H, "bool"), "x_0": H, "y_0": H}, {"out_0": H}, mesh=(2,))
    )
    assert "(B, P, P) -> P" in where
    mx = make_ctx("elementwise_minimum", {"x_0": H, "y_0": H}, {"z_0": H}, mesh=(2,))
    assert not partial_outputs(mx)
    add_n = printed(make_ctx("add_n", {"in_0": H, "in_1": H, "in_2": H}, {"out_0": H}, mesh=(2,)))
    assert "(P, P, P) -> P" in add_n and "(S(2), S(2), S(2)) -> S(2)" in add_n


def test_broadcast_div_grad_sums_over_broadcast_dims():
    ctx = make_ctx("broadcast_div_grad", {"y_0": (32,), "z_0": H, "dz_0": H}, {"dy_0": (32,)}, mesh=(2,))
    got = printed(ctx)
    assert "(B, S(0), S(0)) -> P" in got  # batch split: partial sums of the reduction
    assert "(S(0), S(2), S(2)) -> S(0)" in got
    assert "(B, B, P) -> P" in got
    # linear in z too: OneFlow 0.9's BroadcastDivGradOp::GetSbp offers (y B, z P, dz B) -> dy P
    assert "(B, P, B) -> P" in got


def test_elementwise_minimum_backward_two_outputs():
    ctx = make_ctx(
        "elementwise_minimum_backward", {"dz_0": H, "x_0": H, "y_0": H}, {"dx_0": H, "dy_0": H}, mesh=(2,)
    )
    got = printed(ctx)
    assert "(S(1), S(1), S(1)) -> (S(1), S(1))" in got
    assert "(P, B, B) -> (P, P)" in got


def test_2d_products_and_oneflow_split_rule():
    ctx = make_ctx("gelu", {"in_0": (6, 16, 32)}, {"out_0": (6, 16, 32)}, mesh=(4, 2))
    sigs = assert_all_fit(ctx)
    got = {str(s) for s in sigs}
    assert "((S(1), S(2))) -> (S(1), S(2))" in got
    assert "((S(1), S(1))) -> (S(1), S(1))" in got  # 16 splits 4 x 2
    assert "((S(0), B)) -> (S(0), B)" in got  # 6 over 4: 2, 2, 1, 1 (BalancedSplitter)
    assert "((S(0), S(0))) -> (S(0), S(0))" not in got  # 6 // 4 = 1 < 2: OneFlow refuses
    assert "((B, S(0))) -> (B, S(0))" in got
    assert replicated(ctx) in got


def test_every_op_in_the_family_offers_the_replicated_signature_and_fits():
    for t in (*UNARY_OPS, *LINEAR_UNARY_OPS):
        ctx = make_ctx(t, {"in_0": H}, {"out_0": H})
        assert replicated(ctx) in {str(s) for s in assert_all_fit(ctx)}, t
        assert rule_for(t).cost is CostKind.MEMORY
    for t, (first, second) in UNARY_GRAD_OPS.items():
        ctx = make_ctx(t, {f"{first}_0": H, f"{second}_0": H}, {"dx_0": H})
        assert replicated(ctx) in {str(s) for s in assert_all_fit(ctx)}, t
        # OneFlow 0.9 refuses dy P for rsqrt_grad / square_grad.
        assert bool(partial_outputs(ctx)) is (t not in NO_PARTIAL_GRAD_OPS), t
    for t, (declared, _) in BROADCAST_OPS.items():
        ctx = make_ctx(t, {f"{n}_0": H for n in declared}, {"z_0": H})
        assert replicated(ctx) in {str(s) for s in assert_all_fit(ctx)}, t
    for t, grad_ports in BINARY_GRAD_OPS.items():
        outs = {"dx_0": H, "dy_0": H} if t.startswith("elementwise") else {"dx_0": H}
        ctx = make_ctx(t, {f"{n}_0": H for n in grad_ports}, outs)
        assert replicated(ctx) in {str(s) for s in assert_all_fit(ctx)}, t


# ------------------------------------------------------------------ numeric oracle

RNG = np.random.default_rng(3)
S = (4, 4, 6)


def _arrays(ctx, positive=()):
    out = {}
    for p, spec in zip(ctx.op.inputs, ctx.inputs, strict=True):
        if spec.dtype == "bool":
            out[p] = (RNG.random(spec.shape) > 0.5).astype(np.float64)
        else:
            a = RNG.standard_normal(spec.shape)
            out[p] = np.abs(a) + 0.5 if p in positive else a
    return out


@pytest.mark.parametrize("mesh", [(2,), (2, 2)])
@pytest.mark.parametrize(
    "op_type,inputs,outputs,positive",
    [
        ("relu", {"x_0": S}, {"y_0": S}, ()),
        ("gelu", {"in_0": S}, {"out_0": S}, ()),
        ("scalar_add", {"in_0": S}, {"out_0": S}, ()),
        ("scalar_mul", {"in_0": S}, {"out_0": S}, ()),
        ("relu_grad", {"y_0": S, "dy_0": S}, {"dx_0": S}, ()),
        ("tanh_grad", {"dy_0": S, "x_0": S}, {"dx_0": S}, ()),
        ("dropout_grad", {"dy_0": S, "mask_0": (S, "bool")}, {"dx_0": S}, ()),
        ("broadcast_add", {"x_0": S, "y_0": (6,)}, {"z_0": S}, ()),
        ("broadcast_sub", {"x_0": (4, 1, 6), "y_0": S}, {"z_0": S}, ()),
        ("broadcast_mul", {"x_0": S, "y_0": (4, 1, 1)}, {"z_0": S}, ()),
        ("broadcast_div", {"x_0": S, "y_0": (6,)}, {"z_0": S}, ("y_0",)),
        ("where", {"condition_0": (S, "bool"), "x_0": S, "y_0": S}, {"out_0": S}, ()),
        ("add_n", {"in_0": S, "in_1": S}, {"out_0": S}, ()),
        ("broadcast_div_grad", {"y_0": (6,), "z_0": S, "dz_0": S}, {"dy_0": (6,)}, ("y_0",)),
    ],
)
def test_every_offered_signature_computes_the_op(mesh, op_type, inputs, outputs, positive):
    ctx = make_ctx(op_type, inputs, outputs, mesh=mesh, dtype="float32")
    assert check_all(ctx, _arrays(ctx, positive)) >= 3
