"""Matmul family: Megatron's column / row parallel signatures, batch dims, grads, FLOPs."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.rules import CostKind
from tests.autopar.rules.helpers import (
    assert_all_fit,
    flops,
    make_ctx,
    partial_outputs,
    printed,
    replicated,
    rule_for,
)
from tests.autopar.rules.oracle import check_all

RNG = np.random.default_rng(0)


def _linear_ctx(mesh=(4, 2)):
    """OneFlow's Linear on a 3-D activation: x [b, s, h] @ w^T, w [out, in]."""
    return make_ctx(
        "broadcast_matmul",
        {"a_0": (8, 16, 32), "b_0": (64, 32)},
        {"out_0": (8, 16, 64)},
        {"transpose_a": False, "transpose_b": True},
        mesh=mesh,
    )


def test_matmul_1d_signatures_are_the_textbook_six():
    ctx = make_ctx("matmul", {"a_0": (8, 16), "b_0": (16, 4)}, {"out_0": (8, 4)}, mesh=(2,))
    assert printed(ctx) == {
        "(S(0), B) -> S(0)",
        "(B, S(1)) -> S(1)",
        "(S(1), S(0)) -> P",
        "(P, B) -> P",
        "(B, P) -> P",
        "(B, B) -> B",
    }


def test_matmul_transposes_move_the_split_dims():
    ctx = make_ctx(
        "matmul",
        {"a_0": (16, 8), "b_0": (4, 16)},
        {"out_0": (8, 4)},
        {"transpose_a": True, "transpose_b": True},
        mesh=(2,),
    )
    got = printed(ctx)
    assert "(S(1), B) -> S(0)" in got  # rows of a^T are a's columns
    assert "(B, S(0)) -> S(1)" in got  # columns of b^T are b's rows
    assert "(S(0), S(1)) -> P" in got  # contracted dim
    assert "(S(0), B) -> S(0)" not in got


def test_megatron_linear_signatures_on_a_2d_mesh():
    ctx = _linear_ctx()
    got = printed(ctx)
    # data parallel on axis 0, column parallel (weight split on its out dim) on axis 1
    assert "((S(0), B), (B, S(0))) -> (S(0), S(2))" in got
    # row parallel: activation split on its hidden dim, weight on its in dim -> P on tp
    assert "((S(0), S(2)), (B, S(1))) -> (S(0), P)" in got
    assert "((S(0), B), (B, B)) -> (S(0), B)" in got
    assert replicated(ctx) in got
    assert_all_fit(ctx)


def test_port_order_from_the_importer_does_not_matter():
    # OneFlow stores inputs in a map: an importer may list b_0 before a_0.
    ctx = make_ctx(
        "broadcast_matmul",
        {"b_0": (64, 32), "a_0": (8, 16, 32)},
        {"out_0": (8, 16, 64)},
        {"transpose_b": True},
        mesh=(2,),
    )
    got = printed(ctx)
    assert "(S(0), B) -> S(2)" in got  # (b, a): b split on its out dim -> column parallel
    assert "(B, S(0)) -> S(0)" in got  # rows of a
    assert "(B, S(2)) -> S(2)" not in got
    assert "(S(1), S(2)) -> P" in got


def test_splits_follow_oneflows_storage_rule():
    ctx = make_ctx(
        "broadcast_matmul",
        {"a_0": (6, 16, 32), "b_0": (64, 32)},
        {"out_0": (6, 16, 64)},
        {"transpose_b": True},
        mesh=(4, 2),
    )
    assert_all_fit(ctx)
    got = printed(ctx)
    assert "((S(0), B), (B, B)) -> (S(0), B)" in got  # 6 over 4, uneven: OneFlow accepts
    assert "((S(0), S(0)), (B, B)) -> (S(0), S(0))" not in got  # 6 // 4 = 1 < 2
    assert "((B, S(0)), (B, B)) -> (B, S(0))" in got


def test_batch_matmul_splits_batch_dims():
    ctx = make_ctx(
        "batch_matmul",
        {"a_0": (4, 8, 16, 32), "b_0": (4, 8, 32, 16)},
        {"out_0": (4, 8, 16, 16)},
        mesh=(2,),
    )
    got = printed(ctx)
    assert {"(S(0), S(0)) -> S(0)", "(S(1), S(1)) -> S(1)", "(S(3), S(2)) -> P"} <= got
    assert_all_fit(ctx)


def test_broadcast_matmul_grad_b_sums_the_batch():
    ctx = make_ctx(
        "broadcast_matmul_grad_b",
        {"a_0": (8, 16, 64), "b_0": (8, 16, 32)},
        {"out_0": (64, 32)},
        mesh=(4, 2),
    )
    got = printed(ctx)
    # data-parallel weight gradient: batch split on both -> P
    assert "((S(0), B), (S(0), B)) -> (P, B)" in got
    # sequence dim (also summed) -> P as well
    assert "((S(1), B), (S(1), B)) -> (P, B)" in got
    # column-parallel weight grad: dy split on its hidden dim -> weight grad split on dim 0
    assert "((S(0), S(2)), (S(0), B)) -> (P, S(0))" in got
    assert_all_fit(ctx)


def test_fused_matmul_bias_row_parallel_needs_partial_bias():
    ctx = make_ctx(
        "fused_matmul_bias",
        {"x_0": (16, 32), "weight_0": (64, 32), "bias_0": (64,)},
        {"out_0": (16, 64)},
        mesh=(2,),
    )
    got = printed(ctx)
    assert "(S(1), S(1), P) -> P" in got
    assert "(S(1), S(1), B) -> P" not in got  # the bias would be added twice
    assert "(B, S(0), S(0)) -> S(1)" in got
    assert "(S(0), B, B) -> S(0)" in got


def test_no_partial_for_integer_matmul():
    ctx = make_ctx("matmul", {"a_0": (8, 16), "b_0": (16, 4)}, {"out_0": (8, 4)}, mesh=(2,), dtype="int32")
    assert not any(o.has_partial for s in partial_outputs(ctx) for o in s.outputs)
    assert "(P, B) -> P" not in printed(ctx)


def test_cost_kind_and_flops():
    for t in ("matmul", "broadcast_matmul", "batch_matmul", "broadcast_matmul_grad_b", "fused_matmul_bias"):
        assert rule_for(t).cost is CostKind.MATMUL
    assert flops(_linear_ctx()) == 2 * (8 * 16) * 64 * 32
    grad = make_ctx(
        "broadcast_matmul_grad_b",
        {"a_0": (8, 16, 64), "b_0": (8, 16, 32)},
        {"out_0": (64, 32)},
    )
    assert flops(grad) == 2 * 64 * 32 * (8 * 16)
    transposed = make_ctx(
        "matmul",
        {"a_0": (16, 8), "b_0": (4, 16)},
        {"out_0": (8, 4)},
        {"transpose_a": True, "transpose_b": True},
    )
    assert flops(transposed) == 2 * 8 * 4 * 16
    fused = make_ctx(
        "fused_matmul_bias",
        {"x_0": (8, 16, 32), "weight_0": (64, 32), "bias_0": (64,)},
        {"out_0": (8, 16, 64)},
    )
    assert flops(fused) == 2 * (8 * 16) * 64 * 32


# ------------------------------------------------------------------ numeric oracle


def _arrays(ctx):
    return {p: RNG.standard_normal(s.shape) for p, s in zip(ctx.op.inputs, ctx.inputs, strict=True)}


@pytest.mark.parametrize("mesh", [(2,), (2, 2)])
@pytest.mark.parametrize(
    "op_type,inputs,outputs,attrs",
    [
        ("matmul", {"a_0": (4, 6), "b_0": (6, 8)}, {"out_0": (4, 8)}, {}),
        (
            "matmul",
            {"a_0": (6, 4), "b_0": (8, 6)},
            {"out_0": (4, 8)},
            {"transpose_a": True, "transpose_b": True},
        ),
        ("batch_matmul", {"a_0": (2, 4, 4, 6), "b_0": (2, 4, 6, 8)}, {"out_0": (2, 4, 4, 8)}, {}),
        ("broadcast_matmul", {"a_0": (2, 4, 6), "b_0": (8, 6)}, {"out_0": (2, 4, 8)}, {"transpose_b": True}),
        ("broadcast_matmul_grad_b", {"a_0": (2, 4, 6), "b_0": (2, 4, 8)}, {"out_0": (6, 8)}, {}),
        ("fused_matmul_bias", {"x_0": (4, 6), "weight_0": (8, 6), "bias_0": (8,)}, {"out_0": (4, 8)}, {}),
        ("matmul", {"a_0": (4, 6), "b_0": (6, 8), "_add_to_output_0": (4, 8)}, {"out_0": (4, 8)}, {}),
    ],
)
def test_every_offered_signature_computes_the_op(mesh, op_type, inputs, outputs, attrs):
    ctx = make_ctx(op_type, inputs, outputs, attrs, mesh=mesh, dtype="float32")
    assert check_all(ctx, _arrays(ctx)) >= 5


def test_broadcast_matmul_grad_b_takes_no_partial_input():
    """OneFlow 0.9's BroadcastMatmulGradBOp::GetSbp has no (P, B) / (B, P) signature; pinned,
    ((B, B), (P, P)) -> (P, P) was refused ("Empty sbp signature after filtering")."""
    ctx = make_ctx(
        "broadcast_matmul_grad_b", {"a_0": (2, 4, 6), "b_0": (2, 4, 8)}, {"out_0": (6, 8)}, {}, mesh=(2,)
    )
    offered = set(printed(ctx))
    assert "(P, B) -> P" not in offered and "(B, P) -> P" not in offered
    assert "(S(0), S(0)) -> P" in offered and "(S(2), B) -> S(0)" in offered
