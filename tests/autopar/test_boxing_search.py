"""BoxingSearch against the exhaustive Dijkstra it replaced, on small meshes; size-1 axes;
large mesh ranks stay bounded and priced by valid sequences."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np
import pytest

from autopar.hardware.cluster import Cluster
from autopar.hardware.collectives import _TIME, Collective, collective_bytes
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import B, NdSbp, P, SbpValue, Split, is_even, local_shape
from autopar.runtimes.boxing import INF, BoxingPlan, BoxingStep, one_axis_collective
from autopar.runtimes.ideal import BoxingSearch
from autopar.runtimes.registry import boxing_matrix, boxing_plan


def _even_local_shape(shape: Sequence[int], sbp: NdSbp, mesh_shape: Sequence[int]) -> tuple[int, ...] | None:
    """``local_shape`` as the replaced search knew it: None unless every split divides."""
    if not is_even(shape, sbp, mesh_shape):
        return None
    return local_shape(shape, sbp, mesh_shape)


def _group_bytes(
    shape: Sequence[int], itemsize: int, sbp: NdSbp, axis: int, mesh_shape: Sequence[int]
) -> float | None:
    """Bytes of the tensor held by the group of ``axis``: local size ignoring ``axis``'s split."""
    unsplit = sbp.replace(axis, B)
    local = _even_local_shape(shape, unsplit, mesh_shape)
    if local is None:
        return None
    return float(math.prod(local) * itemsize)


def _step(
    shape: Sequence[int], itemsize: int, mesh: Mesh, cur: NdSbp, axis: int, value: SbpValue
) -> BoxingStep | None:
    nxt = cur.replace(axis, value)
    if _even_local_shape(shape, nxt, mesh.shape) is None:
        return None
    kind = one_axis_collective(cur[axis], value)
    if kind is None:
        return None
    group = _group_bytes(shape, itemsize, cur, axis, mesh.shape)
    if group is None:
        return None
    link = mesh.axes[axis]
    if kind is Collective.LOCAL:
        return BoxingStep(axis, kind, cur, nxt, 0.0, 0.0)
    return BoxingStep(
        axis, kind, cur, nxt, collective_bytes(kind, group, link.size), _TIME[kind](group, link)
    )


class ReferenceSearch:
    """The exhaustive search this module's BoxingSearch replaced (verbatim, renamed)."""

    def __init__(self, shape: Sequence[int], itemsize: int, mesh: Mesh) -> None:
        self.shape = tuple(shape)
        self.itemsize = itemsize
        self.mesh = mesh
        self.values: tuple[SbpValue, ...] = (B, P, *(Split(d) for d in range(len(self.shape))))
        self._steps: dict[tuple[NdSbp, int, SbpValue], BoxingStep | None] = {}
        self._trees: dict[NdSbp, tuple[dict[NdSbp, float], dict[NdSbp, BoxingStep]]] = {}

    def _move(self, cur: NdSbp, axis: int, value: SbpValue) -> BoxingStep | None:
        key = (cur, axis, value)
        if key not in self._steps:
            self._steps[key] = _step(self.shape, self.itemsize, self.mesh, cur, axis, value)
        return self._steps[key]

    def _tree(self, src: NdSbp) -> tuple[dict[NdSbp, float], dict[NdSbp, BoxingStep]]:
        tree = self._trees.get(src)
        if tree is not None:
            return tree
        best: dict[NdSbp, float] = {src: 0.0}
        back: dict[NdSbp, BoxingStep] = {}
        heap: list[tuple[float, int, int, NdSbp]] = [(0.0, 0, 0, src)]
        counter = 1
        hops: dict[NdSbp, int] = {src: 0}
        done: set[NdSbp] = set()
        while heap:
            cost, nhops, _, cur = heapq.heappop(heap)
            if cur in done:
                continue
            done.add(cur)
            for axis in range(self.mesh.ndim):
                for value in self.values:
                    if value == cur[axis]:
                        continue
                    step = self._move(cur, axis, value)
                    if step is None:
                        continue
                    new_cost = cost + step.time_s
                    old = best.get(step.dst, INF)
                    # ties: fewer steps
                    if new_cost < old or (new_cost == old and nhops + 1 < hops[step.dst]):
                        best[step.dst] = new_cost
                        hops[step.dst] = nhops + 1
                        back[step.dst] = step
                        heapq.heappush(heap, (new_cost, nhops + 1, counter, step.dst))
                        counter += 1
        self._trees[src] = (best, back)
        return best, back

    def time(self, src: NdSbp, dst: NdSbp) -> float:
        if src == dst:
            return 0.0
        if _even_local_shape(self.shape, src, self.mesh.shape) is None:
            return INF
        return self._tree(src)[0].get(dst, INF)

    def plan(self, src: NdSbp, dst: NdSbp) -> BoxingPlan:
        t = self.time(src, dst)
        if src == dst or not math.isfinite(t):
            return BoxingPlan(src, dst, (), t)
        _, back = self._tree(src)
        steps: list[BoxingStep] = []
        node = dst
        while node != src:
            step = back[node]
            steps.append(step)
            node = step.src
        steps.reverse()
        real_steps = tuple(s for s in steps if s.collective is not Collective.LOCAL)
        return BoxingPlan(src, dst, real_steps, t)


MESHES = [
    Mesh(Cluster.parse("1x8"), (8,)),
    Mesh(Cluster.parse("2x4"), (4, 2)),
    Mesh(Cluster.parse("2x4"), (2, 4)),
    Mesh(Cluster.parse("2x4"), (2, 2, 2)),
]
SHAPES = [(64, 128), (6, 8), (16, 4, 8)]


def all_sbps(ndims: int, rank: int) -> list[NdSbp]:
    values: list[SbpValue] = [B, P, *(Split(d) for d in range(ndims))]
    return [NdSbp(v) for v in itertools.product(values, repeat=rank)]


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: str(list(m.shape)))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_identical_to_the_exhaustive_search_on_meshes_without_size_1_axes(mesh, shape):
    # every layout but the uneven ones OneFlow accepts (the replaced search refused them:
    # see test_uneven_layouts_only_start_or_end_a_route)
    sbps = [
        s
        for s in all_sbps(len(shape), mesh.ndim)
        if is_even(shape, s, mesh.shape) or local_shape(shape, s, mesh.shape) is None
    ]
    ref = ReferenceSearch(shape, 2, mesh)
    new = BoxingSearch(shape, 2, mesh)
    matrix = boxing_matrix(shape, 2, sbps, sbps, mesh)
    for i, s in enumerate(sbps):
        for j, d in enumerate(sbps):
            expected = ref.time(s, d)
            assert new.time(s, d) == expected, (s, d)
            assert matrix[i, j] == expected or (math.isinf(expected) and math.isinf(matrix[i, j]))
    for s, d in itertools.islice(itertools.product(sbps, sbps), 0, None, 7):
        a, b = ref.plan(s, d), new.plan(s, d)
        assert a == b, (s, d)


@pytest.mark.parametrize("padded", [(1, 4, 2), (4, 1, 2), (4, 2, 1), (1, 1, 4, 1, 2)])
def test_size_1_axes_change_no_price(padded):
    """A size-1 axis is free to change and never alters another axis's group: prices on
    [4, 2] padded with size-1 axes equal those on [4, 2] whatever the padded axes hold."""
    shape = (16, 4, 8)
    plain = Mesh(Cluster.parse("2x4"), (4, 2))
    mesh = Mesh(Cluster.parse("2x4"), padded)
    kept = [a for a, n in enumerate(padded) if n > 1]
    ref = ReferenceSearch(shape, 2, plain)
    search = BoxingSearch(shape, 2, mesh)
    pads = [B, P, Split(2)]

    def lift(sbp: NdSbp, pad: SbpValue) -> NdSbp:
        vals = [pad] * len(padded)
        for a, v in zip(kept, sbp.values):
            vals[a] = v
        return NdSbp(tuple(vals))

    sbps = [s for s in all_sbps(len(shape), 2) if local_shape(shape, s, plain.shape) is not None]
    for s, d in itertools.product(sbps, sbps):
        for ps, pd in itertools.product(pads, pads):
            ls, ld = lift(s, ps), lift(d, pd)
            expected = 0.0 if ls == ld else ref.time(s, d)
            assert search.time(ls, ld) == expected, (ls, ld)
    plan = search.plan(lift(NdSbp((P, P)), B), lift(NdSbp((B, B)), P))
    assert [step.axis for step in plan.steps] and all(step.axis in kept for step in plan.steps)


def test_high_rank_mesh_is_bounded_and_prices_a_valid_sequence():
    """A 12-axis mesh of size 2 (4096 devices): searched per pair, every price is the time of
    the plan's own steps, each a legal 1-D move."""
    mesh = Mesh(Cluster.parse("512x8"), (2,) * 12)
    shape = (4096, 4096)
    search = BoxingSearch(shape, 2, mesh)
    assert not search.whole
    src = NdSbp((P,) * 6 + (Split(0),) * 6)
    dst = NdSbp((Split(1),) * 6 + (B,) * 6)
    plan = boxing_plan(shape, 2, src, dst, mesh)
    assert math.isfinite(plan.time_s) and plan.time_s > 0
    assert math.isclose(sum(step.time_s for step in plan.steps), plan.time_s)
    for step in plan.steps:
        changed = [a for a in range(12) if step.src[a] != step.dst[a]]
        assert changed == [step.axis]
        assert local_shape(shape, step.dst, mesh.shape) is not None
    # the all-B route is always available, so no price exceeds it
    gather_all = boxing_plan(shape, 2, src, NdSbp((B,) * 12), mesh).time_s
    assert plan.time_s <= gather_all + 1e-12


def test_matrix_marks_impossible_layouts_inf():
    mesh = Mesh(Cluster.parse("1x8"), (8,))
    m = boxing_matrix((6, 6), 2, [NdSbp((B,)), NdSbp((Split(0),))], [NdSbp((Split(0),)), NdSbp((B,))], mesh)
    assert np.isinf(m[0, 0]) and m[0, 1] == 0.0 and np.isinf(m[1, 1])


def test_uneven_layouts_only_start_or_end_a_route():
    """6 rows over 4 devices (2, 2, 1, 1): OneFlow accepts the layout, so it is priced, by the
    largest shard; routes between even layouts never pass through it."""
    mesh = Mesh(Cluster.parse("2x4"), (4, 2))
    shape, itemsize = (6, 8), 2
    search = BoxingSearch(shape, itemsize, mesh)
    uneven = NdSbp((Split(0), B))
    gather = search.plan(uneven, NdSbp((B, B)))
    assert [(s.axis, s.collective) for s in gather.steps] == [(0, Collective.ALL_GATHER)]
    # time: a ring on 4 chunks of the largest shard (2 x 8 elements); bytes: the exact average
    padded, exact = 4 * 2 * 8 * itemsize, 6 * 8 * itemsize
    assert gather.time_s == _TIME[Collective.ALL_GATHER](padded, mesh.axes[0])
    assert gather.steps[0].bytes_per_device == collective_bytes(Collective.ALL_GATHER, exact, 4)
    assert math.isfinite(search.time(NdSbp((B, B)), uneven))  # a local slice into it
    assert search.time(NdSbp((Split(0), Split(0))), uneven) == INF  # 6 // 4 = 1 < 2: refused
    even = [s for s in all_sbps(len(shape), 2) if is_even(shape, s, mesh.shape)]
    for s, d in itertools.product(even, even):
        for step in search.plan(s, d).steps:
            assert is_even(shape, step.src, mesh.shape) and is_even(shape, step.dst, mesh.shape), (s, d)
