"""The ``ideal`` runtime: boxing as the cheapest sequence of 1-D ring collectives.

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
(OneFlow's boxing collector); :class:`BoxingSearch` finds the cheapest sequence by
Dijkstra over every N-D SBP of the tensor, and prices every (source, target) pair of
an edge (:func:`autopar.runtimes.registry.boxing_matrix`).  A move that
cannot happen (a split OneFlow refuses: a dim shorter than the axes cutting it,
:func:`autopar.ir.sbp.local_shape`) costs ``inf``.  A split that does not divide is
cut by OneFlow's ``BalancedSplitter``: the bytes are the exact sums over devices,
the time that of the largest shard.  The runtime itself is :data:`IDEAL`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from autopar.hardware.collectives import _TIME, Collective, collective_bytes
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import B, NdSbp, P, SbpValue, Split, local_shape, shard_numel
from autopar.runtimes.boxing import INF, BoxingPlan, BoxingStep, one_axis_collective
from autopar.runtimes.profile import Lowering, RuntimeProfile

__all__ = ["IDEAL", "BoxingSearch"]


IDEAL = RuntimeProfile(
    "ideal",
    Lowering.IDEAL,
    recompute_groups=("attention_core", "norm"),
    source="cheapest 1-D ring collective sequence (Thakur et al. 2005); DDP bucket_cap_mb=25",
)
"""A perfect boxing collector: the cheapest sequence of 1-D ring collectives (:class:`BoxingSearch`),
ZeRO over every replicating axis, gradients bucketed as DDP does (25 MiB)."""


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
    it: :func:`autopar.ir.sbp.local_shape`) may start or end a route, not lie on one;
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

        An uneven layout OneFlow accepts (:func:`autopar.ir.sbp.local_shape`) may only
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
