"""Boxing: the collectives that turn one N-D SBP into another, and their cost.

Per mesh axis of ``n`` devices, with ``T`` the bytes of the tensor held by the
axis's group (the local tensor after the *other* axes' splits, unsplit on this
axis), ring algorithms send per device (NCCL ring; Thakur et al. 2005):

=============  ==================  ======================  ============
from -> to     collective          bytes sent per device   steps
=============  ==================  ======================  ============
S -> B         all-gather          (n-1)/n * T             n-1
P -> B         all-reduce          2(n-1)/n * T            2(n-1)
P -> S         reduce-scatter      (n-1)/n * T             n-1
S(i) -> S(j)   all-to-all          (n-1)/n^2 * T           n-1
B -> S         local slice         0                       0
B -> P, S -> P local zero-fill     0                       0
=============  ==================  ======================  ============

An N-D change is a sequence of such 1-D steps through intermediate N-D SBPs
(OneFlow's boxing collector); :func:`boxing_plan` finds the cheapest sequence by
Dijkstra over every N-D SBP of the tensor (:class:`BoxingSearch`), and
:func:`boxing_matrix` prices every (source, target) pair of an edge.  A move that
cannot happen (a split that does not divide, a
``B``/``S`` -> ``P`` change that must keep data) costs ``inf``.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from autopar.cluster import AxisLink, Mesh
from autopar.sbp import B, Broadcast, NdSbp, P, Partial, SbpValue, Split, local_shape

__all__ = [
    "INF",
    "BoxingPlan",
    "BoxingSearch",
    "BoxingStep",
    "Collective",
    "OneFlowBoxing",
    "all_gather_time",
    "all_reduce_time",
    "all_to_all_time",
    "boxing_matrix",
    "boxing_plan",
    "boxing_search",
    "boxing_time",
    "collective_bytes",
    "reduce_scatter_time",
    "send_recv_bytes",
    "send_recv_time",
]

INF = math.inf


class Collective(str, Enum):
    ALL_GATHER = "all-gather"
    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    SEND_RECV = "send-recv"
    LOCAL = "local"


# ------------------------------------------------------------- 1-D costs (pure)


def all_gather_time(total_bytes: float, link: AxisLink) -> float:
    """Ring all-gather time, seconds: ``(n-1) * alpha + (n-1)/n * T / beta``.

    ``T`` = bytes of the gathered tensor on the group; alpha (s per step) and
    beta (bus bytes/s) = the link's measured all-gather fit when its profile
    has one (``autopar calibrate``), else the link's latency and bandwidth.
    Source: Thakur, Rabenseifner, Gropp 2005; nccl-tests doc/PERFORMANCE.md
    (all-gather bus bytes = (n-1)/n * T).
    """
    n = link.size
    if n == 1:
        return 0.0
    alpha, beta = link.alpha_beta("all-gather")
    return (n - 1) * alpha + (n - 1) / n * total_bytes / beta


def reduce_scatter_time(total_bytes: float, link: AxisLink) -> float:
    """Ring reduce-scatter time, seconds: ``(n-1) * alpha + (n-1)/n * T / beta``.

    ``T`` = bytes of the full (unscattered) tensor; alpha (s per step) and
    beta (bus bytes/s) = the link's reduce-scatter fit, else its latency and
    bandwidth.  Source: Thakur et al. 2005; nccl-tests doc/PERFORMANCE.md.
    """
    n = link.size
    if n == 1:
        return 0.0
    alpha, beta = link.alpha_beta("reduce-scatter")
    return (n - 1) * alpha + (n - 1) / n * total_bytes / beta


def all_reduce_time(total_bytes: float, link: AxisLink) -> float:
    """Ring all-reduce time, seconds: ``2(n-1) * alpha + 2(n-1)/n * T / beta``.

    A reduce-scatter followed by an all-gather.  alpha (s per step) and beta
    (bus bytes/s) = the link's all-reduce fit, else its latency and
    bandwidth.  Source: Thakur et al. 2005; NCCL's "bus bandwidth" definition
    (nccl-tests doc/PERFORMANCE.md: all-reduce bus bytes = 2(n-1)/n * T).
    """
    n = link.size
    if n == 1:
        return 0.0
    alpha, beta = link.alpha_beta("all-reduce")
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * total_bytes / beta


def all_to_all_time(total_bytes: float, link: AxisLink) -> float:
    """Pairwise all-to-all time, seconds: ``(n-1) * alpha + (n-1)/n^2 * T / beta``.

    ``T`` = bytes of the tensor on the group; each device keeps 1/n of its
    ``T/n`` shard and sends the rest.  alpha (s per step) and beta (bus
    bytes/s) = the link's all-to-all fit, else its latency and bandwidth
    (nccl-tests alltoall_perf: bus bytes = (n-1)/n * the T/n bytes per
    device).  Source: Thakur et al. 2005.
    """
    n = link.size
    if n == 1:
        return 0.0
    alpha, beta = link.alpha_beta("all-to-all")
    return (n - 1) * alpha + (n - 1) / (n * n) * total_bytes / beta


def send_recv_time(total_bytes: float, link: AxisLink) -> float:
    """Point-to-point time, seconds: ``alpha + S / beta``.

    ``S`` = bytes one device sends to one peer of the axis (and receives from
    another, concurrently, as nccl-tests sendrecv_perf measures); alpha (s)
    and beta (bytes/s) = the link's send/recv fit, else its latency and
    bandwidth.  0 on a one-device axis (no peer).  Source: the alpha-beta
    (Hockney) model; nccl-tests doc/PERFORMANCE.md (send/recv bus bandwidth =
    algorithm bandwidth = S / t).
    """
    if link.size == 1:
        return 0.0
    alpha, beta = link.alpha_beta("send-recv")
    return alpha + total_bytes / beta


def collective_bytes(kind: Collective, total_bytes: float, n: int) -> float:
    """Bytes each device sends for ``kind`` on a group of ``n`` (ring algorithms)."""
    if n == 1 or kind is Collective.LOCAL:
        return 0.0
    if kind is Collective.ALL_REDUCE:
        return 2 * (n - 1) / n * total_bytes
    if kind is Collective.ALL_TO_ALL:
        return (n - 1) / (n * n) * total_bytes
    return (n - 1) / n * total_bytes


_TIME = {
    Collective.ALL_GATHER: all_gather_time,
    Collective.ALL_REDUCE: all_reduce_time,
    Collective.REDUCE_SCATTER: reduce_scatter_time,
    Collective.ALL_TO_ALL: all_to_all_time,
}


def one_axis_collective(src: SbpValue, dst: SbpValue) -> Collective | None:
    """The collective that turns ``src`` into ``dst`` on one axis; None if impossible."""
    if src == dst:
        return Collective.LOCAL
    if isinstance(src, Split):
        if isinstance(dst, Broadcast):
            return Collective.ALL_GATHER
        if isinstance(dst, Split):
            return Collective.ALL_TO_ALL
        return Collective.LOCAL  # S -> P: keep own shard, zero-fill the rest
    if isinstance(src, Partial):
        if isinstance(dst, Broadcast):
            return Collective.ALL_REDUCE
        return Collective.REDUCE_SCATTER  # P -> S
    # src is B
    return Collective.LOCAL  # B -> S slice, B -> P zero-fill on all but one device


# ------------------------------------------------------------- N-D plans


@dataclass(frozen=True, slots=True)
class BoxingStep:
    """One 1-D collective on ``axis`` moving ``bytes_per_device`` bytes."""

    axis: int
    collective: Collective
    src: NdSbp
    dst: NdSbp
    bytes_per_device: float
    time_s: float

    def __str__(self) -> str:
        return f"{self.collective.value} on axis {self.axis}: {self.src} -> {self.dst}"


@dataclass(frozen=True, slots=True)
class BoxingPlan:
    """The cheapest sequence of steps from ``src`` to ``dst`` (empty when equal)."""

    src: NdSbp
    dst: NdSbp
    steps: tuple[BoxingStep, ...]
    time_s: float

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.time_s)


FULL_SEARCH_STATES = 4096
"""Largest state space (values per axis ** mesh axes of size > 1) searched whole, once per
source; above it each (source, target) pair is searched over the axis values of the pair
plus ``B``, at most :data:`PAIR_SEARCH_POPS` states, so the cost stays
polynomial in the mesh rank."""
PAIR_SEARCH_POPS = 500
"""States a pair search settles before it settles for the all-``B`` route (gather or
reduce every axis, then slice): a valid sequence, so the price is an honest upper bound."""


class BoxingSearch:
    """Cheapest boxing sequences for one tensor (shape, item size) on one mesh.

    States are the N-D SBPs whose axis values are ``S(d)`` for a dim of the
    tensor, ``B`` or ``P`` and that divide evenly; moves change one axis (one
    1-D collective).  Dijkstra from a source reaches every target at once, so
    a whole boxing matrix costs one search per distinct source.

    Mesh axes of size 1 are dropped first: a change on such an axis is local and
    free and changes no other axis's group bytes, so it never alters a price.
    Large state spaces (see :data:`FULL_SEARCH_STATES`) are searched per pair.
    States are tuples of value indices (``B`` = 0, ``P`` = 1, ``S(d)`` = 2 + d).
    """

    def __init__(self, shape: Sequence[int], itemsize: int, mesh: Mesh) -> None:
        self.shape = tuple(shape)
        self.itemsize = itemsize
        self.mesh = mesh
        self.values: tuple[SbpValue, ...] = (B, P, *(Split(d) for d in range(len(self.shape))))
        self._index = {v: i for i, v in enumerate(self.values)}
        self.kept = tuple(a for a, n in enumerate(mesh.shape) if n > 1)
        self._sizes = tuple(mesh.shape[a] for a in self.kept)
        self._links = tuple(mesh.axes[a] for a in self.kept)
        self._numel = math.prod(self.shape)
        self.whole = len(self.values) ** len(self.kept) <= FULL_SEARCH_STATES
        self._valid: dict[tuple[int, ...], bool] = {}
        self._moves: dict[tuple[int, ...], list[tuple[tuple[int, ...], int, float]]] = {}
        self._trees: dict[
            tuple[int, ...],
            tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], tuple[tuple[int, ...], int]]],
        ] = {}
        self._pairs: dict[
            tuple[tuple[int, ...], tuple[int, ...]], tuple[float, list[tuple[tuple[int, ...], int, int]]]
        ] = {}

    # ---- states

    def _state(self, sbp: NdSbp) -> tuple[int, ...] | None:
        """The reduced state of ``sbp``, or None if it is not a valid layout of the tensor."""
        if local_shape(self.shape, sbp, self.mesh.shape) is None:
            return None
        return tuple(self._index[sbp[a]] for a in self.kept)

    def _sbp(self, state: tuple[int, ...], like: NdSbp) -> NdSbp:
        vals = list(like.values)
        for a, v in zip(self.kept, state):
            vals[a] = self.values[v]
        return NdSbp(tuple(vals))

    def _factors(self, state: tuple[int, ...]) -> list[int]:
        factors = [1] * len(self.shape)
        for v, n in zip(state, self._sizes):
            if v >= 2:
                factors[v - 2] *= n
        return factors

    def _is_valid(self, state: tuple[int, ...]) -> bool:
        ok = self._valid.get(state)
        if ok is None:
            ok = all(dim % f == 0 for dim, f in zip(self.shape, self._factors(state)))
            self._valid[state] = ok
        return ok

    def _move_time(self, cur: tuple[int, ...], axis: int, value: int) -> tuple[Collective, float, float]:
        """Collective, bytes per device and seconds of changing ``axis`` of ``cur`` to ``value``."""
        kind = one_axis_collective(self.values[cur[axis]], self.values[value])
        assert kind is not None
        if kind is Collective.LOCAL:
            return kind, 0.0, 0.0
        # bytes held by the axis's group: the local tensor with this axis unsplit
        factor = 1
        for a, (v, n) in enumerate(zip(cur, self._sizes)):
            if v >= 2 and a != axis:
                factor *= n
        group = float(self._numel // factor * self.itemsize)
        link = self._links[axis]
        return kind, collective_bytes(kind, group, link.size), _TIME[kind](group, link)

    # ---- searches

    def _dijkstra(
        self,
        src: tuple[int, ...],
        allowed: Sequence[Sequence[int]],
        target: tuple[int, ...] | None,
        max_pops: int | None,
    ) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], tuple[tuple[int, ...], int]], bool]:
        best: dict[tuple[int, ...], float] = {src: 0.0}
        back: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}
        hops: dict[tuple[int, ...], int] = {src: 0}
        heap: list[tuple[float, int, int, tuple[int, ...]]] = [(0.0, 0, 0, src)]
        counter = 1
        done: set[tuple[int, ...]] = set()
        pops = 0
        # the whole state space: each state's moves (and their prices) are listed once
        # and shared by the searches from every source
        whole = len(allowed) == len(self.kept) and all(len(v) == len(self.values) for v in allowed)
        while heap:
            cost, nhops, _, cur = heapq.heappop(heap)
            if cur in done:
                continue
            done.add(cur)
            if cur == target:
                return best, back, True
            pops += 1
            if max_pops is not None and pops > max_pops:
                return best, back, False
            moves = self._moves.get(cur) if whole else None
            if moves is None:
                moves = []
                for axis, values in enumerate(allowed):
                    here = cur[axis]
                    for value in values:
                        if value == here:
                            continue
                        nxt = (*cur[:axis], value, *cur[axis + 1 :])
                        if self._is_valid(nxt):
                            moves.append((nxt, axis, self._move_time(cur, axis, value)[2]))
                if whole:
                    self._moves[cur] = moves
            for nxt, axis, seconds in moves:
                new_cost = cost + seconds
                old = best.get(nxt, INF)
                # ties: fewer steps
                if new_cost < old or (new_cost == old and nhops + 1 < hops[nxt]):
                    best[nxt] = new_cost
                    hops[nxt] = nhops + 1
                    back[nxt] = (cur, axis)
                    heapq.heappush(heap, (new_cost, nhops + 1, counter, nxt))
                    counter += 1
        return best, back, target is None

    def _tree(
        self, src: tuple[int, ...]
    ) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], tuple[tuple[int, ...], int]]]:
        tree = self._trees.get(src)
        if tree is None:
            allowed = [range(len(self.values))] * len(self.kept)
            best, back, _ = self._dijkstra(src, allowed, None, None)
            tree = self._trees[src] = (best, back)
        return tree

    def _pair(
        self, src: tuple[int, ...], dst: tuple[int, ...]
    ) -> tuple[float, list[tuple[tuple[int, ...], int, int]]]:
        """Cheapest route and its moves ``(state, axis, value)`` for one pair (large state spaces)."""
        key = (src, dst)
        hit = self._pairs.get(key)
        if hit is not None:
            return hit
        allowed = [sorted({s, d, 0}) for s, d in zip(src, dst)]
        best, back, found = self._dijkstra(src, allowed, dst, PAIR_SEARCH_POPS)
        result = (best[dst], self._route(back, src, dst)) if found else self._all_b_route(src, dst)
        self._pairs[key] = result
        return result

    def _route(
        self,
        back: dict[tuple[int, ...], tuple[tuple[int, ...], int]],
        src: tuple[int, ...],
        dst: tuple[int, ...],
    ) -> list[tuple[tuple[int, ...], int, int]]:
        moves: list[tuple[tuple[int, ...], int, int]] = []
        node = dst
        while node != src:
            prev, axis = back[node]
            moves.append((prev, axis, node[axis]))
            node = prev
        moves.reverse()
        return moves

    def _all_b_route(
        self, src: tuple[int, ...], dst: tuple[int, ...]
    ) -> tuple[float, list[tuple[tuple[int, ...], int, int]]]:
        moves: list[tuple[tuple[int, ...], int, int]] = []
        cur = src
        total = 0.0
        for axis in range(len(cur)):  # gather / all-reduce every axis to B: always valid
            if cur[axis] != 0:
                moves.append((cur, axis, 0))
                total += self._move_time(cur, axis, 0)[2]
                cur = (*cur[:axis], 0, *cur[axis + 1 :])
        for axis in range(len(cur)):  # then slice / zero-fill locally: free
            if dst[axis] != 0:
                moves.append((cur, axis, dst[axis]))
                cur = (*cur[:axis], dst[axis], *cur[axis + 1 :])
        return total, moves

    # ---- queries

    def time(self, src: NdSbp, dst: NdSbp) -> float:
        if src == dst:
            return 0.0
        s, d = self._state(src), self._state(dst)
        if s is None or d is None:
            return INF
        if s == d:
            return 0.0
        if self.whole:
            return self._tree(s)[0].get(d, INF)
        return self._pair(s, d)[0]

    def matrix(self, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp]) -> np.ndarray:
        """Seconds from each of ``srcs`` (rows) to each of ``dsts`` (columns); equal to
        :meth:`time` entry by entry, with each layout's state worked out once."""
        d_states = [self._state(d) for d in dsts]
        m = np.empty((len(srcs), len(dsts)), dtype=np.float64)
        for i, src in enumerate(srcs):
            s = self._state(src)
            if s is None:  # not a layout of the tensor: only "no change" is free
                m[i] = [0.0 if src == d else INF for d in dsts]
                continue
            best = self._tree(s)[0] if self.whole else None
            row = m[i]
            for j, d in enumerate(d_states):
                if d is None:
                    row[j] = INF
                elif d == s:
                    row[j] = 0.0
                elif best is not None:
                    row[j] = best.get(d, INF)
                else:
                    row[j] = self._pair(s, d)[0]
        return m

    def plan(self, src: NdSbp, dst: NdSbp) -> BoxingPlan:
        t = self.time(src, dst)
        if src == dst or not math.isfinite(t):
            return BoxingPlan(src, dst, (), t)
        s, d = self._state(src), self._state(dst)
        assert s is not None and d is not None
        if s == d:
            return BoxingPlan(src, dst, (), t)
        moves = self._route(self._tree(s)[1], s, d) if self.whole else self._pair(s, d)[1]
        steps: list[BoxingStep] = []
        for cur, axis, value in moves:
            kind, nbytes, seconds = self._move_time(cur, axis, value)
            if kind is Collective.LOCAL:
                continue
            nxt = (*cur[:axis], value, *cur[axis + 1 :])
            steps.append(
                BoxingStep(self.kept[axis], kind, self._sbp(cur, src), self._sbp(nxt, src), nbytes, seconds)
            )
        return BoxingPlan(src, dst, tuple(steps), t)


_SEARCH_CACHE_SIZE = 4096
_searches: dict[tuple[Any, ...], BoxingSearch | OneFlowBoxing] = {}


def boxing_search(
    shape: Sequence[int], itemsize: int, mesh: Mesh, lowering: str = "ideal"
) -> BoxingSearch | OneFlowBoxing:
    """The (cached) boxing finder of a tensor shape and item size on ``mesh`` for ``lowering``
    (``"ideal"``: :class:`BoxingSearch`; ``"oneflow-0.9"``: :class:`OneFlowBoxing`).

    Cached per (shape, item size, mesh content, lowering) in this process, the most
    recent :data:`_SEARCH_CACHE_SIZE` kept, so identical tensors share their searches.
    """
    if lowering not in ("ideal", "oneflow-0.9"):
        raise ValueError(f"unknown lowering {lowering!r}")
    key = (tuple(shape), itemsize, mesh.shape, mesh.axes, lowering)
    search = _searches.get(key)
    if search is None:
        if len(_searches) >= _SEARCH_CACHE_SIZE:
            _searches.pop(next(iter(_searches)))
        finder = OneFlowBoxing if lowering == "oneflow-0.9" else BoxingSearch
        search = _searches[key] = finder(shape, itemsize, mesh)
    return search


def boxing_matrix(
    shape: Sequence[int],
    itemsize: int,
    srcs: Sequence[NdSbp],
    dsts: Sequence[NdSbp],
    mesh: Mesh,
    lowering: str = "ideal",
) -> np.ndarray:
    """Boxing seconds from each of ``srcs`` (rows) to each of ``dsts`` (columns), ``inf`` where
    impossible: the one place every boxing matrix of the cost tables is priced."""
    return boxing_search(shape, itemsize, mesh, lowering).matrix(srcs, dsts)


def boxing_plan(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh, lowering: str = "ideal"
) -> BoxingPlan:
    """The steps turning ``src`` into ``dst`` on ``mesh`` as ``lowering`` runs them."""
    if src == dst:
        return BoxingPlan(src, dst, (), 0.0)
    return boxing_search(shape, itemsize, mesh, lowering).plan(src, dst)


def boxing_time(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh, lowering: str = "ideal"
) -> float:
    """Seconds to box ``src`` into ``dst`` (``inf`` when impossible)."""
    return boxing_plan(shape, itemsize, src, dst, mesh, lowering).time_s


# ------------------------------------------------------------- OneFlow 0.9 lowering


def _group_bytes(
    shape: Sequence[int], itemsize: int, sbp: NdSbp, axis: int, mesh_shape: Sequence[int]
) -> float | None:
    """Bytes of the tensor held by the group of ``axis``: local size ignoring ``axis``'s split."""
    unsplit = sbp.replace(axis, B)
    local = local_shape(shape, unsplit, mesh_shape)
    if local is None:
        return None
    return float(math.prod(local) * itemsize)


def _step(
    shape: Sequence[int], itemsize: int, mesh: Mesh, cur: NdSbp, axis: int, value: SbpValue
) -> BoxingStep | None:
    nxt = cur.replace(axis, value)
    if local_shape(shape, nxt, mesh.shape) is None:
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


def _intervals(
    shape: tuple[int, ...], sbp: NdSbp, mesh_shape: tuple[int, ...], coord: tuple[int, ...]
) -> list[tuple[int, int]]:
    """Per tensor dim, the [start, stop) the device at ``coord`` holds under ``sbp``.

    Nested splits as OneFlow lays them out: axis 0 splits a dim first, a later
    axis splits the block the earlier one left (``local_shape``'s order).
    """
    bounds = [(0, n) for n in shape]
    for axis, value in enumerate(sbp.values):
        if isinstance(value, Split):
            start, stop = bounds[value.dim]
            size = (stop - start) // mesh_shape[axis]
            start += coord[axis] * size
            bounds[value.dim] = (start, start + size)
    return bounds


@functools.lru_cache(maxsize=65536)
def send_recv_bytes(
    shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp, mesh_shape: tuple[int, ...]
) -> float:
    """Largest bytes any device receives when ``src`` is boxed into ``dst`` point to point.

    Formula, per device ``d`` with destination region ``R_d`` and source region
    ``R'_d``: ``received = p * |R_d| - |R_d & R'_d|`` elements, where ``p`` is the
    product of the sizes of the axes on which ``src`` is ``P`` (``d`` needs every
    addend of its region; it holds one of them, for the part of ``R_d`` it
    already has).  Bytes = elements * ``itemsize``; the maximum over devices is
    returned (the slowest device finishes the step).  Units: bytes.
    Source: OneFlow 0.9 ``NcclSendRecvBoxingKernel`` (each rank receives the
    intersections of its output slice with every other rank's input slice).
    """
    shape, mesh_shape = tuple(shape), tuple(mesh_shape)
    if local_shape(shape, src, mesh_shape) is None or local_shape(shape, dst, mesh_shape) is None:
        return INF
    partial = math.prod(n for v, n in zip(src.values, mesh_shape) if isinstance(v, Partial))
    region = math.prod(local_shape(shape, dst, mesh_shape) or ())
    # only the axes where a device's position matters for either layout
    relevant = [
        a
        for a, (s, d) in enumerate(zip(src.values, dst.values))
        if isinstance(s, Split) or isinstance(d, Split)
    ]
    worst = 0
    for sub in itertools.product(*(range(mesh_shape[a]) for a in relevant)):
        coord = [0] * len(mesh_shape)
        for a, c in zip(relevant, sub):
            coord[a] = c
        mine = _intervals(shape, src, mesh_shape, tuple(coord))
        want = _intervals(shape, dst, mesh_shape, tuple(coord))
        overlap = math.prod(max(0, min(a1, b1) - max(a0, b0)) for (a0, a1), (b0, b1) in zip(mine, want))
        worst = max(worst, partial * region - overlap)
    return float(worst * itemsize)


def _send_recv_step(shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh) -> BoxingStep:
    """One NCCL send/recv boxing, charged to the slowest mesh axis the data crosses."""
    if any(isinstance(v, Partial) for v in dst.values):
        # OneFlow 0.9: "Partial SBP in the consumer" is not supported by send/recv boxing
        return BoxingStep(0, Collective.SEND_RECV, src, dst, INF, INF)
    nbytes = send_recv_bytes(tuple(shape), itemsize, src, dst, mesh.shape)
    involved = [
        a for a, (s, d) in enumerate(zip(src.values, dst.values)) if (s != d or isinstance(s, Partial))
    ] or [0]
    axis = min(involved, key=lambda a: (mesh.axes[a].bandwidth, a))
    seconds = send_recv_time(nbytes, mesh.axes[axis]) if nbytes > 0 else 0.0
    return BoxingStep(axis, Collective.SEND_RECV, src, dst, nbytes, seconds)


def _all_same(sbp: NdSbp, axes: Sequence[int]) -> bool:
    return len({sbp[a] for a in axes}) == 1


def _oneflow_hop(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh
) -> BoxingStep | None:
    """One boxing as OneFlow 0.9 builds it without middle nodes (None: same SBP)."""
    if src == dst:
        return None
    live = [a for a, n in enumerate(mesh.shape) if n > 1]
    changed = [a for a in live if src[a] != dst[a]]
    if not changed:
        return None  # differ only on size-1 axes: dropped by InOutParallelDimReduce
    if len(live) > 1 and _all_same(src, live) and _all_same(dst, live):
        # both reduce to 1-D over the flattened mesh: one collective over every device,
        # as slow as the slowest axis it spans
        axis = min(live, key=lambda a: (mesh.axes[a].bandwidth, a))
        flat = dataclasses.replace(mesh.axes[axis], size=math.prod(mesh.shape[a] for a in live))
        kind = one_axis_collective(src[live[0]], dst[live[0]])
        if kind is None:
            return BoxingStep(axis, Collective.SEND_RECV, src, dst, INF, INF)
        if kind is Collective.LOCAL:
            return BoxingStep(axis, kind, src, dst, 0.0, 0.0)
        total = float(math.prod(shape) * itemsize)
        return BoxingStep(
            axis, kind, src, dst, collective_bytes(kind, total, flat.size), _TIME[kind](total, flat)
        )
    if len(changed) == 1 and len(live) <= 2:
        (axis,) = changed
        outer = live.index(axis) == 0 and len(live) == 2
        if outer and (_all_same(src, live) or _all_same(dst, live)):
            # Dim0NdSbpMismatchedSubTskGphBuilder: an all-same-split end goes to send/recv
            return _send_recv_step(shape, itemsize, src, dst, mesh)
        step = _step(shape, itemsize, mesh, src, axis, dst[axis])
        return step if step is not None else BoxingStep(axis, Collective.SEND_RECV, src, dst, INF, INF)
    # both axes change (or more than two axes): NDNcclSendRecvBoxingSubTskGphBuilder
    return _send_recv_step(shape, itemsize, src, dst, mesh)


class OneFlowBoxing:
    """What OneFlow 0.9 runs for every boxing of one tensor (shape, item size) on one mesh.

    Source: OneFlow v0.9.0 ``oneflow/core/graph/boxing/hierarchical_sub_task_graph_builder_impl.cpp``
    and ``oneflow/core/job_rewriter/boxing_with_middle_nodes.cpp`` (table in
    docs/runtime-profiles.md):

    * size-1 axes are dropped; when both ends are the same value on every
      remaining axis (``(S(0), S(0))``, ``(B, B)``, ``(P, P)``) the change is one
      1-D collective over all devices (``FlatSubTskGphBuilder``);
    * only the inner axis changes: a 1-D collective inside each group
      (``IntraGroupSubTskGphBuilder``);
    * only the outer axis changes: a 1-D collective across groups
      (``InterGroupSubTskGphBuilder``), except when an end is split the same
      way on every axis, which goes to send/recv;
    * anything else, and every change on more than two axes: point-to-point
      NCCL send/recv of the needed slices (``NDNcclSendRecvBoxingSubTskGphBuilder``;
      it cannot produce ``P``).

    On two axes the middle-node pass (``BoxingWithMiddleNodes``, on unless
    ``ONEFLOW_BOXING_DISABLE_MIDDLE_NODE_AND_CHECK``) may route a change through
    up to two intermediate N-D SBPs when that is cheaper; each hop is lowered
    as above.  Routes considered: up to three single-axis collectives (min-plus
    products of the collective hop matrix, once per tensor), or one send/recv
    leaving the source or entering the destination plus up to two collectives;
    the work per tensor is polynomial in the number of N-D SBPs.
    """

    def __init__(self, shape: Sequence[int], itemsize: int, mesh: Mesh) -> None:
        self.shape = tuple(shape)
        self.itemsize = itemsize
        self.mesh = mesh
        self.live = [a for a, n in enumerate(mesh.shape) if n > 1]
        self._routes: tuple[list[NdSbp], dict[NdSbp, int], np.ndarray, np.ndarray, np.ndarray] | None = None
        self._hops: dict[tuple[NdSbp, NdSbp], BoxingStep | None] = {}
        self._memo: dict[tuple[NdSbp, NdSbp], tuple[float, list[tuple[NdSbp, NdSbp]]]] = {}

    def _canon(self, sbp: NdSbp) -> NdSbp:
        """``sbp`` with size-1 axes set to ``B`` (their value changes nothing)."""
        return NdSbp(tuple(v if n > 1 else B for v, n in zip(sbp.values, self.mesh.shape)))

    def hop(self, src: NdSbp, dst: NdSbp) -> BoxingStep | None:
        key = (src, dst)
        if key not in self._hops:
            self._hops[key] = _oneflow_hop(self.shape, self.itemsize, src, dst, self.mesh)
        return self._hops[key]

    def _route_tables(self) -> tuple[list[NdSbp], dict[NdSbp, int], np.ndarray, np.ndarray, np.ndarray]:
        """States, and the cheapest routes of at most 2 and 3 single-axis collective hops."""
        if self._routes is None:
            values: tuple[SbpValue, ...] = (B, P, *(Split(d) for d in range(len(self.shape))))
            states = []
            for combo in itertools.product(values, repeat=len(self.live)):
                vals: list[SbpValue] = [B] * self.mesh.ndim
                for a, v in zip(self.live, combo):
                    vals[a] = v
                state = NdSbp(tuple(vals))
                if local_shape(self.shape, state, self.mesh.shape) is not None:
                    states.append(state)
            index = {s: i for i, s in enumerate(states)}
            n = len(states)
            hop = np.full((n, n), INF, dtype=np.float64)
            np.fill_diagonal(hop, 0.0)
            for i, first in enumerate(states):
                for j, second in enumerate(states):
                    if i != j and sum(first[a] != second[a] for a in self.live) == 1:
                        step = self.hop(first, second)
                        if step is not None and step.collective is not Collective.SEND_RECV:
                            hop[i, j] = step.time_s
            two = hop[:, :, None] + hop[None, :, :]  # i -> k -> j
            via2 = two.argmin(axis=1)
            best2 = two.min(axis=1)
            three = best2[:, :, None] + hop[None, :, :]  # (i ->> k) -> j
            via3 = three.argmin(axis=1)
            self._routes = (states, index, best2, via2, via3)
        return self._routes

    def _collective_route(self, i: int, j: int) -> tuple[float, list[tuple[int, int]]]:
        """Cheapest route of at most three single-axis collective hops between states."""
        _, _, best2, via2, via3 = self._route_tables()

        def hops2(a: int, b: int) -> list[tuple[int, int]]:
            k = int(via2[a, b])
            return [(x, y) for x, y in ((a, k), (k, b)) if x != y]

        k = int(via3[i, j])
        cost3 = float(best2[i, k]) + self._hop_cost(k, j)
        if cost3 < best2[i, j]:
            return cost3, [*hops2(i, k), *([(k, j)] if k != j else [])]
        return float(best2[i, j]), hops2(i, j)

    def _hop_cost(self, a: int, b: int) -> float:
        states = self._route_tables()[0]
        if a == b:
            return 0.0
        step = self.hop(states[a], states[b])
        if step is None:
            return 0.0
        if (
            step.collective is Collective.SEND_RECV
            or sum(states[a][x] != states[b][x] for x in self.live) != 1
        ):
            return INF
        return step.time_s

    def _route(self, src: NdSbp, dst: NdSbp) -> tuple[float, list[tuple[NdSbp, NdSbp]]]:
        key = (src, dst)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._find_route(src, dst)
        return found

    def _find_route(self, src: NdSbp, dst: NdSbp) -> tuple[float, list[tuple[NdSbp, NdSbp]]]:
        """Cheapest of: the direct boxing; up to three single-axis collectives; one send/recv
        from ``src`` (or into ``dst``) plus up to two collectives (``BoxingWithMiddleNodes``)."""
        direct = self.hop(src, dst)
        best: tuple[float, list[tuple[NdSbp, NdSbp]]] = (
            0.0 if direct is None else direct.time_s,
            [] if direct is None else [(src, dst)],
        )
        if len(self.live) != 2 or best[0] == 0.0:
            return best
        if (
            direct is not None
            and direct.collective is not Collective.SEND_RECV
            and math.isfinite(direct.time_s)
        ):
            # one hierarchical collective: a middle node cannot beat it
            return best
        states, index, best2, _, _ = self._route_tables()
        i, j = index.get(self._canon(src)), index.get(self._canon(dst))
        if i is None or j is None:
            return best
        cost, hops = self._collective_route(i, j)
        if cost < best[0]:
            best = (cost, [(states[a], states[b]) for a, b in hops])
        for m, mid in enumerate(states):
            if m in (i, j):
                continue
            out = self.hop(src, mid)  # send/recv first, then collectives
            if out is not None and math.isfinite(out.time_s) and out.time_s + best2[m, j] < best[0]:
                _, tail = self._collective_route(m, j)
                c = out.time_s + self._path_cost(tail)
                if c < best[0]:
                    best = (c, [(src, mid), *((states[a], states[b]) for a, b in tail)])
            into = self.hop(mid, dst)  # collectives first, then send/recv
            if into is not None and math.isfinite(into.time_s) and best2[i, m] + into.time_s < best[0]:
                _, head = self._collective_route(i, m)
                c = self._path_cost(head) + into.time_s
                if c < best[0]:
                    best = (c, [*((states[a], states[b]) for a, b in head), (mid, dst)])
        return best

    def _path_cost(self, hops: list[tuple[int, int]]) -> float:
        return sum(self._hop_cost(a, b) for a, b in hops)

    def time(self, src: NdSbp, dst: NdSbp) -> float:
        if src == dst:
            return 0.0
        if local_shape(self.shape, src, self.mesh.shape) is None:
            return INF
        if local_shape(self.shape, dst, self.mesh.shape) is None:
            return INF
        return self._route(src, dst)[0]

    def matrix(self, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp]) -> np.ndarray:
        """Seconds from each of ``srcs`` (rows) to each of ``dsts`` (columns)."""
        return np.array([[self.time(s, d) for d in dsts] for s in srcs], dtype=np.float64).reshape(
            len(srcs), len(dsts)
        )

    def plan(self, src: NdSbp, dst: NdSbp) -> BoxingPlan:
        t = self.time(src, dst)
        if src == dst or not math.isfinite(t):
            return BoxingPlan(src, dst, (), t)
        _, hops = self._route(src, dst)
        steps = []
        for a, b in hops:
            # hops between canonical states: show them on the real ends
            step = self.hop(src if a == self._canon(src) else a, dst if b == self._canon(dst) else b)
            if step is not None and step.collective is not Collective.LOCAL:
                steps.append(step)
        return BoxingPlan(src, dst, tuple(steps), t)
