"""The counter's own per-hop byte formula (autopar/oneflow/kernel_bytes.py) against lower_hop."""

from __future__ import annotations

import itertools

import pytest

from autopar.oneflow.kernel_bytes import kernel_hop_bytes
from autopar.oneflow.lowering import lower_hop
from autopar.sbp import B, NdSbp, P, S

VALUES = (B, P, S(0), S(1))


def test_same_layout_and_local_moves_cost_nothing():
    mesh = (4, 2)
    for src in (NdSbp((S(0), B)), NdSbp((B, B))):
        assert sum(kernel_hop_bytes((8, 16), 4, src, src, mesh).values()) == 0
    # B -> S and B -> P are local on every axis
    assert sum(kernel_hop_bytes((8, 16), 4, NdSbp((B, B)), NdSbp((S(0), S(1))), mesh).values()) == 0
    assert sum(kernel_hop_bytes((8, 16), 4, NdSbp((B, B)), NdSbp((P, P)), mesh).values()) == 0


def test_all_reduce_moves_what_a_reduce_scatter_and_an_all_gather_move():
    mesh, shape = (4, 2), (8, 16)
    ar = kernel_hop_bytes(shape, 4, NdSbp((S(0), P)), NdSbp((S(0), B)), mesh)[1]
    rs = kernel_hop_bytes(shape, 4, NdSbp((S(0), P)), NdSbp((S(0), S(1))), mesh)[1]
    ag = kernel_hop_bytes(shape, 4, NdSbp((S(0), S(1))), NdSbp((S(0), B)), mesh)[1]
    assert ar == pytest.approx(2 * ag)
    assert rs == pytest.approx(ag)  # (*, P) -> (*, S) is send/recv in OneFlow: the same volume


def test_flat_collectives_follow_the_ring_over_ranks_in_mesh_order():
    """A 1-D all-reduce over all 8 ranks of [4, 2]: half of a ring's links cross axis 0."""
    got = kernel_hop_bytes((64,), 4, NdSbp((P, P)), NdSbp((B, B)), (4, 2))
    total = 2 * 7 / 8 * 64 * 4
    assert sum(got.values()) == pytest.approx(total)
    assert got[0] == pytest.approx(total / 2)


@pytest.mark.parametrize(("mesh", "shape"), [((4, 2), (8, 16, 4)), ((2, 2), (6, 10)), ((8,), (16, 8))])
def test_totals_agree_with_lower_hop_on_every_pair(mesh, shape):
    """The two formulas are written apart; their per-hop totals must still agree (their
    split over axes differs only for collectives over all ranks: ring vs hierarchy)."""
    for a in itertools.product(VALUES, repeat=len(mesh)):
        for b in itertools.product(VALUES, repeat=len(mesh)):
            src, dst = NdSbp(a), NdSbp(b)
            kernel = kernel_hop_bytes(shape, 4, src, dst, mesh)
            lowered = lower_hop(shape, 4, src, dst, mesh)
            assert sum(kernel.values()) == pytest.approx(lowered.total_bytes), (src, dst)
            if len(set(a)) > 1 or len(set(b)) > 1:
                for axis in range(len(mesh)):
                    assert kernel[axis] == pytest.approx(lowered.bytes_per_axis.get(axis, 0.0)), (src, dst)
