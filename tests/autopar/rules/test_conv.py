"""Convolutions: the batch split OneFlow 0.9's conv_op.cpp offers, and nothing else."""

from __future__ import annotations

from tests.autopar.rules.helpers import assert_all_fit, make_ctx, printed

X, W, Y = (8, 3, 32, 32), (64, 3, 8, 8), (8, 64, 4, 4)


def test_conv2d_splits_only_the_batch():
    ctx = make_ctx("conv2d", {"in_0": X, "weight_0": W, "bias_0": (64,)}, {"out_0": Y}, mesh=(2,))
    assert printed(ctx) == {"(S(0), B, B) -> S(0)", "(B, B, B) -> B"}
    assert_all_fit(ctx)


def test_conv_gradients_split_the_batch_and_sum_the_filter():
    data = make_ctx("conv_data_grad", {"dy_0": Y, "filter_0": W, "x_like_0": X}, {"dx_0": X}, mesh=(2,))
    assert printed(data) == {"(S(0), B, S(0)) -> S(0)", "(B, B, B) -> B"}
    filt = make_ctx("conv_filter_grad", {"dy_0": Y, "x_0": X}, {"filter_diff_0": W}, mesh=(2,))
    assert printed(filt) == {"(S(0), S(0)) -> P", "(B, B) -> B"}
    bias = make_ctx("conv_bias_grad", {"dy_0": Y}, {"bias_diff_0": (64,)}, mesh=(2,))
    assert printed(bias) == {"(S(0)) -> P", "(B) -> B"}
    # 2-D: the batch splits over both axes, or one
    assert "((S(0), S(0)), (S(0), S(0))) -> (P, P)" in printed(
        make_ctx("conv_filter_grad", {"dy_0": Y, "x_0": X}, {"filter_diff_0": W}, mesh=(4, 2))
    )
