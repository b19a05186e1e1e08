"""The shared three-axis hop table prices every boxing as the per-pair OneFlow path does.

:class:`autopar.runtimes.oneflow_09.hop_table.HopTable` fills the terms of many pairs at once
(a vectorised hop rule, send/recv counted over device pairs) and prices a whole
edge with numpy; the reference is :class:`autopar.runtimes.oneflow_09.boxing.OneFlowBoxing` without
the table (each pair routed, each hop lowered by ``lower_hop``, whose send/recv is
a tensor contraction).  Equal bit for bit.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from autopar.cost.edges import EdgeKind, edge_time
from autopar.cost.tables import _gradient_matrix
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import TensorSpec
from autopar.ir.sbp import B, NdSbp, P, Split, local_shape
from autopar.runtimes.oneflow_09.boxing import OneFlowBoxing
from autopar.runtimes.oneflow_09.hop_table import clear_tables, hop_table
from autopar.runtimes.registry import runtime_profile


def _layouts(shape: tuple[int, ...], mesh: Mesh) -> list[NdSbp]:
    values = [B, P, *(Split(d) for d in range(len(shape)))]
    combos = (NdSbp(c) for c in itertools.product(values, repeat=mesh.ndim))
    return [s for s in combos if local_shape(shape, s, mesh.shape) is not None]


CASES = [
    ("2x4", (2, 2, 2), (8, 12), 2),
    ("3x4", (3, 2, 2), (12, 6, 4), 4),
    ("2x4", (2, 1, 2, 2), (16, 4), 2),  # a size-1 axis: squeezed to three
]


@pytest.mark.parametrize(("cluster", "mesh_shape", "shape", "itemsize"), CASES)
def test_table_prices_equal_the_per_pair_path(
    cluster: str, mesh_shape: tuple[int, ...], shape: tuple[int, ...], itemsize: int
) -> None:
    clear_tables()
    mesh = Mesh(Cluster.parse(cluster), mesh_shape)
    states = _layouts(shape, mesh)
    # plus a layout that does not divide: inf, except to itself
    odd = NdSbp(tuple(Split(0) if n > 1 else B for n in mesh.shape))
    if local_shape(shape, odd, mesh.shape) is None:
        states.append(odd)
    search = OneFlowBoxing(shape, itemsize, mesh)
    table = search.shared_table()
    assert table is not None
    fast = search.matrices(states, states, table)[0]
    reference = OneFlowBoxing(shape, itemsize, mesh).matrices(states, states, None)[0]
    assert np.array_equal(fast, reference)
    assert np.isfinite(fast).sum() > len(states)  # something moves


def test_one_table_serves_every_tensor_of_a_mesh() -> None:
    clear_tables()
    mesh = Mesh(Cluster.parse("2x4"), (2, 2, 2))
    first = OneFlowBoxing((8, 16), 4, mesh).shared_table()
    second = OneFlowBoxing((64, 8), 2, mesh).shared_table()
    assert first is second is hop_table((2, 2, 2), mesh.axes, 2)
    for shape, itemsize in (((8, 16), 4), ((64, 8), 2)):
        states = _layouts(shape, mesh)
        got = OneFlowBoxing(shape, itemsize, mesh).matrix(states, states)
        want = OneFlowBoxing(shape, itemsize, mesh).matrices(states, states, None)[0]
        assert np.array_equal(got, want)


def test_two_axis_meshes_keep_the_routed_path() -> None:
    mesh = Mesh(Cluster.parse("2x4"), (4, 2))
    assert OneFlowBoxing((8, 8), 4, mesh).shared_table() is None


@pytest.mark.parametrize("bucket", [25 * 2**20, 0])
def test_gradient_edges_equal_edge_time_pair_by_pair(bucket: int) -> None:
    clear_tables()
    mesh = Mesh(Cluster.parse("2x4"), (2, 2, 2))
    spec = TensorSpec("g", (16, 8), "float32")
    runtime = runtime_profile("oneflow-0.9")
    runtime = dataclasses.replace(runtime, grad_bucket_bytes=bucket)
    states = _layouts(spec.shape, mesh)
    got = _gradient_matrix(spec, states, states, mesh, runtime)
    assert got is not None
    want = np.array(
        [[edge_time(spec, a, b, mesh, EdgeKind.GRADIENT, runtime)[0] for b in states] for a in states]
    )
    assert np.array_equal(got, want)


def test_a_consumer_partial_that_leaves_an_uneven_layout_is_priced_pair_by_pair() -> None:
    """``(S(2), S(0), S(0)) -> (S(0), S(0), P)`` on ``[2, 2, 8]`` with dim 0 of 16: the hop
    moves data to ``(S(0), S(0), S(0))``, which cuts 16 rows in 32 (OneFlow's uneven
    ``BalancedSplitter`` slices): the table's even-split count does not apply."""
    clear_tables()
    mesh = Mesh(Cluster.parse("4x8"), (2, 2, 8))
    shape = (16, 12, 4)
    src = NdSbp((Split(2), Split(0), Split(0)))
    dst = NdSbp((Split(0), Split(0), P))
    states = [src, dst, *_layouts(shape, mesh)[:40]]
    search = OneFlowBoxing(shape, 2, mesh)
    fast = search.matrices(states, states, search.shared_table())[0]
    reference = OneFlowBoxing(shape, 2, mesh).matrices(states, states, None)[0]
    assert fast[0, 1] == reference[0, 1]
    assert np.array_equal(fast, reference)
