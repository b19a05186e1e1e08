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

import heapq
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
    "all_gather_time",
    "all_reduce_time",
    "all_to_all_time",
    "boxing_matrix",
    "boxing_plan",
    "boxing_search",
    "boxing_time",
    "collective_bytes",
    "reduce_scatter_time",
]

INF = math.inf


class Collective(str, Enum):
    ALL_GATHER = "all-gather"
    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    LOCAL = "local"


# ------------------------------------------------------------- 1-D costs (pure)


def all_gather_time(total_bytes: float, link: AxisLink) -> float:
    """Ring all-gather time, seconds: ``(n-1) * alpha + (n-1)/n * T / beta``.

    ``T`` = bytes of the gathered tensor on the group; alpha = link latency (s),
    beta = link bandwidth (bytes/s).  Source: Thakur, Rabenseifner, Gropp 2005.
    """
    n = link.size
    if n == 1:
        return 0.0
    return (n - 1) * link.latency + (n - 1) / n * total_bytes / link.bandwidth


def reduce_scatter_time(total_bytes: float, link: AxisLink) -> float:
    """Ring reduce-scatter time, seconds: ``(n-1) * alpha + (n-1)/n * T / beta``.

    ``T`` = bytes of the full (unscattered) tensor.  Source: Thakur et al. 2005.
    """
    n = link.size
    if n == 1:
        return 0.0
    return (n - 1) * link.latency + (n - 1) / n * total_bytes / link.bandwidth


def all_reduce_time(total_bytes: float, link: AxisLink) -> float:
    """Ring all-reduce time, seconds: ``2(n-1) * alpha + 2(n-1)/n * T / beta``.

    A reduce-scatter followed by an all-gather.  Source: Thakur et al. 2005;
    NCCL's "bus bandwidth" definition.
    """
    n = link.size
    if n == 1:
        return 0.0
    return 2 * (n - 1) * link.latency + 2 * (n - 1) / n * total_bytes / link.bandwidth


def all_to_all_time(total_bytes: float, link: AxisLink) -> float:
    """Pairwise all-to-all time, seconds: ``(n-1) * alpha + (n-1)/n^2 * T / beta``.

    ``T`` = bytes of the tensor on the group; each device keeps 1/n of its
    ``T/n`` shard and sends the rest.  Source: Thakur et al. 2005.
    """
    n = link.size
    if n == 1:
        return 0.0
    return (n - 1) * link.latency + (n - 1) / (n * n) * total_bytes / link.bandwidth


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
_searches: dict[tuple[Any, ...], BoxingSearch] = {}


def boxing_search(shape: Sequence[int], itemsize: int, mesh: Mesh) -> BoxingSearch:
    """The (cached) :class:`BoxingSearch` of a tensor shape and item size on ``mesh``.

    Cached per (shape, item size, mesh content) in this process, the most recent
    :data:`_SEARCH_CACHE_SIZE` kept, so identical tensors share their searches.
    """
    key = (tuple(shape), itemsize, mesh.shape, mesh.axes)
    search = _searches.get(key)
    if search is None:
        if len(_searches) >= _SEARCH_CACHE_SIZE:
            _searches.pop(next(iter(_searches)))
        search = _searches[key] = BoxingSearch(shape, itemsize, mesh)
    return search


def boxing_matrix(
    shape: Sequence[int], itemsize: int, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp], mesh: Mesh
) -> np.ndarray:
    """Boxing seconds from each of ``srcs`` (rows) to each of ``dsts`` (columns), ``inf`` where
    impossible: the one place every boxing matrix of the cost tables is priced."""
    return boxing_search(shape, itemsize, mesh).matrix(srcs, dsts)


def boxing_plan(shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh) -> BoxingPlan:
    """Cheapest sequence of 1-D collectives turning ``src`` into ``dst`` on ``mesh``."""
    if src == dst:
        return BoxingPlan(src, dst, (), 0.0)
    return boxing_search(shape, itemsize, mesh).plan(src, dst)


def boxing_time(shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh) -> float:
    """Seconds to box ``src`` into ``dst`` (``inf`` when impossible)."""
    return boxing_plan(shape, itemsize, src, dst, mesh).time_s
