"""Losses: row-split and vocab-parallel (Megatron / OneFlow _ms) cross entropy, NLL."""

from __future__ import annotations

import numpy as np
import pytest

from tests.autopar.rules.helpers import assert_all_fit, make_ctx, partial_outputs, printed
from tests.autopar.rules.oracle import check_all

N, V = 64, 256


@pytest.mark.parametrize("op_type", ["sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_ms"])
def test_sparse_softmax_cross_entropy_rows_and_vocab(op_type):
    ctx = make_ctx(
        op_type,
        {"prediction_0": (N, V), "label_0": ((N,), "int64")},
        {"prob_0": (N, V), "out_0": (N,)},
        {"depth": V},
        mesh=(2,),
    )
    assert printed(ctx) == {
        "(S(0), S(0)) -> (S(0), S(0))",
        "(S(1), B) -> (S(1), B)",
        "(B, B) -> (B, B)",
    }
    assert not partial_outputs(ctx)


def test_vocab_parallel_cross_entropy_on_2d_mesh():
    ctx = make_ctx(
        "sparse_softmax_cross_entropy",
        {"label_0": ((N,), "int64"), "prediction_0": (N, V)},
        {"out_0": (N,), "prob_0": (N, V)},
        mesh=(4, 2),
    )
    got = {str(s) for s in assert_all_fit(ctx)}
    # importer order (label, prediction) -> (out, prob): dp rows x tp vocab
    assert "((S(0), B), (S(0), S(1))) -> ((S(0), B), (S(0), S(1)))" in got


def test_sparse_softmax_cross_entropy_grad():
    ctx = make_ctx(
        "sparse_softmax_cross_entropy_grad",
        {"label_0": ((N,), "int64"), "dy_0": (N,), "prob_0": (N, V)},
        {"prediction_diff_0": (N, V)},
        mesh=(2,),
    )
    assert printed(ctx) == {
        "(S(0), S(0), S(0)) -> S(0)",
        "(B, B, S(1)) -> S(1)",
        "(B, P, B) -> P",
        "(B, B, B) -> B",
    }


def test_sparse_cross_entropy_vocab_split_is_partial():
    ctx = make_ctx(
        "sparse_cross_entropy_ms",
        {"prediction_0": (N, V), "label_0": ((N,), "int64")},
        {"out_0": (N,)},
        mesh=(2,),
    )
    assert "(S(1), B) -> P" in printed(ctx)


def test_nll_class_split():
    ctx = make_ctx(
        "nll",
        {"input_0": (N, V), "target_0": ((N,), "int64"), "weight_0": (V,)},
        {"output_0": (N,), "out_weight_0": (N,)},
        mesh=(2,),
    )
    got = printed(ctx)
    assert {"(S(0), S(0), B) -> (S(0), S(0))", "(S(1), B, S(0)) -> (P, P)"} <= got


@pytest.mark.parametrize("mesh", [(2,), (2, 2)])
def test_oracle_losses(mesh):
    rng = np.random.default_rng(17)
    n, v = 4, 8
    label = rng.integers(0, v, size=(n,)).astype(np.float64)
    prob = rng.random((n, v))
    g = make_ctx(
        "sparse_softmax_cross_entropy_grad",
        {"label_0": ((n,), "int64"), "dy_0": (n,), "prob_0": (n, v)},
        {"prediction_diff_0": (n, v)},
        mesh=mesh,
        dtype="float32",
    )
    assert check_all(g, {"label_0": label, "dy_0": rng.standard_normal(n), "prob_0": prob}) >= 4
    fwd = make_ctx(
        "sparse_softmax_cross_entropy",
        {"prediction_0": (n, v), "label_0": ((n,), "int64")},
        {"prob_0": (n, v), "out_0": (n,)},
        mesh=mesh,
        dtype="float32",
    )
    # the vocab split all-reduces inside the op: not a local computation, skip it
    checked = check_all(
        fwd,
        {"prediction_0": rng.standard_normal((n, v)), "label_0": label},
        skip=lambda s: "S(1)" in s.split("->")[0],
    )
    assert checked >= 2
    nll = make_ctx(
        "nll",
        {"input_0": (n, v), "target_0": ((n,), "int64"), "weight_0": (v,)},
        {"output_0": (n,), "out_weight_0": (n,)},
        mesh=mesh,
        dtype="float32",
    )
    arrays = {"input_0": rng.standard_normal((n, v)), "target_0": label, "weight_0": rng.random(v)}
    assert check_all(nll, arrays) >= 3
    nll_grad = make_ctx(
        "nll_grad",
        {"out_grad_0": (n,), "input_0": (n, v), "target_0": ((n,), "int64"), "weight_0": (v,)},
        {"in_grad_0": (n, v)},
        mesh=mesh,
        dtype="float32",
    )
    arrays = {
        "out_grad_0": rng.standard_normal(n),
        "input_0": rng.standard_normal((n, v)),
        "target_0": label,
        "weight_0": rng.random(v),
    }
    assert check_all(nll_grad, arrays) >= 4
