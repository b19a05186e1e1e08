"""Uneven splits as OneFlow 0.9 allows them (issue 26: ViT's 17 tokens over an axis of 2).

OneFlow keeps a split whose dim, floor-divided by the earlier axes cutting it, is at least
the axis size (``Storage4NdSbp``), and cuts it with ``BalancedSplitter``; ``reshape``
splits unequal dims only where they divide (``ReshapeUserOpUtil``).  The oracle
(``oracle.py``) runs every offered signature on such balanced shards.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autopar.cost.memory import shard_bytes
from autopar.ir.sbp import B, NdSbp, Split, parse_signature
from autopar.rules.registry import planning_signatures
from autopar.runtimes.oneflow_09.lowering import can_merge_split, hop_rule
from tests.autopar.rules.helpers import assert_all_fit, make_ctx, printed, signatures
from tests.autopar.rules.oracle import check_all

VIT = (8, 17, 64)  # batch, 16 patches + CLS, hidden


def _arrays(ctx) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    return {p: rng.standard_normal(s.shape) for p, s in zip(ctx.op.inputs, ctx.inputs, strict=True)}


def test_an_uneven_split_is_offered_where_the_dim_is_at_least_the_axis():
    ctx = make_ctx(
        "reduce_sum",
        {"input_tensor_0": VIT},
        {"output_tensor_0": (8, 17, 1)},
        {"axis": [2], "keepdims": True},
    )
    got = {str(s) for s in assert_all_fit(ctx)}
    assert "((S(0), S(1))) -> (S(0), S(1))" in got  # 17 over 2: 9 and 8
    assert "((S(1), S(1))) -> (S(1), S(1))" in got  # 17 // 4 = 4 >= 2
    assert check_all(ctx, _arrays(ctx)) >= 5  # every one sums right on the balanced shards
    # ViT's attention: scores [b, heads, 17, 17] @ v [b, heads, 17, 16], the contracted
    # 17 split unevenly on both inputs -> P (both cut by the same BalancedSplitter)
    mm = make_ctx(
        "batch_matmul", {"a_0": (8, 4, 17, 17), "b_0": (8, 4, 17, 16)}, {"out_0": (8, 4, 17, 16)}, {}
    )
    got = printed(mm)
    assert "((S(0), S(3)), (S(0), S(2))) -> (S(0), P)" in got
    assert check_all(mm, _arrays(mm)) >= 5


def test_a_split_shorter_than_its_axis_is_refused():
    ctx = make_ctx("gelu", {"in_0": (3, 17)}, {"out_0": (3, 17)}, mesh=(4, 2))
    got = printed(ctx)
    assert "((S(0), B)) -> (S(0), B)" not in got  # 3 rows < 4 devices
    assert "((B, S(0))) -> (B, S(0))" in got  # 3 over 2
    # 17 // 4 = 4 >= 2 is kept; 5 // 4 = 1 < 2 is not
    assert "((S(1), S(1))) -> (S(1), S(1))" in got
    short = make_ctx("gelu", {"in_0": (5,)}, {"out_0": (5,)}, mesh=(4, 2))
    assert "((S(0), S(0))) -> (S(0), S(0))" not in printed(short)


def test_reshape_splits_equal_dims_unevenly_and_unequal_dims_only_where_they_divide():
    # ViT's qkv: [b, 17, 192] -> [b, 17, 3, heads 4, 16]
    ctx = make_ctx(
        "reshape", {"in_0": (8, 17, 192)}, {"out_0": (8, 17, 3, 4, 16)}, {"shape": [8, 17, 3, 4, 16]}
    )
    got = {str(s) for s in assert_all_fit(ctx)}
    assert "((S(0), S(1))) -> (S(0), S(1))" in got  # 17 == 17: uneven, as OneFlow offers
    assert "((B, S(2))) -> (B, S(2))" not in got  # 192 -> 3: 3 % 2 != 0
    assert check_all(ctx, _arrays(ctx)) >= 5
    # [12] -> [6, 2] on [2, 2]: each axis divides both (OneFlow's test), the nested cut does not
    nested = make_ctx("reshape", {"in_0": (12,)}, {"out_0": (6, 2)}, {"shape": [6, 2]}, mesh=(2, 2))
    got = printed(nested)
    assert "((S(0), B)) -> (S(0), B)" in got
    assert "((S(0), S(0))) -> (S(0), S(0))" not in got  # 6 rows of 2 over 4: 2, 1, 2, 1 != 3 each


def test_the_planner_searches_even_layouts_only():
    ctx = make_ctx(
        "reduce_sum",
        {"input_tensor_0": VIT},
        {"output_tensor_0": (8, 17, 1)},
        {"axis": [2], "keepdims": True},
    )
    offered = assert_all_fit(ctx)
    planned = planning_signatures(ctx, offered)
    assert parse_signature("((S(0), S(1))) -> (S(0), S(1))") in offered
    assert parse_signature("((S(0), S(1))) -> (S(0), S(1))") not in planned
    assert parse_signature("((S(0), B)) -> (S(0), B)") in planned
    assert set(planned) < set(offered)


def test_the_largest_shard_sets_memory():
    sbp = NdSbp((Split(0), Split(1)))
    # 8 rows over 4, 17 tokens over 2: the largest shard is 2 x 9 x 64 elements
    assert shard_bytes(VIT, 2, sbp, (4, 2)) == 2 * 9 * 64 * 2
    # an even split: the even share, the same float as numel * itemsize / split_factor
    assert shard_bytes((8, 16, 64), 2, sbp, (4, 2)) == 8 * 16 * 64 * 2 / 8
    assert shard_bytes(VIT, 2, NdSbp((B, B)), (4, 2)) == 8 * 17 * 64 * 2


def test_the_planner_keeps_an_even_parameter_layout_whose_zero_shard_is_uneven():
    """OneFlow's ZeRO splits one more axis even when the shard is uneven (``IsSplitValid``
    floor-divides): a parameter of 12 rows laid out ``(S(0), B)`` on ``[4, 2]`` has its
    gradient and states ``(S(0), S(0))`` (3 rows over 2); the planner still offers it."""
    ports = {
        "model_0": ((12, 512), "float32"),
        "model_diff_0": ((12, 512), "float32"),
        "learning_rate_0": ((1,), "float32"),
        "m_0": ((12, 512), "float32"),
        "v_0": ((12, 512), "float32"),
    }
    base = make_ctx("adam_update", ports, {}, {}, mesh=(4, 2), zero_stage=2)
    ctx = dataclasses.replace(base, zero_sharding="one_axis:shard_min_size=1")
    offered = signatures(ctx)
    layout = {str(s.inputs[0]): s for s in offered}["(S(0), B)"]
    assert str(layout.inputs[1]) == "(S(0), S(0))"  # the uneven ZeRO shard
    assert layout in planning_signatures(ctx, offered)


def test_an_uneven_split_merges_over_axes_only_where_oneflow_merges_it():
    """``InOutParallelDimReduce`` merges ``(S(0), S(0))`` on ``[2, 2]`` into ``S(0)`` on 4 only
    when the nested cut equals the flat one (``CanMergeSplit``: ``size % 4`` in 0, 1, 3)."""
    src, dst = NdSbp((Split(0), Split(0))), NdSbp((B, B))
    assert hop_rule((8,), src, dst, (2, 2)).scope == "flat"  # even: an all-gather over 4
    assert hop_rule((5,), src, dst, (2, 2)).scope == "flat"  # 3, 2 -> 2, 1, 1, 1 = flat
    assert hop_rule((6,), src, dst, (2, 2)).scope == "2-D"  # 2, 1, 2, 1 != 2, 2, 1, 1
    assert [can_merge_split(n, 4) for n in (4, 5, 6, 7)] == [True, True, False, True]
