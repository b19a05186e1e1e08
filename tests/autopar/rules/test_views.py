"""Views: splits map through reshape blocks, transpose perms, expand, slice, concat."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.rules import CostKind
from autopar.rules.families._common import reshape_dim_map
from tests.autopar.rules.helpers import assert_all_fit, make_ctx, printed, rule_for
from tests.autopar.rules.oracle import check_all


def test_reshape_dim_map_only_maps_leading_dims_of_blocks():
    assert reshape_dim_map((8, 16, 32), (128, 32)) == {0: 0, 2: 1}
    assert reshape_dim_map((128, 32), (8, 16, 32)) == {0: 0, 1: 2}
    assert reshape_dim_map((8, 16, 12, 64), (8, 16, 768)) == {0: 0, 1: 1, 2: 2}
    assert reshape_dim_map((4, 6), (6, 4)) == {0: 0}
    assert reshape_dim_map((8, 1, 32), (8, 32)) == {0: 0, 2: 1}
    assert reshape_dim_map((8, 32), (8, 1, 32)) == {0: 0, 1: 2}
    assert reshape_dim_map((8, 32), (8, 33)) == {}


def test_reshape_merge_and_split_heads():
    # [b, s, h] -> [b, s, heads, head_dim]: splitting heads = splitting h
    ctx = make_ctx(
        "reshape", {"in_0": (8, 16, 768)}, {"out_0": (8, 16, 12, 64)}, {"shape": [8, 16, 12, 64]}, mesh=(2,)
    )
    got = printed(ctx)
    assert {"(S(0)) -> S(0)", "(S(1)) -> S(1)", "(S(2)) -> S(2)", "(P) -> P", "(B) -> B"} == got
    merged = make_ctx("reshape", {"in_0": (8, 16, 32)}, {"out_0": (128, 32)}, {"shape": [128, 32]}, mesh=(2,))
    got = printed(merged)
    assert "(S(0)) -> S(0)" in got
    assert "(S(1)) -> S(0)" not in got  # not contiguous after the merge


def test_reshape_splits_need_both_leading_dims_divisible():
    ctx = make_ctx("reshape", {"in_0": (6, 16, 32)}, {"out_0": (96, 32)}, mesh=(4, 2))
    got = {str(s) for s in assert_all_fit(ctx)}
    assert "((S(0), B)) -> (S(0), B)" not in got  # 6 % 4
    assert "((B, S(0))) -> (B, S(0))" in got


def test_flatten_squeeze_expand_dims_use_shapes():
    flat = make_ctx(
        "flatten", {"in_0": (8, 16, 32)}, {"out_0": (8, 512)}, {"start_dim": 1, "end_dim": -1}, mesh=(2,)
    )
    assert printed(flat) >= {"(S(0)) -> S(0)", "(S(1)) -> S(1)"}
    assert "(S(2)) -> S(1)" not in printed(flat)
    sq = make_ctx("squeeze", {"in_0": (8, 1, 32)}, {"out_0": (8, 32)}, {"axes": [1]}, mesh=(2,))
    assert printed(sq) >= {"(S(0)) -> S(0)", "(S(2)) -> S(1)"}
    ed = make_ctx("expand_dims", {"in_0": (8, 32)}, {"out_0": (8, 1, 32)}, {"axis": 1}, mesh=(2,))
    assert printed(ed) >= {"(S(0)) -> S(0)", "(S(1)) -> S(2)"}


def test_transpose_follows_perm():
    ctx = make_ctx(
        "transpose",
        {"input_0": (8, 16, 12, 64)},
        {"output_0": (8, 12, 16, 64)},
        {"perm": [0, 2, 1, 3]},
        mesh=(2,),
    )
    got = printed(ctx)
    assert {"(S(0)) -> S(0)", "(S(2)) -> S(1)", "(S(1)) -> S(2)", "(S(3)) -> S(3)"} <= got
    assert "(P) -> P" in got


def test_slice_keeps_cut_dims_whole():
    ctx = make_ctx(
        "slice",
        {"x_0": (8, 16, 32)},
        {"y_0": (8, 4, 32)},
        {"start": [0, 2, 0], "stop": [8, 6, 32], "step": [1, 1, 1]},
        mesh=(2,),
    )
    got = printed(ctx)
    assert {"(S(0)) -> S(0)", "(S(2)) -> S(2)"} <= got
    assert not any("S(1)" in s for s in got)


def test_concat_never_splits_the_concat_dim():
    ctx = make_ctx("concat", {"in_0": (8, 16), "in_1": (8, 16)}, {"out_0": (8, 32)}, {"axis": 1}, mesh=(2,))
    got = printed(ctx)
    assert "(S(0), S(0)) -> S(0)" in got and "(P, P) -> P" in got
    assert not any("S(1)" in s for s in got)


def test_expand_splits_kept_dims_only():
    ctx = make_ctx(
        "expand", {"in_0": (8, 1, 32)}, {"out_0": (8, 16, 32)}, {"expand_shape": [8, 16, 32]}, mesh=(2,)
    )
    got = printed(ctx)
    assert {"(S(0)) -> S(0)", "(S(2)) -> S(2)", "(B) -> B"} <= got
    assert "(B) -> S(1)" not in got  # OneFlow's ExpandOp::GetSbp splits no expanded dim


def test_views_are_free_and_copies_are_not():
    for t in ("reshape", "reshape_like", "flatten", "expand_dims", "squeeze"):
        assert rule_for(t).cost is CostKind.FREE
    for t in ("transpose", "slice", "concat", "expand"):
        assert rule_for(t).cost is CostKind.MEMORY


@pytest.mark.parametrize("mesh", [(2,), (2, 2)])
@pytest.mark.parametrize(
    "op_type,inputs,outputs,attrs",
    [
        ("reshape", {"in_0": (4, 4, 8)}, {"out_0": (16, 8)}, {}),
        ("reshape", {"in_0": (4, 8, 6)}, {"out_0": (4, 2, 4, 6)}, {}),
        ("reshape", {"in_0": (4, 6)}, {"out_0": (6, 4)}, {}),
        ("flatten", {"in_0": (4, 4, 8)}, {"out_0": (4, 32)}, {}),
        ("reshape_like", {"in_0": (4, 4, 8), "like_0": (16, 8)}, {"out_0": (16, 8)}, {}),
        ("transpose", {"input_0": (4, 2, 8)}, {"output_0": (8, 4, 2)}, {"perm": [2, 0, 1]}),
        ("expand", {"in_0": (4, 1, 8)}, {"out_0": (4, 4, 8)}, {"expand_shape": [4, 4, 8]}),
        (
            "slice",
            {"x_0": (4, 8, 4)},
            {"y_0": (4, 2, 4)},
            {"start": [0, 2, 0], "stop": [4, 6, 4], "step": [1, 2, 1]},
        ),
        ("concat", {"in_0": (4, 2), "in_1": (4, 6)}, {"out_0": (4, 8)}, {"axis": 1}),
    ],
)
def test_every_offered_signature_computes_the_op(mesh, op_type, inputs, outputs, attrs):
    ctx = make_ctx(op_type, inputs, outputs, attrs, mesh=mesh, dtype="float32")
    rng = np.random.default_rng(7)
    arrays = {p: rng.standard_normal(s.shape) for p, s in zip(ctx.op.inputs, ctx.inputs, strict=True)}
    assert check_all(ctx, arrays) >= 2
