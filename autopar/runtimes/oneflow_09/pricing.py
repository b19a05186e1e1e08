"""Price an N-D boxing as OneFlow 0.9 runs it: its route through middle nodes, then each hop.

The ``oneflow-0.9`` runtime profile (:class:`autopar.runtimes.oneflow_09.boxing.OneFlowBoxing`)
prices every boxing here, in two steps -- one registry for both:

1. **Route** (:func:`oneflow_route`): the N-D SBPs OneFlow passes through.
   OneFlow's ``BoxingWithMiddleNodes`` pass
   (``oneflow/core/job_rewriter/boxing_with_middle_nodes.cpp``) inserts
   ``System-Boxing-Middle-Identity`` ops with the middle SBPs its
   ``BoxingCollector`` (``oneflow/core/auto_parallel/boxing_collector.cpp``)
   picks.  Where a transition was observed in a compiled job
   (``autopar/runtimes/oneflow_09/boxing_observed.json``, written by
   ``tests/oneflow/_probe_boxing.py`` on ``[2, 2]`` and ``[4, 2]``), its
   observed middle SBPs are used; otherwise the route is the one of least
   OneFlow copy cost (``ComputeCopyCostWithMiddleNodes``,
   ``oneflow/core/framework/sbp_infer_util.cpp``, ported in
   :func:`autopar.runtimes.oneflow_09.copy_cost.lazy_copy_cost`): the direct hop when
   OneFlow boxes it directly, else the cheapest route through one middle SBP,
   else through two.
2. **Hop** (:func:`hop_steps`): each hop as OneFlow lowers it
   (:func:`autopar.runtimes.oneflow_09.lowering.lower_hop`: hierarchical NCCL collectives
   where ``InsertNcclLogicalOpPass`` has one, send/recv of the needed slices
   otherwise), bytes per device per mesh axis; one :class:`~autopar.runtimes.boxing.BoxingStep`
   per axis that moves bytes, timed with that axis's alpha-beta fit:
   ``steps * alpha + bytes / beta`` (ring steps ``n-1``, ``2(n-1)`` for an
   all-reduce, 1 for send/recv).

Shared code, said plainly: the byte count of one hop is the same function
(``lower_hop``) that :mod:`autopar.bridges.oneflow.traffic` uses to count a compiled
job.  The comparison of model and count (``benchmarks/fidelity.py``) therefore
checks *which* edges, SBPs, ZeRO layouts and routes the model predicts, not the
per-hop byte formula; that formula is checked against OneFlow's source, and the
routes of the observed table are in-sample (taken from compiled probe jobs).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autopar.ir.sbp import B, NdSbp, P, Partial, SbpValue, Split, is_even, local_shape, parse_nd_sbp
from autopar.runtimes.oneflow_09.copy_cost import (
    VALID_MAX_COPY_COST,
    cheapest_middle_route,
    cheapest_middle_route_in,
    copy_cost_matrix,
    lazy_copy_cost,
)
from autopar.runtimes.oneflow_09.lowering import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    LOCAL,
    REDUCE_SCATTER,
    SEND_RECV,
    Hop,
    lower_hop,
    ring_steps,
)

if TYPE_CHECKING:
    from autopar.hardware.mesh import Mesh

__all__ = [
    "Step",
    "chain_steps",
    "clear_caches",
    "hop_steps",
    "observed_routes",
    "oneflow_chain",
    "oneflow_route",
    "oneflow_routes",
    "oneflow_steps",
]

Step = tuple[int, str, NdSbp, NdSbp, float, float]
"""One step of a boxing: (mesh axis, collective name as :class:`autopar.hardware.collectives.Collective`
values, source SBP, SBP it produces, bytes per device, seconds);
:class:`autopar.runtimes.oneflow_09.boxing.OneFlowBoxing` turns it into a ``BoxingStep`` (this
module imports nothing of :mod:`autopar.runtimes.ideal`)."""

OBSERVED = Path(__file__).with_name("boxing_observed.json")

_KIND = {
    ALL_REDUCE: "all-reduce",
    ALL_GATHER: "all-gather",
    REDUCE_SCATTER: "reduce-scatter",
    ALL_TO_ALL: "all-to-all",
    SEND_RECV: "send-recv",
    LOCAL: "local",
}


@functools.lru_cache(maxsize=1)
def observed_routes() -> dict[tuple[tuple[int, ...], str, str], tuple[str, ...]]:
    """(hierarchy, src, dst) -> the middle SBPs OneFlow inserted, from ``boxing_observed.json``."""
    out: dict[tuple[tuple[int, ...], str, str], tuple[str, ...]] = {}
    data = json.loads(OBSERVED.read_text())
    for table in data.get("tables", []):
        hierarchy = tuple(int(h) for h in table["hierarchy"])
        for t in table["transitions"]:
            if t.get("compiled", True):
                out[(hierarchy, t["src"], t["dst"])] = tuple(t["middle"])
    return out


@functools.lru_cache(maxsize=1)
def _observed_sbps() -> dict[tuple[tuple[int, ...], NdSbp, NdSbp], tuple[NdSbp, ...]]:
    """:func:`observed_routes` keyed and valued by parsed N-D SBPs (no string per lookup).

    An entry whose text is not how its SBP prints could never match a lookup by
    ``str`` (an SBP parses back from how it prints), so it is left out here too.
    """
    out: dict[tuple[tuple[int, ...], NdSbp, NdSbp], tuple[NdSbp, ...]] = {}
    for (hierarchy, src, dst), middle in observed_routes().items():
        a, b = parse_nd_sbp(src), parse_nd_sbp(dst)
        if str(a) == src and str(b) == dst:
            out[(hierarchy, a, b)] = tuple(parse_nd_sbp(m) for m in middle)
    return out


def hop_steps(
    shape: Sequence[int],
    itemsize: int,
    src: NdSbp,
    dst: NdSbp,
    mesh: Mesh,
    axes: Sequence[int] | None = None,
) -> list[Step]:
    """One hop as OneFlow 0.9 lowers it: one step per mesh axis that moves bytes (see the module doc).

    Seconds per step: ``steps * alpha + bytes / beta`` on that axis, alpha and
    beta the axis's fit for the collective.  Bytes: per device, averaged over
    devices (:func:`autopar.runtimes.oneflow_09.lowering.lower_hop`).  ``axes``: the mesh
    axes ``src`` and ``dst`` are written on (default all; :func:`oneflow_steps`
    passes the axes of size > 1); steps name the mesh's own axis indices.
    """
    axes = list(range(len(mesh.shape))) if axes is None else list(axes)
    hierarchy = tuple(mesh.shape[a] for a in axes)
    hop = _lower(tuple(int(d) for d in shape), itemsize, src, dst, hierarchy)
    kind = _KIND[hop.kind]
    # a consumer's P is a local zero-fill: what moves produces the source's value there
    moved_to = NdSbp(
        tuple(s if isinstance(d, Partial) and not isinstance(s, Partial) else d for s, d in zip(src, dst))
    )
    steps: list[Step] = []
    for index, nbytes in sorted(hop.bytes_per_axis.items()):
        if nbytes <= 0:
            continue
        axis = axes[index]
        alpha, beta = mesh.axes[axis].alpha_beta(kind)
        seconds = ring_steps(kind, mesh.shape[axis]) * alpha + nbytes / beta
        steps.append((axis, kind, src, moved_to, nbytes, seconds))
    return steps


@functools.lru_cache(maxsize=262144)
def _lower(shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp, hierarchy: tuple[int, ...]) -> Hop:
    return lower_hop(shape, itemsize, src, dst, hierarchy)


@functools.lru_cache(maxsize=4096)
def _costs_from(
    shape: tuple[int, ...], nbytes: float, sbp: NdSbp, hierarchy: tuple[int, ...], outgoing: bool
) -> dict[NdSbp, float]:
    """OneFlow's copy cost from ``sbp`` to every state (``outgoing``), or from every state to it."""
    return {
        m: lazy_copy_cost(nbytes, sbp, m, hierarchy)
        if outgoing
        else lazy_copy_cost(nbytes, m, sbp, hierarchy)
        for m in _states(shape, hierarchy)
    }


@functools.lru_cache(maxsize=1024)
def _states(shape: tuple[int, ...], hierarchy: tuple[int, ...]) -> list[NdSbp]:
    values: list[SbpValue] = [B, P, *(Split(d) for d in range(len(shape)))]
    # middle nodes: layouts whose splits divide (OneFlow's collector also tries uneven ones
    # it accepts; autopar routes through even layouts only, so an even boxing's price does
    # not depend on them -- uneven layouts start or end a route)
    return [
        NdSbp(combo)
        for combo in itertools.product(values, repeat=len(hierarchy))
        if is_even(shape, NdSbp(combo), hierarchy)
    ]


@functools.lru_cache(maxsize=1024)
def _copy_costs(
    shape: tuple[int, ...], nbytes: float, hierarchy: tuple[int, ...]
) -> tuple[list[NdSbp], dict[NdSbp, int], np.ndarray]:
    """The states of a tensor on ``hierarchy``, each one's index, and OneFlow's copy cost
    between every two (:func:`autopar.runtimes.oneflow_09.copy_cost.copy_cost_matrix`)."""
    states = _states(shape, hierarchy)
    return states, {m: i for i, m in enumerate(states)}, copy_cost_matrix(nbytes, states, hierarchy)


@functools.lru_cache(maxsize=65536)
def _emulated_middle(
    shape: tuple[int, ...], nbytes: float, src: NdSbp, dst: NdSbp, hierarchy: tuple[int, ...]
) -> tuple[NdSbp, ...] | None:
    """Middle SBPs of least OneFlow copy cost (None: no route OneFlow supports)."""
    if len(hierarchy) != 2:
        return ()
    states, index, costs = _copy_costs(shape, nbytes, hierarchy)
    i, j = index.get(src), index.get(dst)
    if i is None or j is None:  # an end that is not a state of the tensor: price it pair by pair
        if lazy_copy_cost(nbytes, src, dst, hierarchy) <= VALID_MAX_COPY_COST:
            return ()
        first = _costs_from(shape, nbytes, src, hierarchy, True)
        last = _costs_from(shape, nbytes, dst, hierarchy, False)
        best, route = cheapest_middle_route(nbytes, hierarchy, states, first, last)
        return route if best <= VALID_MAX_COPY_COST else None
    if costs[i, j] <= VALID_MAX_COPY_COST:
        return ()
    best, found = cheapest_middle_route_in(costs, i, j)
    if found is None or best > VALID_MAX_COPY_COST:
        return None
    return tuple(states[m] for m in found)


def oneflow_route(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, hierarchy: Sequence[int]
) -> list[NdSbp] | None:
    """``[src, middle..., dst]`` as OneFlow 0.9 routes the boxing (None: OneFlow has no route)."""
    return oneflow_routes(shape, itemsize, [(src, dst)], hierarchy)[0]


def oneflow_routes(
    shape: Sequence[int], itemsize: int, pairs: Sequence[tuple[NdSbp, NdSbp]], hierarchy: Sequence[int]
) -> list[list[NdSbp] | None]:
    """:func:`oneflow_route` of each ``(src, dst)`` of ``pairs``: the observed route where
    there is one, else the one of least copy cost, the direct and one-middle candidates
    of all pairs priced at once from the copy-cost matrix (the same sums and ties as
    :func:`autopar.runtimes.oneflow_09.copy_cost.cheapest_middle_route`)."""
    shape_t = tuple(int(d) for d in shape)
    hier = tuple(int(h) for h in hierarchy)
    nbytes = float(math.prod(shape_t) * itemsize)
    observed = _observed_sbps()
    out: list[list[NdSbp] | None] = [None] * len(pairs)
    table = _copy_costs(shape_t, nbytes, hier) if len(hier) == 2 else None
    rows: list[int] = []
    cols: list[int] = []
    where: list[int] = []
    for n, (src, dst) in enumerate(pairs):
        middle = observed.get((hier, src, dst))
        if middle is not None and all(is_even(shape_t, m, hier) for m in middle):
            out[n] = [src, *middle, dst]
            continue
        i = j = None
        if table is not None:
            i, j = table[1].get(src), table[1].get(dst)
        if i is None or j is None:
            found = _emulated_middle(shape_t, nbytes, src, dst, hier)
            out[n] = None if found is None else [src, *found, dst]
            continue
        rows.append(i)
        cols.append(j)
        where.append(n)
    if table is None or not rows:
        return out
    states, _, costs = table
    r, c = np.asarray(rows), np.asarray(cols)
    direct = costs[r, c]
    one = costs[r, :] + costs[:, c].T  # [pair, middle]: source -> middle -> destination
    middle_at = np.argmin(one, axis=1)
    best = one[np.arange(len(r)), middle_at]
    for t, n in enumerate(where):
        src, dst = pairs[n]
        if direct[t] <= VALID_MAX_COPY_COST:
            out[n] = [src, dst]
        elif best[t] <= VALID_MAX_COPY_COST:
            out[n] = [src, states[int(middle_at[t])], dst]
        else:
            cost, route = cheapest_middle_route_in(costs, rows[t], cols[t])
            if route is not None and cost <= VALID_MAX_COPY_COST:
                out[n] = [src, *(states[m] for m in route), dst]
    return out


def oneflow_chain(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh
) -> tuple[tuple[int, ...], list[NdSbp]] | None:
    """The mesh axes of size > 1 and the route ``[src, middle..., dst]`` on them
    (:func:`oneflow_route`); an empty route when nothing moves; None when impossible
    (an end that does not divide, or no route OneFlow supports)."""
    live = tuple(a for a, n in enumerate(mesh.shape) if n > 1)
    if src == dst:
        return live, []
    if local_shape(shape, src, mesh.shape) is None or local_shape(shape, dst, mesh.shape) is None:
        return None
    # size-1 axes hold nothing (OneFlow's InOutParallelDimReduce drops them): route and lower
    # on the other axes, so a mesh with size-1 axes prices as its squeezed mesh
    if not live:
        return live, []
    a_src = NdSbp(tuple(src[a] for a in live))
    a_dst = NdSbp(tuple(dst[a] for a in live))
    if a_src == a_dst:
        return live, []
    chain = oneflow_route(shape, itemsize, a_src, a_dst, tuple(mesh.shape[a] for a in live))
    return None if chain is None else (live, chain)


def oneflow_steps(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh
) -> list[Step] | None:
    """The boxing ``src -> dst`` as OneFlow 0.9 runs it: its route, each hop's steps (None:
    impossible -- an end that does not divide, or no route OneFlow supports)."""
    found = oneflow_chain(shape, itemsize, src, dst, mesh)
    return None if found is None else chain_steps(shape, itemsize, *found, mesh)


def chain_steps(
    shape: Sequence[int],
    itemsize: int,
    live: tuple[int, ...],
    chain: Sequence[NdSbp],
    mesh: Mesh,
    hops: dict[tuple[NdSbp, NdSbp], list[Step]] | None = None,
) -> list[Step]:
    """The steps of a route ``chain`` on the mesh axes ``live`` (:func:`oneflow_chain`), on
    the full mesh: each hop's :func:`hop_steps` (from ``hops`` when there), in order."""
    out: list[Step] = []
    for a, b in itertools.pairwise(chain):
        if a == b:
            continue
        steps = None if hops is None else hops.get((a, b))
        if steps is None:
            steps = []
            squeezed = len(live) != len(mesh.shape)
            for axis, kind, _, moved, nbytes, seconds in hop_steps(shape, itemsize, a, b, mesh, live):
                # steps on the full mesh: B on the size-1 axes
                full_src = _expand(a, live, len(mesh.shape)) if squeezed else a
                full_dst = _expand(moved, live, len(mesh.shape)) if squeezed else moved
                steps.append((axis, kind, full_src, full_dst, nbytes, seconds))
            if hops is not None:
                hops[(a, b)] = steps
        out.extend(steps)
    return out


def _expand(sbp: NdSbp, live: Sequence[int], ndim: int) -> NdSbp:
    values: list[SbpValue] = [B] * ndim
    for v, a in zip(sbp, live):
        values[a] = v
    return NdSbp(tuple(values))


def clear_caches() -> None:
    """Forget this module's memos (hops, copy costs, routes), e.g. to time a cold build."""
    for fn in (_lower, _costs_from, _states, _emulated_middle, _copy_costs):
        fn.cache_clear()
