"""Megatron-LM's boxing: within fixed process groups (:class:`DirectBoxing`)."""

from __future__ import annotations

from collections.abc import Sequence

from autopar.hardware.mesh import Mesh
from autopar.runtimes.ideal import BoxingSearch


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
