"""Embedding: data-parallel ids, vocab-parallel table (P out), and the backward's layouts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.autopar.rules.helpers import assert_all_fit, make_ctx, printed
from tests.autopar.rules.oracle import check_all

V, HD = 32, 16


def _gather(mesh=(2,), b=8, s=4):
    return make_ctx(
        "gather",
        {"in_0": (V, HD), "indices_0": ((b, s), "int64")},
        {"out_0": (b, s, HD)},
        {"axis": 0},
        mesh=mesh,
    )


def test_gather_1d_signatures():
    assert printed(_gather()) == {
        "(B, S(0)) -> S(0)",
        "(B, S(1)) -> S(1)",
        "(S(1), B) -> S(2)",
        "(S(0), B) -> P",  # vocab parallel (Megatron VocabParallelEmbedding)
        "(P, B) -> P",
        "(B, B) -> B",
    }


def test_gather_2d_megatron_embedding():
    got = {str(s) for s in assert_all_fit(_gather(mesh=(4, 2)))}
    # ids data-parallel on axis 0, vocab-parallel table on axis 1 -> P on tp
    assert "((B, S(0)), (S(0), B)) -> (S(0), P)" in got


def test_gather_splits_a_vocab_oneflow_can_cut():
    # 30 rows over 4: 8, 8, 7, 7; each device looks up its own range (the oracle checks the offsets)
    ctx = make_ctx(
        "gather", {"in_0": (30, HD), "indices_0": ((8, 4), "int64")}, {"out_0": (8, 4, HD)}, mesh=(4,)
    )
    assert "(S(0), B) -> P" in printed(ctx)
    short = make_ctx(
        "gather", {"in_0": (3, HD), "indices_0": ((8, 4), "int64")}, {"out_0": (8, 4, HD)}, mesh=(4,)
    )
    assert "(S(0), B) -> P" not in printed(short)  # 3 rows < 4 devices


def test_embedding_op_uses_weight_and_indices():
    ctx = make_ctx(
        "embedding", {"weight_0": (V, HD), "indices_0": ((8, 4), "int64")}, {"out_0": (8, 4, HD)}, mesh=(2,)
    )
    assert {"(S(0), B) -> P", "(B, S(0)) -> S(0)"} <= printed(ctx)


def test_unsorted_segment_sum_like_is_the_backward():
    ctx = make_ctx(
        "unsorted_segment_sum_like",
        {"data_0": (8, 4, HD), "segment_ids_0": ((8, 4), "int64"), "like_0": (V, HD)},
        {"out_0": (V, HD)},
        {"axis": 0},
        mesh=(2,),
    )
    assert printed(ctx) == {
        "(S(0), S(0), B) -> P",  # data-parallel ids -> partial weight gradient
        "(S(1), S(1), B) -> P",
        "(S(2), B, S(1)) -> S(1)",
        "(B, B, S(0)) -> S(0)",  # vocab-parallel table keeps its own rows
        "(P, B, B) -> P",
        "(B, B, B) -> B",
    }


def test_segment_sum_port_order_from_the_importer():
    # The OneFlow job listed segment_ids first: rules must look ports up by name.
    ctx = make_ctx(
        "unsorted_segment_sum_like",
        {"segment_ids_0": ((8, 4), "int64"), "data_0": (8, 4, HD), "like_0": (V, HD)},
        {"out_0": (V, HD)},
        mesh=(2,),
    )
    assert "(S(0), S(0), B) -> P" in printed(ctx)
    assert "(B, P, B) -> P" in printed(ctx)
    assert "(P, B, B) -> P" not in printed(ctx)


@pytest.mark.parametrize("mesh", [(2,), (2, 2)])
def test_oracle_gather_and_segment_sum(mesh):
    rng = np.random.default_rng(13)
    ids = rng.integers(0, 8, size=(4, 2)).astype(np.float64)
    g = make_ctx(
        "gather",
        {"in_0": (8, 4), "indices_0": ((4, 2), "int64")},
        {"out_0": (4, 2, 4)},
        {"axis": 0},
        mesh=mesh,
        dtype="float32",
    )
    assert check_all(g, {"in_0": rng.standard_normal((8, 4)), "indices_0": ids}) >= 5
    u = make_ctx(
        "unsorted_segment_sum_like",
        {"data_0": (4, 2, 4), "segment_ids_0": ((4, 2), "int64"), "like_0": (8, 4)},
        {"out_0": (8, 4)},
        {"axis": 0},
        mesh=mesh,
        dtype="float32",
    )
    arrays = {
        "data_0": rng.standard_normal((4, 2, 4)),
        "segment_ids_0": ids,
        "like_0": rng.standard_normal((8, 4)),
    }
    assert check_all(u, arrays) >= 5
