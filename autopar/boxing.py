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
Dijkstra over every N-D SBP of the tensor (:class:`BoxingSearch`).  A move that
cannot happen (a split that does not divide, a
``B``/``S`` -> ``P`` change that must keep data) costs ``inf``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

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
    "boxing_plan",
    "boxing_time",
    "collective_bytes",
    "reduce_scatter_time",
    "send_recv_time",
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


class BoxingSearch:
    """Cheapest boxing sequences for one tensor (shape, item size) on one mesh.

    States are the N-D SBPs whose axis values are ``S(d)`` for a dim of the
    tensor, ``B`` or ``P`` and that divide evenly; moves change one axis (one
    1-D collective).  Dijkstra from a source reaches every target at once, so
    a whole boxing matrix costs one search per distinct source.
    """

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
        if local_shape(self.shape, src, self.mesh.shape) is None:
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


def boxing_plan(shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh) -> BoxingPlan:
    """Cheapest sequence of 1-D collectives turning ``src`` into ``dst`` on ``mesh``."""
    if src == dst:
        return BoxingPlan(src, dst, (), 0.0)
    return BoxingSearch(shape, itemsize, mesh).plan(src, dst)


def boxing_time(shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh) -> float:
    """Seconds to box ``src`` into ``dst`` (``inf`` when impossible)."""
    return boxing_plan(shape, itemsize, src, dst, mesh).time_s
