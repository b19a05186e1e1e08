"""The counter's own per-hop byte formula (autopar/bridges/oneflow/kernel_bytes.py) against lower_hop."""

from __future__ import annotations

import itertools

import pytest

from autopar.bridges.oneflow.kernel_bytes import kernel_hop_bytes
from autopar.ir.sbp import B, NdSbp, P, S
from autopar.runtimes.oneflow_09.lowering import lower_hop

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
    split over axes differs only for collectives over all ranks: NCCL's ring vs the model's
    hierarchical schedule)."""
    for a in itertools.product(VALUES, repeat=len(mesh)):
        for b in itertools.product(VALUES, repeat=len(mesh)):
            src, dst = NdSbp(a), NdSbp(b)
            kernel = kernel_hop_bytes(shape, 4, src, dst, mesh)
            lowered = lower_hop(shape, 4, src, dst, mesh)
            assert sum(kernel.values()) == pytest.approx(lowered.total_bytes), (src, dst)
            if len(set(a)) > 1 or len(set(b)) > 1:
                for axis in range(len(mesh)):
                    assert kernel[axis] == pytest.approx(lowered.bytes_per_axis.get(axis, 0.0)), (src, dst)


@pytest.mark.parametrize(
    ("src", "dst", "factor"),
    [
        (NdSbp((S(0), S(0))), NdSbp((B, B)), 1),  # all-gather
        (NdSbp((P, P)), NdSbp((S(1), S(1))), 1),  # reduce-scatter
        (NdSbp((P, P)), NdSbp((B, B)), 2),  # all-reduce
    ],
)
def test_flat_collective_split_ring_against_hierarchical_schedule(src, dst, factor):
    """The one place the formulas differ (docs/oneflow-boxing.md, "Flat collectives"): OneFlow
    runs the hop as one NCCL collective over all 8 ranks of [4, 2]; the ring sends n0/N of its
    volume across axis 0 (0.4375 T per axis), lower_hop prices the volumes of a hierarchical
    schedule (axis 0 (n0-1)/n0 T = 0.75 T, axis 1 (n1-1)/n1 T/n0 = 0.125 T); same total."""
    shape, mesh = (16, 32), (4, 2)
    t = 16 * 32 * 4
    ring = kernel_hop_bytes(shape, 4, src, dst, mesh)
    hierarchical = lower_hop(shape, 4, src, dst, mesh).bytes_per_axis
    assert ring[0] == pytest.approx(factor * 0.4375 * t) and ring[1] == pytest.approx(factor * 0.4375 * t)
    assert hierarchical[0] == pytest.approx(factor * 0.75 * t)
    assert hierarchical[1] == pytest.approx(factor * 0.125 * t)
