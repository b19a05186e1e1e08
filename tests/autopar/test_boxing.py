"""Boxing: every 1-D transition's collective and bytes, and relations between costs."""

import itertools
import math

import pytest

from autopar.hardware.cluster import Cluster
from autopar.hardware.collectives import (
    Collective,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    reduce_scatter_time,
)
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import B, P, S, nd
from autopar.runtimes.registry import boxing_plan, boxing_time

MESH8 = Mesh(Cluster.parse("1x8"), (8,))
MESH42 = Mesh(Cluster.parse("2x4"), (4, 2))
SHAPE = (64, 128)
ITEM = 2
T = 64 * 128 * 2  # bytes


@pytest.mark.parametrize(
    "src,dst,kind,bytes_sent",
    [
        (S(0), B, Collective.ALL_GATHER, 7 / 8 * T),
        (S(1), B, Collective.ALL_GATHER, 7 / 8 * T),
        (P, B, Collective.ALL_REDUCE, 2 * 7 / 8 * T),
        (P, S(0), Collective.REDUCE_SCATTER, 7 / 8 * T),
        (P, S(1), Collective.REDUCE_SCATTER, 7 / 8 * T),
        (S(0), S(1), Collective.ALL_TO_ALL, 7 / 64 * T),
        (S(1), S(0), Collective.ALL_TO_ALL, 7 / 64 * T),
    ],
)
def test_one_d_transition_collective_and_bytes(src, dst, kind, bytes_sent):
    plan = boxing_plan(SHAPE, ITEM, nd(src), nd(dst), MESH8)
    assert len(plan.steps) == 1
    (step,) = plan.steps
    assert step.collective is kind and step.axis == 0
    assert step.bytes_per_device == pytest.approx(bytes_sent)
    assert plan.time_s > 0


@pytest.mark.parametrize("src,dst", [(B, S(0)), (B, S(1)), (B, P), (S(0), P), (S(1), P)])
def test_local_transitions_cost_nothing(src, dst):
    plan = boxing_plan(SHAPE, ITEM, nd(src), nd(dst), MESH8)
    assert plan.time_s == 0 and plan.steps == ()


@pytest.mark.parametrize("v", [S(0), S(1), B, P])
def test_same_sbp_costs_zero(v):
    assert boxing_time(SHAPE, ITEM, nd(v), nd(v), MESH8) == 0
    assert boxing_time(SHAPE, ITEM, nd(v, v), nd(v, v), MESH42) == 0


def test_all_reduce_cheaper_than_gather_plus_scatter():
    link = MESH8.axes[0]
    for size in (1e3, 1e6, 1e9):
        assert all_reduce_time(size, link) <= all_gather_time(size, link) + reduce_scatter_time(size, link)
        assert all_to_all_time(size, link) < all_gather_time(size, link)


def test_costs_grow_with_bytes_and_inter_node_is_slower():
    inter, intra = MESH42.axes
    assert inter.crosses_nodes and not intra.crosses_nodes
    assert all_reduce_time(1e8, inter) > all_reduce_time(1e8, intra)
    assert all_gather_time(2e8, intra) > all_gather_time(1e8, intra)


def test_uneven_split_is_impossible():
    assert math.isinf(boxing_time((6, 6), ITEM, nd(B), nd(S(0)), MESH8))


def test_two_d_partial_to_broadcast_is_hierarchical_all_reduce():
    plan = boxing_plan(SHAPE, ITEM, nd(P, P), nd(B, B), MESH42)
    kinds = [(s.axis, s.collective) for s in plan.steps]
    # reduce-scatter inside the node, all-reduce the shard across nodes, all-gather inside
    assert kinds == [
        (1, Collective.REDUCE_SCATTER),
        (0, Collective.ALL_REDUCE),
        (1, Collective.ALL_GATHER),
    ]
    two_all_reduces = boxing_time(SHAPE, ITEM, nd(P, P), nd(P, B), MESH42) + boxing_time(
        SHAPE, ITEM, nd(P, B), nd(B, B), MESH42
    )
    assert plan.time_s < two_all_reduces
    assert plan.steps[1].bytes_per_device == pytest.approx(2 * 3 / 4 * T / 2)


def test_two_d_uses_middle_sbp_to_shrink_bytes():
    # (S(0), B) -> (B, S(0)): slice on axis 1 first (free), then gather half-size on axis 0
    plan = boxing_plan(SHAPE, ITEM, nd(S(0), B), nd(B, S(0)), MESH42)
    assert [s.collective for s in plan.steps] == [Collective.ALL_GATHER]
    assert plan.steps[0].bytes_per_device == pytest.approx(3 / 4 * T / 2)


def test_two_d_plan_no_worse_than_any_fixed_order():
    values = [S(0), S(1), B, P]
    for src in itertools.product(values, repeat=2):
        for dst in itertools.product(values, repeat=2):
            s, d = nd(*src), nd(*dst)
            best = boxing_time(SHAPE, ITEM, s, d, MESH42)
            if not (isinstance(dst[0], type(P)) or isinstance(dst[1], type(P))) and not math.isinf(best):
                # axis-by-axis in either order is one candidate sequence
                for order in ((0, 1), (1, 0)):
                    mid = s.replace(order[0], d[order[0]])
                    t = boxing_time(SHAPE, ITEM, s, mid, MESH42) + boxing_time(SHAPE, ITEM, mid, d, MESH42)
                    assert best <= t + 1e-12


def test_partial_to_split_no_worse_than_all_reduce():
    assert boxing_time(SHAPE, ITEM, nd(P), nd(S(0)), MESH8) < boxing_time(SHAPE, ITEM, nd(P), nd(B), MESH8)


def test_broadcast_or_split_to_partial_is_free_but_partial_from_split_costs_nothing_only_locally():
    assert boxing_time(SHAPE, ITEM, nd(S(0), B), nd(P, B), MESH42) == 0


# ------------------------------------------------------------------ OneFlow 0.9 pricing


def test_oneflow_pricing_follows_observed_routes_and_lowers_each_hop():
    """The oneflow-0.9 lowering takes the middle SBPs OneFlow inserted (boxing_observed.json)
    and prices each hop per mesh axis with the bytes of autopar.runtimes.oneflow_09.lowering.lower_hop."""
    from autopar.hardware.cluster import Cluster
    from autopar.hardware.mesh import Mesh
    from autopar.ir.sbp import parse_nd_sbp
    from autopar.runtimes.oneflow_09.boxing import OneFlowBoxing
    from autopar.runtimes.oneflow_09.lowering import lower_chain
    from autopar.runtimes.oneflow_09.pricing import observed_routes, oneflow_route

    mesh = Mesh(Cluster.parse("2x2"), (2, 2))
    shape, itemsize = (8, 16), 4
    routes = {k: v for k, v in observed_routes().items() if k[0] == (2, 2)}
    assert routes
    for (_, src, dst), middle in routes.items():
        s, d = parse_nd_sbp(src), parse_nd_sbp(dst)
        chain = oneflow_route(shape, itemsize, s, d, (2, 2))
        assert chain is not None and [str(x) for x in chain[1:-1]] == list(middle)
        plan = OneFlowBoxing(shape, itemsize, mesh).plan(s, d)
        hops = lower_chain(shape, itemsize, chain, (2, 2))
        for axis in (0, 1):
            want = sum(h.bytes_per_axis.get(axis, 0.0) for h in hops)
            got = sum(st.bytes_per_device for st in plan.steps if st.axis == axis)
            assert got == pytest.approx(want)
    # a flat all-gather over [2, 2] counts its hierarchical parts: T/2 on axis 0, T/4 on axis 1
    t = 8 * 16 * 4
    plan = OneFlowBoxing(shape, itemsize, mesh).plan(parse_nd_sbp("(S(0), S(0))"), parse_nd_sbp("(B, B)"))
    assert {st.axis: st.bytes_per_device for st in plan.steps} == {0: t / 2, 1: t / 4}
