import pytest

from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import (
    B,
    NdSbp,
    P,
    S,
    Signature,
    Split,
    balanced_sizes,
    is_even,
    local_shape,
    nd,
    parse_nd_sbp,
    parse_sbp,
    parse_signature,
    shard_numel,
)


def test_values_print_short_and_repr_precise():
    assert str(S(0)) == "S(0)" and repr(S(0)) == "Split(dim=0)"
    assert str(B) == "B" and str(P) == "P"
    assert str(nd(S(0), B)) == "(S(0), B)"
    assert str(nd(S(1))) == "S(1)"


def test_values_are_hashable_value_objects():
    assert S(1) == Split(1) and hash(S(1)) == hash(Split(1))
    assert len({nd(S(0), B), nd(S(0), B), nd(B, S(0))}) == 2
    with pytest.raises(AttributeError):
        S(0).dim = 3  # type: ignore[misc]


def test_negative_split_dim_refused():
    with pytest.raises(ValueError, match="dim >= 0"):
        S(-1)


@pytest.mark.parametrize("text", ["S(0)", "B", "P", "S(12)"])
def test_parse_value_round_trip(text):
    assert str(parse_sbp(text)) == text


@pytest.mark.parametrize("text", ["(S(0), B)", "(B, S(1))", "(P, P)", "S(0)", "(S(0), S(1), B)"])
def test_parse_nd_round_trip(text):
    assert str(parse_nd_sbp(text)) == text


@pytest.mark.parametrize("bad", ["S", "X", "S(-1)", "(S(0), Q)", ""])
def test_parse_rejects_garbage(bad):
    with pytest.raises(ValueError):
        parse_nd_sbp(bad)


def test_signature_prints_and_parses():
    sig = Signature((nd(S(0), B), nd(B, S(0))), (nd(S(0), S(1)),))
    assert str(sig) == "((S(0), B), (B, S(0))) -> (S(0), S(1))"
    assert parse_signature(str(sig)) == sig
    one_d = Signature((nd(S(0)), nd(B)), (nd(S(0)),))
    assert str(one_d) == "(S(0), B) -> S(0)"
    assert parse_signature(str(one_d)) == one_d


def test_signature_with_several_outputs_round_trips_1d_and_2d():
    one_d = Signature((nd(S(0)),), (nd(S(0)), nd(B)))
    assert str(one_d) == "(S(0)) -> (S(0), B)"
    assert parse_signature(str(one_d), ndim=1) == one_d
    two_d = Signature((nd(S(0), B),), (nd(S(0), B), nd(P, B)))
    assert parse_signature(str(two_d), ndim=2) == two_d


def test_local_shape_divides_evenly_and_refuses_what_oneflow_refuses():
    assert local_shape((8, 6), nd(S(0), S(1)), (4, 2)) == (2, 3)
    assert local_shape((8, 6), nd(S(0), S(0)), (4, 2)) == (1, 6)
    assert local_shape((8, 6), nd(P, B), (4, 2)) == (8, 6)
    assert local_shape((8,), nd(S(1), B), (4, 2)) is None  # no dim 1
    # OneFlow's Storage4NdSbp: a split dim shorter than its axis is refused
    assert local_shape((3, 6), nd(S(0), B), (4, 2)) is None  # 3 < 4
    # floor-divided by the earlier axes first: 5 // 4 = 1 < 2
    assert local_shape((5,), nd(S(0), S(0)), (4, 2)) is None
    assert local_shape((0, 4), nd(S(0), B), (1, 2)) is None  # an empty dim is shorter than any axis


def test_local_shape_gives_the_largest_balanced_shard_of_an_uneven_split():
    # OneFlow's BalancedSplitter: the first size % n parts get one more row
    assert balanced_sizes(17, 2) == (9, 8)
    assert balanced_sizes(20, 6) == (4, 4, 3, 3, 3, 3)  # balanced_splitter.h's own example
    assert sum(balanced_sizes(17, 8)) == 17
    assert local_shape((6, 6), nd(S(0), B), (4, 2)) == (2, 6)  # 6 over 4: 2, 2, 1, 1
    assert local_shape((8, 17, 64), nd(S(0), S(1)), (4, 2)) == (2, 9, 64)  # vit's 17 tokens
    assert local_shape((12, 6), nd(S(0), S(0)), (4, 2)) == (2, 6)  # 12 / 4 = 3, then 2 and 1
    assert local_shape((5,), nd(S(0), S(0)), (2, 2)) == (2,)  # 5 -> 3, 2 -> 2, 1, 1, 1


def test_even_and_shard_sizes():
    assert is_even((8, 6), nd(S(0), S(1)), (4, 2))
    assert not is_even((8, 17, 64), nd(S(0), S(1)), (4, 2))
    assert shard_numel((8, 6), nd(S(0), S(1)), (4, 2)) == 48 / 8
    assert shard_numel((8, 17, 64), nd(S(0), S(1)), (4, 2)) == 2 * 9 * 64
    with pytest.raises(ValueError):
        shard_numel((3,), nd(S(0), B), (4, 2))


def test_split_factor_counts_split_axes_only():
    assert nd(S(0), B).split_factor((4, 2)) == 4
    assert nd(S(0), S(1)).split_factor((4, 2)) == 8
    assert nd(P, B).split_factor((4, 2)) == 1


def test_nd_sbp_needs_axes():
    with pytest.raises(ValueError):
        NdSbp(())


def test_mesh_axis_links_follow_node_boundaries():
    cluster = Cluster.parse("2x4", "a100-40g")
    m42 = Mesh(cluster, (4, 2))
    assert m42.axes[0].crosses_nodes and not m42.axes[1].crosses_nodes
    m24 = Mesh(cluster, (2, 4))
    assert m24.axes[0].crosses_nodes and not m24.axes[1].crosses_nodes
    m8 = Mesh(cluster, (8,))
    assert m8.axes[0].crosses_nodes
    single = Mesh(Cluster.parse("1x8"), (4, 2))
    assert not any(a.crosses_nodes for a in single.axes)
