"""The fast ways the OneFlow 0.9 pricing computes its prices give the slow ways' prices exactly.

* send/recv bytes (:func:`autopar.runtimes.oneflow_09.lowering._send_recv`, a tensor contraction)
  against the per-device-pair count it replaced, kept here as the reference;
* a whole boxing matrix's middle-node routes (:func:`autopar.runtimes.oneflow_09.pricing.oneflow_routes`)
  against :func:`autopar.runtimes.oneflow_09.copy_cost.cheapest_middle_route` pair by pair;
* :meth:`autopar.runtimes.oneflow_09.boxing.OneFlowBoxing.matrix` / ``time`` against its plans' seconds.

(``scripts/cost_tables_identity.py`` compares whole cost tables before and after a change.)
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

import pytest

from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import B, Broadcast, NdSbp, P, Partial, SbpValue, Split, is_even, parse_nd_sbp
from autopar.runtimes.oneflow_09.boxing import OneFlowBoxing
from autopar.runtimes.oneflow_09.copy_cost import VALID_MAX_COPY_COST, cheapest_middle_route, lazy_copy_cost
from autopar.runtimes.oneflow_09.lowering import _send_recv, device_slices
from autopar.runtimes.oneflow_09.pricing import _states, observed_routes, oneflow_routes, oneflow_steps


def reference_send_recv(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, hierarchy: Sequence[int]
) -> dict[int, float]:
    """Every receiver, every sender it reads, the intersection of their slices (the loop the
    contraction replaced)."""
    coords = list(itertools.product(*(range(int(h)) for h in hierarchy)))
    per_axis = {a: 0.0 for a in range(len(hierarchy))}
    for d in coords:
        want = device_slices(shape, dst, hierarchy, d)
        choices = [
            [d[a]]
            if isinstance(v, Broadcast) or (isinstance(v, Partial) and isinstance(dst[a], Partial))
            else list(range(int(hierarchy[a])))
            for a, v in enumerate(src)
        ]
        for s in itertools.product(*choices):
            if tuple(s) == tuple(d):
                continue
            have = device_slices(shape, src, hierarchy, s)
            part = math.prod(max(0, min(x1, y1) - max(x0, y0)) for (x0, x1), (y0, y1) in zip(have, want))
            if part:
                per_axis[next(a for a in range(len(hierarchy)) if s[a] != d[a])] += part * itemsize
    return {a: b / len(coords) for a, b in per_axis.items()}


def _random_case(
    rng: random.Random, hierarchies: list[list[int]]
) -> tuple[list[int], int, NdSbp, NdSbp, list[int]]:
    hierarchy = rng.choice(hierarchies)
    rank = rng.choice([1, 2, 3])
    shape = [rng.choice([1, 2, 3, 5, 6, 7, 8, 12, 30]) for _ in range(rank)]
    values: list[SbpValue] = [B, P, *(Split(d) for d in range(rank))]
    src, dst = (NdSbp(tuple(rng.choice(values) for _ in hierarchy)) for _ in range(2))
    return shape, rng.choice([1, 2, 4]), src, dst, hierarchy


def test_send_recv_bytes_equal_the_per_device_count_even_uneven() -> None:
    rng = random.Random(0)
    small = [[4], [2, 2], [4, 2], [3, 2], [2, 3, 2], [2, 2, 2], [1, 4], [2, 1, 3]]
    for _ in range(400):
        case = _random_case(rng, small)
        assert _send_recv(*case) == reference_send_recv(*case), case


def test_send_recv_bytes_equal_the_per_device_count_on_larger_meshes() -> None:
    rng = random.Random(1)
    for _ in range(12):  # the contraction path that orders its einsum (more than 4096 cells)
        case = _random_case(rng, [[16, 8], [8, 4, 4], [64, 2]])
        assert _send_recv(*case) == reference_send_recv(*case), case


@pytest.mark.parametrize("hierarchy", [(4, 2), (2, 4), (8, 8)])
@pytest.mark.parametrize("shape", [(12, 768), (4, 6, 10), (250, 96)])
def test_batched_routes_are_the_pairwise_cheapest_routes(
    shape: tuple[int, ...], hierarchy: tuple[int, ...]
) -> None:
    states = _states(shape, hierarchy)
    pairs = [(s, d) for s in states for d in states if s != d]
    routes = oneflow_routes(shape, 2, pairs, hierarchy)
    nbytes = float(math.prod(shape) * 2)
    for (src, dst), route in zip(pairs, routes):
        seen = observed_routes().get((hierarchy, str(src), str(dst)))
        middle = [parse_nd_sbp(m) for m in seen] if seen is not None else None
        if middle is not None and all(is_even(shape, m, hierarchy) for m in middle):
            want: list[NdSbp] | None = [src, *middle, dst]
        elif lazy_copy_cost(nbytes, src, dst, hierarchy) <= VALID_MAX_COPY_COST:
            want = [src, dst]
        else:
            first = {m: lazy_copy_cost(nbytes, src, m, hierarchy) for m in states}
            last = {m: lazy_copy_cost(nbytes, m, dst, hierarchy) for m in states}
            best, found = cheapest_middle_route(nbytes, hierarchy, states, first, last)
            want = [src, *found, dst] if found is not None and best <= VALID_MAX_COPY_COST else None
        assert route == want, (src, dst)


@pytest.mark.parametrize(("cluster", "mesh_shape"), [("2x4", (4, 2)), ("2x4", (2, 2, 2)), ("2x4", (4, 2, 1))])
def test_matrix_time_and_plan_are_oneflow_steps(cluster: str, mesh_shape: tuple[int, ...]) -> None:
    mesh = Mesh(Cluster.parse(cluster), mesh_shape)
    shape = (8, 12, 16)
    values: list[SbpValue] = [B, P, Split(0), Split(2), Split(3)]  # S(3): not a layout
    sbps = [NdSbp(v) for v in itertools.product(values, repeat=len(mesh_shape))]
    priced = OneFlowBoxing(shape, 2, mesh).matrix(sbps, sbps)
    alone, planned = OneFlowBoxing(shape, 2, mesh), OneFlowBoxing(shape, 2, mesh)
    for n, (src, dst) in enumerate(itertools.product(sbps, sbps)):
        steps = oneflow_steps(shape, 2, src, dst, mesh)
        want = math.inf if steps is None else sum(step[5] for step in steps)
        assert priced[n // len(sbps), n % len(sbps)] == want, (src, dst)
        if n % 7 == 0:  # one pair at a time
            assert alone.time(src, dst) == want
            plan = planned.plan(src, dst)
            assert plan.time_s == want
            assert [
                (s.axis, s.collective.value, s.src, s.dst, s.bytes_per_device, s.time_s) for s in plan.steps
            ] == [(a, k, s, d, b, t) for a, k, s, d, b, t in steps or []]
