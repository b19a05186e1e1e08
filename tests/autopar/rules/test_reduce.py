"""Reductions: a reduced split dim gives P (sums only), kept dims renumber, keepdims."""

from __future__ import annotations

import numpy as np
import pytest

from tests.autopar.rules.helpers import assert_all_fit, make_ctx, partial_outputs, printed
from tests.autopar.rules.oracle import check_all

X = (8, 16, 32)


def test_reduce_sum_over_the_last_dim_without_keepdims():
    ctx = make_ctx(
        "reduce_sum",
        {"input_tensor_0": X},
        {"output_tensor_0": (8, 16)},
        {"axis": [2], "keepdims": False},
        mesh=(2,),
    )
    assert printed(ctx) == {
        "(S(0)) -> S(0)",
        "(S(1)) -> S(1)",
        "(S(2)) -> P",
        "(P) -> P",
        "(B) -> B",
    }


def test_reduce_renumbers_kept_dims_after_a_dropped_one():
    ctx = make_ctx(
        "reduce_sum",
        {"input_tensor_0": X},
        {"output_tensor_0": (8, 32)},
        {"axis": [1], "keepdims": False},
        mesh=(2,),
    )
    got = printed(ctx)
    assert "(S(2)) -> S(1)" in got
    assert "(S(1)) -> P" in got
    assert "(S(2)) -> S(2)" not in got


def test_reduce_keepdims_keeps_numbers_and_negative_axes_work():
    ctx = make_ctx(
        "reduce_mean",
        {"input_tensor_0": X},
        {"output_tensor_0": (8, 1, 32)},
        {"axis": [-2], "keepdims": True},
        mesh=(2,),
    )
    got = printed(ctx)
    assert {"(S(2)) -> S(2)", "(S(1)) -> P", "(P) -> P"} <= got


def test_reduce_max_never_partial():
    ctx = make_ctx(
        "reduce_max", {"input_tensor_0": X}, {"output_tensor_0": (8, 16)}, {"axis": [2]}, mesh=(2,)
    )
    assert not partial_outputs(ctx)
    assert "(S(2)) -> P" not in printed(ctx)
    assert "(S(0)) -> S(0)" in printed(ctx)


def test_reduce_over_everything():
    ctx = make_ctx(
        "reduce_sum", {"input_tensor_0": X}, {"output_tensor_0": ()}, {"axis": [0, 1, 2]}, mesh=(4, 2)
    )
    got = {str(s) for s in assert_all_fit(ctx)}
    assert "((S(0), S(1))) -> (P, P)" in got
    assert "((S(2), S(2))) -> (P, P)" in got


def test_reduce_sum_like_and_broadcast_like():
    rsl = make_ctx(
        "reduce_sum_like", {"x_0": X, "like_0": (32,)}, {"y_0": (32,)}, {"axis": [0, 1]}, mesh=(2,)
    )
    got = printed(rsl)
    assert {"(S(0), B) -> P", "(S(1), B) -> P", "(S(2), S(0)) -> S(0)"} <= got
    assert "(P, B) -> P" not in got  # OneFlow 0.9 refuses a partial x
    bl = make_ctx(
        "broadcast_like", {"x_0": (32,), "like_0": X}, {"y_0": X}, {"broadcast_axes": [0, 1]}, mesh=(2,)
    )
    got = printed(bl)
    assert {"(B, S(0)) -> S(0)", "(S(0), S(2)) -> S(2)", "(P, B) -> P"} <= got
    assert "(S(0), S(0)) -> S(0)" not in got


def test_square_sum_is_not_linear():
    ctx = make_ctx("square_sum", {"x_0": X}, {"y_0": (1,)}, mesh=(2,))
    got = printed(ctx)
    assert "(S(1)) -> P" in got and "(P) -> P" not in got


# ------------------------------------------------------------------ numeric oracle


@pytest.mark.parametrize("mesh", [(2,), (2, 2)])
@pytest.mark.parametrize(
    "op_type,inputs,outputs,attrs",
    [
        ("reduce_sum", {"input_tensor_0": (4, 4, 6)}, {"output_tensor_0": (4, 6)}, {"axis": [1]}),
        (
            "reduce_sum",
            {"input_tensor_0": (4, 4, 6)},
            {"output_tensor_0": (4, 1, 6)},
            {"axis": [1], "keepdims": True},
        ),
        ("reduce_mean", {"input_tensor_0": (4, 4, 6)}, {"output_tensor_0": (4,)}, {"axis": [1, 2]}),
        ("reduce_max", {"input_tensor_0": (4, 4, 6)}, {"output_tensor_0": (4, 4)}, {"axis": [2]}),
        ("reduce_sum_like", {"x_0": (4, 4, 6), "like_0": (6,)}, {"y_0": (6,)}, {"axis": [0, 1]}),
        (
            "broadcast_like",
            {"x_0": (6,), "like_0": (4, 4, 6)},
            {"y_0": (4, 4, 6)},
            {"broadcast_axes": [0, 1]},
        ),
        ("square_sum", {"x_0": (4, 6)}, {"y_0": (1,)}, {}),
    ],
)
def test_every_offered_signature_computes_the_op(mesh, op_type, inputs, outputs, attrs):
    ctx = make_ctx(op_type, inputs, outputs, attrs, mesh=mesh, dtype="float32")
    rng = np.random.default_rng(5)
    arrays = {p: rng.standard_normal(s.shape) for p, s in zip(ctx.op.inputs, ctx.inputs, strict=True)}
    assert check_all(ctx, arrays) >= 3


def test_reduce_sum_like_takes_a_partial_like():
    """OneFlow's ``reduce_sum_like`` (``reduce_like_ops.cpp``): ``like`` lends only its shape,
    so a reduced split sums to ``P`` with ``like`` ``B`` or ``P``, and ``(B, P) -> B``
    (ViT's norm backward: ``((S(0), S(2)), (S(0), P)) -> (S(0), P)``)."""
    ctx = make_ctx(
        "reduce_sum_like", {"x_0": (8, 17, 64), "like_0": (8, 17, 1)}, {"y_0": (8, 17, 1)}, {"axis": [2]}
    )
    got = printed(ctx)
    assert "((S(0), S(2)), (S(0), P)) -> (S(0), P)" in got
    assert "((S(0), S(2)), (S(0), B)) -> (S(0), P)" in got
    assert "((S(0), B), (S(0), P)) -> (S(0), B)" in got
    assert not any(s.startswith("((P") or s.startswith("((S(0), P)") for s in got)  # never a partial x
