"""The numeric oracle itself must reject wrong signatures, or its passes mean nothing."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.ir.sbp import parse_signature
from tests.autopar.rules.helpers import make_ctx
from tests.autopar.rules.oracle import check_signature


@pytest.mark.parametrize(
    "wrong",
    [
        "(S(1), S(0)) -> B",  # a contracted split gives addends, not the product
        "(S(0), S(1)) -> S(0)",  # each device sees only a block of the output
        "(P, P) -> P",  # a product of sums is not the sum of products
        "(S(0), B) -> S(1)",  # the split lands on the wrong output dim
    ],
)
def test_oracle_rejects_wrong_matmul_signatures(wrong):
    ctx = make_ctx("matmul", {"a_0": (4, 6), "b_0": (6, 8)}, {"out_0": (4, 8)}, mesh=(2,), dtype="float32")
    rng = np.random.default_rng(1)
    arrays = {"a_0": rng.standard_normal((4, 6)), "b_0": rng.standard_normal((6, 8))}
    with pytest.raises(AssertionError):
        check_signature(ctx, arrays, parse_signature(wrong, ndim=1))


def test_oracle_accepts_a_right_signature():
    ctx = make_ctx("matmul", {"a_0": (4, 6), "b_0": (6, 8)}, {"out_0": (4, 8)}, mesh=(2,), dtype="float32")
    rng = np.random.default_rng(1)
    arrays = {"a_0": rng.standard_normal((4, 6)), "b_0": rng.standard_normal((6, 8))}
    check_signature(ctx, arrays, parse_signature("(S(1), S(0)) -> P", ndim=1))


def test_oracle_rejects_a_partial_through_a_nonlinear_op():
    ctx = make_ctx("relu", {"x_0": (4, 6)}, {"y_0": (4, 6)}, mesh=(2,), dtype="float32")
    arrays = {"x_0": np.random.default_rng(2).standard_normal((4, 6))}
    with pytest.raises(AssertionError):
        check_signature(ctx, arrays, parse_signature("(P) -> P", ndim=1))
