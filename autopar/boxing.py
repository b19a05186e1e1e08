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
cannot happen (a split OneFlow refuses: a dim shorter than the axes cutting it,
:func:`autopar.sbp.local_shape`) costs ``inf``.  A split that does not divide is
cut by OneFlow's ``BalancedSplitter``: the bytes are the exact sums over devices,
the time that of the largest shard.
"""

from __future__ import annotations

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
from autopar.oneflow.hop_table import HopTable, hop_table
from autopar.oneflow.lowering import device_slices
from autopar.oneflow.pricing import Step, chain_steps, observed_routes, oneflow_routes
from autopar.sbp import B, Broadcast, NdSbp, P, Partial, SbpValue, Split, is_even, local_shape, shard_numel

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
    "step_latency",
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
    tensor, ``B`` or ``P`` and whose splits divide evenly; moves change one axis
    (one 1-D collective).  A layout whose split does not divide (OneFlow accepts
    it: :func:`autopar.sbp.local_shape`) may start or end a route, not lie on one;
    a search toward such a target is a pair search.
    Dijkstra from a source reaches every target at once, so a whole boxing
    matrix costs one search per distinct source.

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
        """Whether a route may pass through ``state``: a layout whose splits all divide.

        An uneven layout OneFlow accepts (:func:`autopar.sbp.local_shape`) may only
        start or end a route (:meth:`_state`), so the price of a boxing between even
        layouts does not depend on whether uneven splits exist.
        """
        ok = self._valid.get(state)
        if ok is None:
            ok = self._is_even(state)
            self._valid[state] = ok
        return ok

    def _reduced(self, state: tuple[int, ...]) -> NdSbp:
        """``state`` as an N-D SBP on the mesh axes of size > 1."""
        return NdSbp(tuple(self.values[v] for v in state))

    def _is_even(self, state: tuple[int, ...]) -> bool:
        return all(dim % f == 0 for dim, f in zip(self.shape, self._factors(state)))

    def _move_time(self, cur: tuple[int, ...], axis: int, value: int) -> tuple[Collective, float, float]:
        """Collective, bytes per device and seconds of changing ``axis`` of ``cur`` to ``value``.

        Bytes: the ring formula on ``T``, the bytes the axis's group holds (the local
        tensor with this axis unsplit), averaged over the groups -- exact sums, uneven
        splits included.  Seconds: the same formula on ``T`` padded to the largest
        shard (:func:`_padded_group_bytes`) when a split does not divide.
        """
        kind = one_axis_collective(self.values[cur[axis]], self.values[value])
        assert kind is not None
        if kind is Collective.LOCAL:
            return kind, 0.0, 0.0
        factor = 1
        for a, (v, n) in enumerate(zip(cur, self._sizes)):
            if v >= 2 and a != axis:
                factor *= n
        link = self._links[axis]
        nxt = (*cur[:axis], value, *cur[axis + 1 :])
        if self._is_even(cur) and self._is_even(nxt):
            group = float(self._numel // factor * self.itemsize)
            return kind, collective_bytes(kind, group, link.size), _TIME[kind](group, link)
        group = self._numel / factor * self.itemsize
        padded = self._padded_group_bytes(kind, cur, nxt, link.size)
        return kind, collective_bytes(kind, group, link.size), _TIME[kind](padded, link)

    def _padded_group_bytes(
        self, kind: Collective, cur: tuple[int, ...], nxt: tuple[int, ...], n: int
    ) -> float:
        """``T`` of a step whose shards differ: what a ring on equal chunks of the largest
        shard moves (``n`` such chunks; an all-reduce, the group's largest piece).  The
        device with the largest shard sets the step's time.  Units: bytes."""
        sizes = self._sizes
        largest_cur = shard_numel(self.shape, self._reduced(cur), sizes) * self.itemsize
        largest_nxt = shard_numel(self.shape, self._reduced(nxt), sizes) * self.itemsize
        if kind is Collective.ALL_REDUCE:
            return largest_cur
        if kind is Collective.ALL_GATHER:
            return n * largest_cur
        if kind is Collective.REDUCE_SCATTER:
            return n * largest_nxt
        return n * max(largest_cur, largest_nxt)

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
        # and shared by the searches from every source (not toward an uneven target,
        # which no listed move reaches)
        whole = len(allowed) == len(self.kept) and all(len(v) == len(self.values) for v in allowed)
        whole = whole and (target is None or self._is_valid(target))
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
                        if self._is_valid(nxt) or nxt == target:
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
        """Cheapest route and its moves ``(state, axis, value)`` for one pair (large state
        spaces, and any search toward an uneven layout: over every state when the space is small)."""
        key = (src, dst)
        hit = self._pairs.get(key)
        if hit is not None:
            return hit
        if self.whole:
            allowed: list[Sequence[int]] = [range(len(self.values))] * len(self.kept)
            best, back, found = self._dijkstra(src, allowed, dst, None)
        else:
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
        if self.whole and self._is_valid(d):
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
                elif best is not None and self._is_valid(d):
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
        if self.whole and self._is_valid(d):
            moves = self._route(self._tree(s)[1], s, d)
        else:
            moves = self._pair(s, d)[1]
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


class DirectBoxing(BoxingSearch):
    """Boxing within fixed process groups: each mesh axis whose value differs changes by its
    own 1-D collectives (through ``B`` at most), and an axis whose value stays is never
    touched.  How a framework that reduces within fixed groups runs it: Megatron-LM's DDP
    all-reduces a gradient within the data-parallel group, its tensor-parallel all-reduces
    run within the tensor-parallel group -- never :class:`BoxingSearch`'s cheaper detour of
    a tp-replicated gradient (``(P, B) -> (P, S) -> (B, S) -> (B, B)``: half the bytes over
    dp, an all-gather over tp).  A route's values on each axis: the source's, the
    destination's and ``B``; the cheapest such route (Dijkstra over at most ``3^axes``
    states), else every axis gathered to ``B`` and sliced."""

    def __init__(self, shape: Sequence[int], itemsize: int, mesh: Mesh) -> None:
        super().__init__(shape, itemsize, mesh)
        self.whole = False  # every query is a pair search over the direct values

    def _pair(
        self, src: tuple[int, ...], dst: tuple[int, ...]
    ) -> tuple[float, list[tuple[tuple[int, ...], int, int]]]:
        key = (src, dst)
        hit = self._pairs.get(key)
        if hit is not None:
            return hit
        allowed: list[Sequence[int]] = [sorted({s, d, 0}) if s != d else [s] for s, d in zip(src, dst)]
        best, back, found = self._dijkstra(src, allowed, dst, None)
        result = (best[dst], self._route(back, src, dst)) if found else self._all_b_route(src, dst)
        self._pairs[key] = result
        return result


_SEARCH_CACHE_SIZE = 4096
_searches: dict[tuple[Any, ...], BoxingSearch | OneFlowBoxing] = {}


def boxing_search(
    shape: Sequence[int], itemsize: int, mesh: Mesh, lowering: str = "ideal"
) -> BoxingSearch | OneFlowBoxing:
    """The (cached) boxing finder of a tensor shape and item size on ``mesh`` for ``lowering``
    (``"ideal"``: :class:`BoxingSearch`; ``"oneflow-0.9"``: :class:`OneFlowBoxing`;
    ``"direct"``: :class:`DirectBoxing`).

    Cached per (shape, item size, mesh content, lowering) in this process, the most
    recent :data:`_SEARCH_CACHE_SIZE` kept, so identical tensors share their searches.
    """
    if lowering not in ("ideal", "oneflow-0.9", "direct"):
        raise ValueError(f"unknown lowering {lowering!r}")
    key = (tuple(shape), itemsize, mesh.shape, mesh.axes, lowering)
    search = _searches.get(key)
    if search is None:
        if len(_searches) >= _SEARCH_CACHE_SIZE:
            _searches.pop(next(iter(_searches)))
        if lowering == "oneflow-0.9":
            search = _searches[key] = OneFlowBoxing(shape, itemsize, mesh)
        else:
            finder = DirectBoxing if lowering == "direct" else BoxingSearch
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


@functools.lru_cache(maxsize=65536)
def send_recv_bytes(
    shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp, mesh_shape: tuple[int, ...]
) -> float:
    """Largest bytes any device receives when ``src`` is boxed into ``dst`` point to point.

    Formula, per device ``d`` with destination region ``R_d`` and source region
    ``R'_d``: ``received = p * |R_d| - |R_d & R'_d|`` elements, where ``p`` is the
    product of the sizes of the axes on which ``src`` is ``P`` (``d`` needs every
    addend of its region; it holds one of them, for the part of ``R_d`` it
    already has).  Regions are OneFlow's (``BalancedSplitter``, nested in mesh-axis
    order: :func:`autopar.oneflow.lowering.device_slices`), so uneven splits count
    each device's own.  Bytes = elements * ``itemsize``; the maximum over devices is
    returned (the slowest device finishes the step).  Units: bytes.
    Source: OneFlow 0.9 ``NcclSendRecvBoxingKernel`` (each rank receives the
    intersections of its output slice with every other rank's input slice).
    """
    shape, mesh_shape = tuple(shape), tuple(mesh_shape)
    if local_shape(shape, src, mesh_shape) is None or local_shape(shape, dst, mesh_shape) is None:
        return INF
    partial = math.prod(n for v, n in zip(src.values, mesh_shape) if isinstance(v, Partial))
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
        mine = device_slices(shape, src, mesh_shape, coord)
        want = device_slices(shape, dst, mesh_shape, coord)
        region = math.prod(b1 - b0 for b0, b1 in want)
        overlap = math.prod(max(0, min(a1, b1) - max(a0, b0)) for (a0, a1), (b0, b1) in zip(mine, want))
        worst = max(worst, partial * region - overlap)
    return float(worst * itemsize)


class OneFlowBoxing:
    """What OneFlow 0.9 runs for every boxing of one tensor (shape, item size) on one mesh.

    Each boxing follows OneFlow's route through middle N-D SBPs
    (``BoxingWithMiddleNodes``: observed routes from compiled jobs, else
    OneFlow's copy-cost rule) and each hop is lowered as OneFlow's
    ``InsertNcclLogicalOpPass`` lowers it (hierarchical NCCL collectives where it
    has one, send/recv of the needed slices otherwise), one step per mesh axis
    that moves bytes: :mod:`autopar.oneflow.pricing` (the one registry of
    routes and lowerings; source references there and in
    :mod:`autopar.oneflow.lowering`).  Plans are memoised per (source,
    destination), each hop's steps per hop.  A boxing's seconds (:meth:`time`,
    :meth:`matrix`) are summed from its steps without building the plan, memoised
    per pair of SBPs on the mesh axes of size > 1 (on which OneFlow routes and
    lowers: every SBP that differs only on size-1 axes shares them).
    """

    def __init__(self, shape: Sequence[int], itemsize: int, mesh: Mesh) -> None:
        self.shape = tuple(shape)
        self.itemsize = itemsize
        self.mesh = mesh
        self._live = tuple(a for a, n in enumerate(mesh.shape) if n > 1)
        self._plans: dict[tuple[NdSbp, NdSbp], BoxingPlan] = {}
        self._hops: dict[tuple[NdSbp, NdSbp], list[Step]] = {}
        self._squeezed: dict[NdSbp, NdSbp | None] = {}
        self._times: dict[tuple[NdSbp, NdSbp], float] = {}
        self._pair_steps: dict[tuple[NdSbp, NdSbp], tuple[BoxingStep, ...] | None] = {}

    def plan(self, src: NdSbp, dst: NdSbp) -> BoxingPlan:
        """The steps and seconds of ``src -> dst``
        (:func:`autopar.oneflow.pricing.oneflow_steps`; ``inf`` seconds when impossible)."""
        key = (src, dst)
        found = self._plans.get(key)
        if found is None:
            boxed = self._steps(src, dst)
            if boxed is None:
                found = BoxingPlan(src, dst, (), INF)
            else:
                found = BoxingPlan(src, dst, boxed, sum(st.time_s for st in boxed))
            self._plans[key] = found
        return found

    def _steps(self, src: NdSbp, dst: NdSbp) -> tuple[BoxingStep, ...] | None:
        """:func:`autopar.oneflow.pricing.oneflow_steps` as :class:`BoxingStep` values, memoised
        per squeezed pair (the steps name B on the size-1 axes, whatever the ends hold there)."""
        if src == dst:
            return ()
        a, b = self._squeeze(src), self._squeeze(dst)
        if a is None or b is None:
            return None
        if not self._live or a == b:
            return ()
        return self._squeezed_steps(a, b)

    def _squeezed_steps(self, a: NdSbp, b: NdSbp) -> tuple[BoxingStep, ...] | None:
        """:meth:`_steps` of two different squeezed layouts."""
        if (a, b) in self._pair_steps:
            return self._pair_steps[(a, b)]
        hierarchy = tuple(self.mesh.shape[x] for x in self._live)
        chain = oneflow_routes(self.shape, self.itemsize, [(a, b)], hierarchy)[0]
        found = None
        if chain is not None:
            steps = chain_steps(self.shape, self.itemsize, self._live, chain, self.mesh, self._hops)
            found = tuple(BoxingStep(x, Collective(k), s, d, n, t) for x, k, s, d, n, t in steps)
        self._pair_steps[(a, b)] = found
        return found

    def _squeeze(self, sbp: NdSbp) -> NdSbp | None:
        """``sbp`` on the mesh axes of size > 1 (itself when there are none); None when it
        is not a layout of the tensor (a split that does not divide)."""
        if sbp in self._squeezed:
            return self._squeezed[sbp]
        out: NdSbp | None = None
        if local_shape(self.shape, sbp, self.mesh.shape) is not None:
            squeeze = self._live and len(self._live) != len(sbp)
            out = NdSbp(tuple(sbp[a] for a in self._live)) if squeeze else sbp
        self._squeezed[sbp] = out
        return out

    def time(self, src: NdSbp, dst: NdSbp) -> float:
        """Seconds of :meth:`plan` (the same steps' seconds summed in the same order)."""
        if src == dst:
            return 0.0
        a, b = self._squeeze(src), self._squeeze(dst)
        if a is None or b is None:
            return INF
        if not self._live or a == b:
            return 0.0
        found = self._times.get((a, b))
        if found is None:
            self._price([(a, b)])
            found = self._times[(a, b)]
        return found

    def _price(self, pairs: list[tuple[NdSbp, NdSbp]]) -> None:
        """Fill the memo for ``pairs`` (distinct squeezed SBPs, not yet priced), routed together."""
        hierarchy = tuple(self.mesh.shape[a] for a in self._live)
        for pair, chain in zip(pairs, oneflow_routes(self.shape, self.itemsize, pairs, hierarchy)):
            if chain is None:
                self._times[pair] = INF
                continue
            total = 0.0
            for step in chain_steps(self.shape, self.itemsize, self._live, chain, self.mesh, self._hops):
                total += step[5]
            self._times[pair] = total

    def shared_table(self) -> HopTable | None:
        """The shared :class:`~autopar.oneflow.hop_table.HopTable` when every route is direct
        (three or more axes of size > 1, none with observed routes), else None."""
        hierarchy = tuple(self.mesh.shape[a] for a in self._live)
        if len(hierarchy) < 3 or hierarchy in _observed_hierarchies():
            return None
        return hop_table(hierarchy, tuple(self.mesh.axes[a] for a in self._live), len(self.shape))

    def matrix(self, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp]) -> np.ndarray:
        """Seconds from each of ``srcs`` (rows) to each of ``dsts`` (columns), equal to
        :meth:`time` entry by entry: each distinct squeezed pair priced once, the pairs
        not priced yet routed together (on three or more axes: all at once, from the
        mesh's shared :class:`~autopar.oneflow.hop_table.HopTable`)."""
        return self.matrices(srcs, dsts, self.shared_table())[0]

    def matrices(
        self, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp], table: HopTable | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`matrix`, with (from ``table`` only; zeros otherwise) each pair's latency
        seconds and whether it has a step that moves bytes."""
        ids: dict[NdSbp, int] = {}
        src_ids = np.fromiter((ids.setdefault(s, len(ids)) for s in srcs), dtype=np.int64, count=len(srcs))
        dst_ids = np.fromiter((ids.setdefault(d, len(ids)) for d in dsts), dtype=np.int64, count=len(dsts))
        squeezed = [self._squeeze(s) for s in ids]
        rows = list(dict.fromkeys(squeezed[i] for i in src_ids.tolist() if squeezed[i] is not None))
        cols = list(dict.fromkeys(squeezed[i] for i in dst_ids.tolist() if squeezed[i] is not None))
        parts = [np.zeros((len(rows) + 1, len(cols) + 1), dtype=t) for t in (np.float64, np.float64, bool)]
        parts[0][-1, :] = INF  # the last row and column: not a layout of the tensor
        parts[0][:, -1] = INF
        if self._live and rows and cols:
            found = self._small_fast(table, rows, cols) if table is not None else (self._small(rows, cols),)
            for part, small in zip(parts, found):
                part[: len(rows), : len(cols)] = small
        row_at = {sbp: i for i, sbp in enumerate(rows)}
        col_at = {sbp: j for j, sbp in enumerate(cols)}
        r = np.array([len(rows) if q is None else row_at.get(q, len(rows)) for q in squeezed], dtype=np.int64)
        c = np.array([len(cols) if q is None else col_at.get(q, len(cols)) for q in squeezed], dtype=np.int64)
        same = src_ids[:, None] == dst_ids[None, :]
        out = tuple(part[np.ix_(r[src_ids], c[dst_ids])] for part in parts)
        out[0][same] = 0.0  # no change: free, even for a non-layout
        out[2][same] = False
        return out[0], out[1], out[2]

    def _small(self, rows: list[NdSbp], cols: list[NdSbp]) -> np.ndarray:
        times = self._times
        todo = [(a, b) for a in rows for b in cols if a != b and (a, b) not in times]
        if todo:
            self._price(todo)
        return np.array(
            [[0.0 if a == b else times[(a, b)] for b in cols] for a in rows], dtype=np.float64
        ).reshape(len(rows), len(cols))

    def _small_fast(
        self, table: HopTable, rows: list[NdSbp], cols: list[NdSbp]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = np.array([table.index[a] for a in rows], dtype=np.int64)
        c = np.array([table.index[b] for b in cols], dtype=np.int64)
        seconds, latency, stepped, uneven = table.price(self.shape, self.itemsize, r, c)
        # nor where an end's split does not divide (its count assumes even slices)
        hierarchy = tuple(self.mesh.shape[x] for x in self._live)
        even_rows = np.array([is_even(self.shape, a, hierarchy) for a in rows], dtype=bool)
        even_cols = np.array([is_even(self.shape, b, hierarchy) for b in cols], dtype=bool)
        uneven = uneven | ~even_rows[:, None] | ~even_cols[None, :]
        odd = np.argwhere(uneven).tolist()  # the table does not apply: pair by pair
        todo = list(
            dict.fromkeys((rows[i], cols[j]) for i, j in odd if (rows[i], cols[j]) not in self._times)
        )
        if todo:
            self._price(todo)
        for i, j in odd:
            pair = (rows[i], cols[j])
            steps = self._squeezed_steps(*pair)
            found = () if steps is None else steps
            seconds[i, j] = self._times[pair]
            latency[i, j] = sum(step_latency(s, self.mesh) for s in found)
            stepped[i, j] = bool(found)
        return seconds, latency, stepped


def step_latency(step: BoxingStep, mesh: Mesh) -> float:
    """The latency part of a boxing step, seconds: its time less its bytes over the axis's
    bandwidth for that collective (``alpha``-terms of the alpha-beta model)."""
    if step.collective is Collective.LOCAL or step.bytes_per_device <= 0:
        return max(0.0, step.time_s)
    _, beta = mesh.axes[step.axis].alpha_beta(step.collective.value)
    return max(0.0, step.time_s - step.bytes_per_device / beta)


@functools.lru_cache(maxsize=1)
def _observed_hierarchies() -> frozenset[tuple[int, ...]]:
    """The hierarchies with observed OneFlow routes (:func:`autopar.oneflow.pricing.observed_routes`)."""
    return frozenset(h for h, _, _ in observed_routes())
