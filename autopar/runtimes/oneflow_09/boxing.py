"""OneFlow 0.9's boxing finder: an N-D SBP change priced as OneFlow inserts it
(:class:`OneFlowBoxing`: its route through middle SBPs, each hop lowered to hierarchical NCCL
collectives or to point-to-point sends of the needed slices), and the bytes of such sends
(:func:`send_recv_bytes`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from autopar.hardware.collectives import Collective
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import NdSbp, Partial, Split, is_even, local_shape
from autopar.runtimes.boxing import INF, BoxingPlan, BoxingStep, step_latency
from autopar.runtimes.oneflow_09.hop_table import HopTable, hop_table
from autopar.runtimes.oneflow_09.lowering import device_slices
from autopar.runtimes.oneflow_09.pricing import Step, chain_steps, observed_routes, oneflow_routes

__all__ = ["OneFlowBoxing", "send_recv_bytes"]


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
    order: :func:`autopar.runtimes.oneflow_09.lowering.device_slices`), so uneven splits count
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
    that moves bytes: :mod:`autopar.runtimes.oneflow_09.pricing` (the one registry of
    routes and lowerings; source references there and in
    :mod:`autopar.runtimes.oneflow_09.lowering`).  Plans are memoised per (source,
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
        (:func:`autopar.runtimes.oneflow_09.pricing.oneflow_steps`; ``inf`` seconds when impossible)."""
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
        """:func:`autopar.runtimes.oneflow_09.pricing.oneflow_steps` as :class:`BoxingStep` values, memoised
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
        """The shared :class:`~autopar.runtimes.oneflow_09.hop_table.HopTable` when every route is direct
        (three or more axes of size > 1, none with observed routes), else None."""
        hierarchy = tuple(self.mesh.shape[a] for a in self._live)
        if len(hierarchy) < 3 or hierarchy in _observed_hierarchies():
            return None
        return hop_table(hierarchy, tuple(self.mesh.axes[a] for a in self._live), len(self.shape))

    def matrix(self, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp]) -> np.ndarray:
        """Seconds from each of ``srcs`` (rows) to each of ``dsts`` (columns), equal to
        :meth:`time` entry by entry: each distinct squeezed pair priced once, the pairs
        not priced yet routed together (on three or more axes: all at once, from the
        mesh's shared :class:`~autopar.runtimes.oneflow_09.hop_table.HopTable`)."""
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


@functools.lru_cache(maxsize=1)
def _observed_hierarchies() -> frozenset[tuple[int, ...]]:
    """The hierarchies with observed OneFlow routes
    (:func:`autopar.runtimes.oneflow_09.pricing.observed_routes`)."""
    return frozenset(h for h, _, _ in observed_routes())
