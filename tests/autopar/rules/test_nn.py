"""NN layers: softmax never splits its dim nor gives P; norms keep normalised dims whole;
parameter gradients are P under a row split."""

from __future__ import annotations

import numpy as np
import pytest

from tests.autopar.rules.helpers import (
    assert_all_fit,
    make_ctx,
    partial_outputs,
    printed,
    replicated,
)
from tests.autopar.rules.oracle import check_all

SCORES = (8, 12, 16, 16)  # [b, heads, s, s]
HID = (8, 16, 32)


def test_softmax_never_splits_the_softmax_dim_and_never_gives_partial():
    ctx = make_ctx("softmax", {"in_0": SCORES}, {"out_0": SCORES}, mesh=(4, 2))
    sigs = assert_all_fit(ctx)
    assert not partial_outputs(ctx)
    assert all("S(3)" not in str(s) for s in sigs)
    got = {str(s) for s in sigs}
    assert "((S(0), S(1))) -> (S(0), S(1))" in got  # dp x heads (Megatron attention)
    assert replicated(ctx) in got


def test_softmax_grad_is_linear_in_dy():
    ctx = make_ctx("softmax_grad", {"y_0": SCORES, "dy_0": SCORES}, {"dx_0": SCORES}, mesh=(2,))
    got = printed(ctx)
    assert "(B, P) -> P" in got and "(P, B) -> P" not in got
    assert "(S(3), S(3)) -> S(3)" not in got


def test_fused_scale_mask_softmax_broadcast_mask():
    ctx = make_ctx(
        "fused_scale_mask_softmax",
        {"x_0": SCORES, "mask_0": ((8, 1, 16, 16), "bool")},
        {"y_0": SCORES},
        {"scale_value": 0.125, "mask_fill_value": -1e4},
        mesh=(2,),
    )
    got = printed(ctx)
    assert "(S(1), B) -> S(1)" in got  # heads split, mask broadcast over heads
    assert "(S(0), S(0)) -> S(0)" in got
    assert not partial_outputs(ctx)
    assert all("S(3)" not in s for s in got)


def test_fused_scale_mask_softmax_dropout_two_outputs():
    ctx = make_ctx(
        "fused_scale_mask_softmax_dropout",
        {"x_0": SCORES, "mask_0": (SCORES, "bool"), "dropout_mask_0": (SCORES, "bool")},
        {"y_0": SCORES, "softmax_y_0": SCORES},
        mesh=(2,),
    )
    got = printed(ctx)
    assert "(S(1), S(1), S(1)) -> (S(1), S(1))" in got
    assert not partial_outputs(ctx)


def test_dropout_splits_but_never_partial():
    ctx = make_ctx(
        "dropout", {"in_0": HID}, {"out_0": HID, "mask_0": (HID, "bool")}, {"rate": 0.1}, mesh=(2,)
    )
    got = printed(ctx)
    assert "(S(2)) -> (S(2), S(2))" in got
    assert "(B) -> (B, B)" in got
    assert not partial_outputs(ctx)
    grad = make_ctx("dropout_grad", {"dy_0": HID, "mask_0": (HID, "bool")}, {"dx_0": HID}, mesh=(2,))
    assert "(P, B) -> P" in printed(grad)


def test_bias_add():
    ctx = make_ctx("bias_add", {"a_0": HID, "b_0": (32,)}, {"out_0": HID}, {"axis": 2}, mesh=(2,))
    assert printed(ctx) == {
        "(S(0), B) -> S(0)",
        "(S(1), B) -> S(1)",
        "(S(2), S(0)) -> S(2)",
        "(B, B) -> B",
        "(P, P) -> P",
    }


def test_layer_norm_never_splits_normalised_dims():
    ctx = make_ctx(
        "layer_norm",
        {"x_0": HID, "beta_0": (32,), "gamma_0": (32,)},
        {"y_0": HID, "mean_0": (8, 16), "inv_variance_0": (8, 16)},
        {"begin_norm_axis": 2, "begin_params_axis": 2, "epsilon": 1e-5},
        mesh=(4, 2),
    )
    sigs = assert_all_fit(ctx)
    got = {str(s) for s in sigs}
    assert "((S(0), B), (B, B), (B, B)) -> ((S(0), B), (S(0), B), (S(0), B))" in got
    assert "((S(0), S(1)), (B, B), (B, B)) -> ((S(0), S(1)), (S(0), S(1)), (S(0), S(1)))" in got
    assert all("S(2)" not in str(s.inputs[0]) for s in sigs)
    assert not partial_outputs(ctx)


def test_rms_norm_and_its_gradients():
    fwd = make_ctx(
        "rms_norm",
        {"x_0": HID, "weight_0": (32,)},
        {"y_0": HID, "inv_rms_0": (8, 16)},
        {"normalized_shape": [32]},
        mesh=(2,),
    )
    assert printed(fwd) == {
        "(S(0), B) -> (S(0), S(0))",
        "(S(1), B) -> (S(1), S(1))",
        "(B, B) -> (B, B)",
    }
    grad = make_ctx(
        "rms_norm_grad",
        {"dy_0": HID, "x_0": HID, "inv_rms_0": (8, 16), "weight_0": (32,)},
        {"dx_0": HID},
        mesh=(2,),
    )
    got = printed(grad)
    assert {"(S(0), S(0), S(0), B) -> S(0)", "(P, B, B, B) -> P"} <= got
    assert not any(s.startswith("(S(2)") for s in got)
    pgrad = make_ctx(
        "rms_norm_param_grad",
        {"dy_0": HID, "x_0": HID, "inv_rms_0": (8, 16)},
        {"weight_grad_0": (32,)},
        mesh=(4, 2),
    )
    got = {str(s) for s in assert_all_fit(pgrad)}
    # data parallel on axis 0: weight grad is P there (reduced later, ZeRO reduce-scatters)
    assert "((S(0), B), (S(0), B), (S(0), B)) -> (P, B)" in got
    # OneFlow 0.9 offers row splits only (RmsNormParamGradOp::GetSbp): no split of the
    # normalised dim, no partial dy; pinning one is refused ("Empty sbp signature")
    assert not any("S(2)" in s or s.startswith("((P") or "-> (P, S(0))" in s for s in got), got


def test_layer_norm_param_grad_partial_on_rows():
    ctx = make_ctx(
        "layer_norm_param_grad",
        {"dy_0": HID, "x_0": HID, "mean_0": (8, 16), "inv_variance_0": (8, 16)},
        {"beta_diff_0": (32,), "gamma_diff_0": (32,)},
        {"begin_params_axis": 2},
        mesh=(2,),
    )
    # exactly what LayerNormParamGradOp::GetSbp builds (rows split -> P) and B
    assert printed(ctx) == {
        "(S(0), S(0), S(0), S(0)) -> (P, P)",
        "(S(1), S(1), S(1), S(1)) -> (P, P)",
        "(B, B, B, B) -> (B, B)",
    }


# ------------------------------------------------------------------ numeric oracle

T = (4, 4, 6)


def _arrays(ctx):
    rng = np.random.default_rng(11)
    out = {}
    for p, spec in zip(ctx.op.inputs, ctx.inputs, strict=True):
        if spec.dtype == "bool":
            out[p] = (rng.random(spec.shape) > 0.3).astype(np.float64)
        elif p.startswith("inv_"):
            out[p] = np.abs(rng.standard_normal(spec.shape)) + 0.5
        else:
            out[p] = rng.standard_normal(spec.shape)
    return out


@pytest.mark.parametrize("mesh", [(2,), (2, 2)])
@pytest.mark.parametrize(
    "op_type,inputs,outputs,attrs",
    [
        ("softmax", {"in_0": T}, {"out_0": T}, {}),
        ("softmax_grad", {"y_0": T, "dy_0": T}, {"dx_0": T}, {}),
        (
            "fused_scale_mask_softmax",
            {"x_0": T, "mask_0": ((4, 1, 6), "bool")},
            {"y_0": T},
            {"scale_value": 0.5, "mask_fill_value": -100.0},
        ),
        ("bias_add", {"a_0": T, "b_0": (6,)}, {"out_0": T}, {"axis": 2}),
        ("bias_add", {"a_0": T, "b_0": (4,)}, {"out_0": T}, {"axis": 1}),
        (
            "layer_norm",
            {"x_0": T, "beta_0": (6,), "gamma_0": (6,)},
            {"y_0": T, "mean_0": (4, 4), "inv_variance_0": (4, 4)},
            {"begin_norm_axis": 2, "begin_params_axis": 2},
        ),
        (
            "layer_norm_grad",
            {"dy_0": T, "x_0": T, "mean_0": (4, 4), "inv_variance_0": (4, 4), "gamma_0": (6,)},
            {"dx_0": T},
            {"begin_norm_axis": 2},
        ),
        (
            "layer_norm_param_grad",
            {"dy_0": T, "x_0": T, "mean_0": (4, 4), "inv_variance_0": (4, 4)},
            {"beta_diff_0": (6,), "gamma_diff_0": (6,)},
            {"begin_params_axis": 2},
        ),
        (
            "rms_norm",
            {"x_0": T, "weight_0": (6,)},
            {"y_0": T, "inv_rms_0": (4, 4)},
            {"normalized_shape": [6]},
        ),
        ("rms_norm_grad", {"dy_0": T, "x_0": T, "inv_rms_0": (4, 4), "weight_0": (6,)}, {"dx_0": T}, {}),
        ("rms_norm_param_grad", {"dy_0": T, "x_0": T, "inv_rms_0": (4, 4)}, {"weight_grad_0": (6,)}, {}),
    ],
)
def test_every_offered_signature_computes_the_op(mesh, op_type, inputs, outputs, attrs):
    ctx = make_ctx(op_type, inputs, outputs, attrs, mesh=mesh, dtype="float32")
    assert check_all(ctx, _arrays(ctx)) >= 3
