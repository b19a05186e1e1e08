"""How OneFlow 0.9 lowers one boxing hop, and the bytes per device autopar prices it with.

Written from OneFlow's source rather than from autopar's ideal cost model
(:mod:`autopar.runtimes.ideal`).  The ``oneflow-0.9`` runtime profile prices predicted
boxing with :func:`lower_hop` and :func:`autopar.bridges.oneflow.traffic.count_job_traffic`
prices counted hops with it too, so a count made with it is not independent of
the prediction: it checks the SBPs on each edge, not this formula.  The counter's
formula of its own is :mod:`autopar.bridges.oneflow.kernel_bytes`.

A *hop* is one producer -> consumer edge of a compiled job whose N-D SBPs
differ.  OneFlow first splits a multi-step transition into hops by inserting
``System-Boxing-Middle-Identity`` ops (``BoxingWithMiddleNodes``,
``oneflow/core/job_rewriter/boxing_with_middle_nodes.cpp``, middle SBPs from
``BoxingCollector``); those ops are in the compiled job, so every edge counted
here is one hop.  Each hop is then lowered as follows (OneFlow 0.9 with
``nccl_use_compute_stream``, which ``enable_zero(stage>=2)`` and gradient
accumulation switch on: ``python/oneflow/nn/graph/graph_config.py``), in
``InsertNcclLogicalOpPass`` (``oneflow/core/job_rewriter/insert_nccl_logical_op_pass.cpp``):

1. ``InOutParallelDimReduce`` (``oneflow/core/job/nd_sbp_util.cpp``): an N-D SBP
   whose axes all hold the same value is one value over all devices
   (``(S(0), S(0))`` on ``[4, 2]`` is ``S(0)`` over 8); both ends are reduced
   only when both reduce, and a split only where the merged axes cut its dim as
   one axis would (``CanMergeSplit``: an uneven dim may not merge).
2. 1-D (``TryBuildNcclBy1DHierarchy``) over the ``N`` devices: ``P -> B``
   all-reduce; ``P -> S(d)`` reduce-scatter; ``S(d) -> B`` all-gather;
   ``S(i) -> S(j)`` all-to-all (each when the split dims divide by ``N``);
   any other change whose consumer has no ``P``: ``_nccl_logical_send_recv``.
3. 2-D, axis 0 equal (``TryBuildNcclBy2DHierarchySameDim0``): on axis 1 within
   each axis-0 group, on the group's piece of the tensor: ``(*, P) -> (*, B)``
   all-reduce, ``(*, S) -> (*, B)`` all-gather, ``(*, S(i)) -> (*, S(j))``
   all-to-all.  ``(*, P) -> (*, S)`` and ``(*, B) -> (*, S)`` are not among
   them ("TODO: same dim 0 need to deal with (*, P) -> (*, S)"): send/recv.
4. 2-D, axis 1 equal and neither end ``(S(i), S(i))``
   (``TryBuildNcclBy2DHierarchySameDim1``): only ``(P, *) -> (B, *)``, an
   all-reduce on axis 0; everything else (all-gathers and reduce-scatters on
   axis 0 included) is send/recv.
5. 2-D otherwise (``TryBuildNcclBy2DHierarchyOthers``): send/recv when the
   consumer has no ``P``.
6. A consumer with ``P`` that no rule above takes (``B -> P``, ``S -> P``) is
   boxed in the task graph without communication (``NaiveB2PSubTskGphBuilder``:
   zeros on all but one device; ``S -> P`` keeps the local slice).

Bytes per device (the unit of :mod:`autopar.cost.evaluate`'s ``comm_bytes_per_axis``):

* ring collectives on a group of ``n`` holding ``T`` bytes (the tensor as the
  group sees it): all-gather and reduce-scatter ``(n-1)/n * T``, all-reduce
  ``2 (n-1)/n * T``, all-to-all ``(n-1)/n^2 * T`` (NCCL's ring and pairwise
  algorithms); a 1-D collective over all devices of an N-D mesh is split between
  the axes as a hierarchical schedule would move it (:func:`_flat_terms`: on
  ``[n0, n1]`` an all-gather puts ``(n0-1)/n0 * T`` on axis 0 and
  ``(n1-1)/n1 * T/n0`` on axis 1), whose per-axis sum equals the flat volume.
  That split is this model's convention, not what OneFlow's kernel sends: OneFlow
  0.9 runs such a hop as one collective on a communicator of all ``N`` devices
  (``nccl_logical_kernels.cpp``: ``NcclLogicalKernelCommState`` takes the
  communicator of the op's whole 1-D placement, one ``AllGather`` / ``AllReduce``
  / ``ReduceScatter`` launch; the task-graph path, ``FlatSubTskGphBuilder`` in
  ``hierarchical_sub_task_graph_builder_impl.cpp``, boxes a hop reduced to 1-D as
  one collective too), so which link each byte crosses is NCCL's choice.  With
  NCCL's ring (every node entered and left once per channel) axis 0 carries
  ``n0/N`` of the ring's bytes, ``(N-1)/N * T / n1`` for an all-gather: 0.44 T on
  ``[4, 2]`` where this split says 0.75 T (axis 1: 0.44 T against 0.125 T);
  :mod:`autopar.bridges.oneflow.kernel_bytes` counts that ring split.  On the held-out
  compiled jobs the two formulas differ on these flat collectives and nowhere
  else (docs/oneflow-boxing.md, "Flat collectives: the split between axes").  The
  split is what the ``oneflow-0.9`` runtime profile prices time with, so a count
  made with it checks the SBPs, not where the bytes go;
* send/recv (``_nccl_logical_send_recv``, ``NcclLogicalSendRecv`` kernel): each
  device receives, from every other device, the intersection of that device's
  input slice with its own output slice (``GetRankSendRecvIntersection``); a
  ``P`` input is summed at the receiver, so every contributor sends its
  addend; of replicas (``B``) the one with the receiver's own coordinates is
  read.  A message counts on axis 0 when sender and receiver differ in their
  axis-0 coordinate (they are in different nodes for a ``[nodes, gpus]``
  mesh), else on the last axis it crosses.  The bytes are averaged over the
  devices.

Slices follow OneFlow's ``BalancedSplitter`` (the first ``dim % n`` parts get
one more row).  Python and numpy; no OneFlow needed.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar.ir.sbp import Broadcast, NdSbp, Partial, SbpValue, Split

__all__ = [
    "Hop",
    "balanced_range",
    "can_merge_split",
    "device_slices",
    "lower_hop",
    "reduce_nd_sbp",
    "ring_steps",
]

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_TO_ALL = "all_to_all"
SEND_RECV = "send_recv"
LOCAL = "local"


@dataclass
class Hop:
    """One boxing hop as OneFlow 0.9 runs it."""

    kind: str
    """all_reduce, all_gather, reduce_scatter, all_to_all, send_recv or local"""
    scope: str
    """``flat`` (1-D over all devices), ``axis 0`` / ``axis 1`` (one axis of a 2-D mesh), ``2-D``"""
    rule: str
    """the OneFlow function that chose it"""
    bytes_per_axis: dict[int, float] = field(default_factory=dict)
    """bytes each device sends (averaged over devices), per mesh axis"""

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes_per_axis.values())


def balanced_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """``[lo, hi)`` of part ``index`` when OneFlow's ``BalancedSplitter`` cuts ``size`` into ``parts``."""
    base, extra = divmod(size, parts)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)


def device_slices(
    shape: Sequence[int], sbp: NdSbp, hierarchy: Sequence[int], coord: Sequence[int]
) -> tuple[tuple[int, int], ...]:
    """The box ``((lo, hi), ...)`` of the tensor the device at ``coord`` holds under ``sbp``.

    Axes split the same dim in mesh-axis order (OneFlow's ``GetTensorSliceView4ParallelId``).
    """
    box = [(0, int(d)) for d in shape]
    for axis, value in enumerate(sbp):
        if isinstance(value, Split):
            lo, hi = box[value.dim]
            a, b = balanced_range(hi - lo, int(hierarchy[axis]), int(coord[axis]))
            box[value.dim] = (lo + a, lo + b)
    return tuple(box)


def can_merge_split(size: int, parts: int) -> bool:
    """OneFlow's ``CanMergeSplit`` (``sbp_infer_util.cpp``): ``(S(i), S(i))`` on ``[a, b]`` cuts a
    dim of ``size`` as ``S(i)`` on ``a * b`` devices does iff ``size % (a * b)`` is 0, 1 or
    ``a * b - 1`` (nested ``BalancedSplitter`` slices; e.g. 6 on ``[2, 2]`` is 2, 1, 2, 1 but
    on 4 devices 2, 2, 1, 1)."""
    remainder = size % parts
    return remainder <= 1 or remainder == parts - 1


def reduce_nd_sbp(
    src: NdSbp, dst: NdSbp, hierarchy: Sequence[int], shape: Sequence[int] | None = None
) -> tuple[tuple[SbpValue, ...], tuple[SbpValue, ...], tuple[int, ...]]:
    """``InOutParallelDimReduce`` for one placement: both ends to 1-D when each has one value on
    all axes and, for a split, the merged axes cut the dim as one axis would
    (:func:`can_merge_split` at each merge, when ``shape`` is given; always for even splits)."""
    if len(set(src)) == 1 and len(set(dst)) == 1:
        merges = (
            all(
                not isinstance(v, Split)
                or all(
                    can_merge_split(int(shape[v.dim]), math.prod(hierarchy[:k]))
                    for k in range(2, len(hierarchy) + 1)
                )
                for v in (src[0], dst[0])
            )
            if shape is not None
            else True
        )
        if merges:
            return (src[0],), (dst[0],), (math.prod(hierarchy),)
    return tuple(src), tuple(dst), tuple(int(h) for h in hierarchy)


def ring_steps(kind: str, n: int) -> int:
    """Latency steps (alpha terms) of one collective ``kind`` on ``n`` devices: a ring
    all-reduce takes 2(n-1) steps, an all-gather, reduce-scatter or all-to-all n-1, a
    send/recv one, a local move none (NCCL's ring algorithms; the cost tables' and the
    OneFlow pricing's one count)."""
    if kind == "send-recv":
        return 1
    if kind == "local" or n <= 1:
        return 0
    return 2 * (n - 1) if kind == "all-reduce" else n - 1


def _ring(kind: str, group_bytes: float, n: int) -> float:
    if n <= 1:
        return 0.0
    if kind == ALL_REDUCE:
        return 2 * (n - 1) / n * group_bytes
    if kind == ALL_TO_ALL:
        return (n - 1) / (n * n) * group_bytes
    return (n - 1) / n * group_bytes


def _send_recv(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, hierarchy: Sequence[int]
) -> dict[int, float]:
    """Send/recv bytes per device per mesh axis (see the module doc), without visiting device pairs.

    What is counted: receiver ``d`` gets ``|slice_src(s) & slice_dst(d)|`` elements
    from each sender ``s != d`` it reads (every coordinate on the axes where
    ``src`` is ``S`` or a ``P`` the consumer sums; ``d``'s own on ``B`` axes and on
    axes where both ends are ``P``), on the first mesh axis where ``s`` and ``d``
    differ; bytes = elements * ``itemsize``, averaged over the devices.

    How: the intersection's volume is a product over tensor dims of 1-D overlaps,
    each a function of the coordinates on the mesh axes that split that dim (when
    every split divides evenly, the count for the least such shape, scaled).
    ``F(a)`` = the volume summed over all (receiver, sender) pairs that also agree
    on the axes before ``a`` is one tensor contraction (``numpy.einsum`` over
    integers: exact); the pairs that first differ on axis ``a`` sum to
    ``F(a) - F(a + 1)`` (``F(k)``, all axes equal, is each device reading itself).
    """
    sizes = tuple(int(h) for h in hierarchy)
    dims = tuple(int(d) for d in shape)
    # splits that divide evenly (every state autopar prices): the count scales with each split
    # dim's size over the least size both ends cut evenly, so one count per SBP pair serves
    # every shape (exact integers either way)
    parts_src, parts_dst = [1] * len(dims), [1] * len(dims)
    for parts, sbp in ((parts_src, src), (parts_dst, dst)):
        for v, n in zip(sbp, sizes):
            if isinstance(v, Split):
                if v.dim >= len(dims):
                    raise IndexError(f"{sbp} splits dim {v.dim} of a {len(dims)}-D tensor")
                parts[v.dim] *= n
    unit = tuple(math.lcm(a, b) for a, b in zip(parts_src, parts_dst))
    if all(size % u == 0 for size, u in zip(dims, unit)):
        moved = _unit_moved(src, dst, sizes, unit)
        scale = math.prod(size // u for size, u in zip(dims, unit))
    else:
        moved, scale = _moved(dims, src, dst, sizes), 1
    n_devices = math.prod(sizes)
    return {a: float(moved[a] * scale * itemsize) / n_devices for a in range(len(sizes))}


@functools.lru_cache(maxsize=65536)
def _unit_moved(src: NdSbp, dst: NdSbp, hierarchy: tuple[int, ...], unit: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`_moved` for the tensor of shape ``unit`` (memoised: shared by every shape that
    is a multiple of it)."""
    return _moved(unit, src, dst, hierarchy)


def _moved(shape: tuple[int, ...], src: NdSbp, dst: NdSbp, hierarchy: tuple[int, ...]) -> tuple[int, ...]:
    """Elements received over each mesh axis, summed over the devices (see :func:`_send_recv`)."""
    k = len(hierarchy)
    forced = {
        a
        for a, v in enumerate(src)
        if isinstance(v, Broadcast) or (isinstance(v, Partial) and isinstance(dst[a], Partial))
    }
    # per tensor dim split on either side: the 1-D overlap of every sender's slice with
    # every receiver's, one array axis per (side, mesh axis) variable
    factors: list[tuple[np.ndarray, list[tuple[str, int]]]] = []
    constant = 1
    for dim, size in enumerate(shape):
        s_axes, s_lo, s_hi = _split_bounds(size, src, dim, hierarchy)
        d_axes, d_lo, d_hi = _split_bounds(size, dst, dim, hierarchy)
        if not s_axes and not d_axes:
            constant *= size
            continue
        lo = np.maximum(s_lo.reshape(s_lo.shape + (1,) * len(d_axes)), d_lo)
        hi = np.minimum(s_hi.reshape(s_hi.shape + (1,) * len(d_axes)), d_hi)
        variables = [("s", a) for a in s_axes] + [("d", a) for a in d_axes]
        factors.append((np.maximum(hi - lo, 0), variables))
    # F(a) for each distinct tie set (a forced axis ties nothing new: F(a) == F(a + 1))
    totals: dict[frozenset[int], int] = {}
    ties = [frozenset(forced | set(range(a))) for a in range(k + 1)]
    for tied in ties:
        if tied not in totals:
            totals[tied] = _contract(factors, hierarchy, tied) * constant
    return tuple(totals[ties[a]] - totals[ties[a + 1]] for a in range(k))


def _split_bounds(
    size: int, sbp: NdSbp, dim: int, hierarchy: Sequence[int]
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The mesh axes splitting tensor dim ``dim`` under ``sbp`` (mesh order) and each device's
    ``[lo, hi)`` on that dim, indexed by its coordinates on those axes (nested ``BalancedSplitter``,
    as :func:`device_slices`)."""
    axes = [a for a, v in enumerate(sbp) if isinstance(v, Split) and v.dim == dim]
    lo, hi = _nested_bounds(size, tuple(int(hierarchy[a]) for a in axes))
    return axes, lo, hi


@functools.lru_cache(maxsize=4096)
def _nested_bounds(size: int, parts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi)`` of each piece when ``size`` is cut into ``parts[0]`` balanced pieces, each of
    those into ``parts[1]``, ...: arrays of shape ``parts`` (read-only; memoised)."""
    lo = np.zeros((), dtype=np.int64)
    hi = np.full((), size, dtype=np.int64)
    for n in parts:
        base, extra = np.divmod(hi - lo, n)
        index = np.arange(n, dtype=np.int64)
        start = lo[..., None] + index * base[..., None] + np.minimum(index, extra[..., None])
        hi = start + base[..., None] + (index < extra[..., None])
        lo = start
    lo.setflags(write=False)
    hi.setflags(write=False)
    return lo, hi


def _contract(
    factors: list[tuple[np.ndarray, list[tuple[str, int]]]], hierarchy: tuple[int, ...], tied: frozenset[int]
) -> int:
    """Sum over senders and receivers of the product of ``factors`` (the slices' overlap, in
    elements, without the unsplit dims), sender and receiver on the same coordinate on the
    ``tied`` axes and on any coordinates elsewhere."""
    letters: dict[tuple[str, int], int] = {}
    operands: list[Any] = []
    for values, variables in factors:
        subscripts = [
            letters.setdefault(("c", a) if a in tied else (side, a), len(letters)) for side, a in variables
        ]
        operands += [values, subscripts]
    # variables no slice depends on: each of their values counts once
    constant = 1
    for axis, n in enumerate(hierarchy):
        for side in ("c",) if axis in tied else ("s", "d"):
            if (side, axis) not in letters:
                constant *= n
    if not operands:
        return constant
    work = math.prod(hierarchy[a] for _, a in letters)
    return int(np.einsum(*operands, [], optimize="greedy" if work > 4096 else False)) * constant


def _divides(shape: Sequence[int], dim: int, n: int) -> bool:
    return dim < len(shape) and shape[dim] % n == 0


Term = tuple[Any, ...]
"""Bytes of one mesh axis of a hop, without the tensor: ``("ring", kind, n, d)`` =
``_ring(kind, T / d, n)``; ``("a2a", peers, nn)`` = ``peers * T / nn``; ``("sr",)`` = the
axis's send/recv bytes (:func:`_send_recv`); ``("zero",)`` = 0.  ``T`` = the tensor's bytes."""

ZERO: Term = ("zero",)
SR: Term = ("sr",)


@dataclass(frozen=True)
class HopRule:
    """How OneFlow lowers one hop, before any byte is counted: what :func:`lower_hop` decides."""

    kind: str
    scope: str
    rule: str
    terms: dict[int, Term]
    """per mesh axis (of the hop's hierarchy); ``kind`` is settled by :func:`lower_hop` for the
    "P kept" rule (send/recv, or local when nothing moves)"""


def lower_hop(shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, hierarchy: Sequence[int]) -> Hop:
    """How OneFlow 0.9 (``nccl_use_compute_stream``) runs the hop ``src -> dst`` (see the module doc)."""
    shape = [int(d) for d in shape]
    if src == dst:
        return Hop(LOCAL, "-", "same SBP")
    found = hop_rule(shape, src, dst, hierarchy)
    total = float(math.prod(shape) * itemsize)
    moved: dict[int, float] | None = None
    if any(t[0] == "sr" for t in found.terms.values()):
        moved = _send_recv(shape, itemsize, src, found_dst(src, dst), hierarchy)
    out = {
        a: moved[a] if t[0] == "sr" and moved is not None else term_bytes(t, total)
        for a, t in found.terms.items()
    }
    kind = found.kind
    if kind == "P kept":
        kind = SEND_RECV if sum(out.values()) > 0 else LOCAL
    return Hop(kind, found.scope, found.rule, out)


def found_dst(src: NdSbp, dst: NdSbp) -> NdSbp:
    """The hop's destination as lowered: the source's value where the consumer takes a ``P``
    the source lacks (a local zero-fill, :func:`hop_rule`)."""
    return NdSbp(
        tuple(s if isinstance(d, Partial) and not isinstance(s, Partial) else d for s, d in zip(src, dst))
    )


def term_bytes(term: Term, total: float) -> float:
    """Bytes per device of one non-send/recv :data:`Term` for a tensor of ``total`` bytes."""
    if term[0] == "ring":
        return _ring(term[1], total / term[3], term[2])
    if term[0] == "a2a":
        return term[1] * total / term[2]
    return 0.0


def hop_rule(shape: Sequence[int], src: NdSbp, dst: NdSbp, hierarchy: Sequence[int]) -> HopRule:
    """The rule OneFlow 0.9 picks for ``src -> dst`` (``src != dst``) and each axis's bytes as a
    :data:`Term`.  ``shape`` is read only for divisibility, which every pair of valid
    layouts passes: for those the rule is the same for every shape."""
    to_partial = [
        a for a, (s, d) in enumerate(zip(src, dst)) if isinstance(d, Partial) and not isinstance(s, Partial)
    ]
    if to_partial:
        # B -> P, S -> P on an axis is local (zero-fill, NaiveB2PSubTskGphBuilder); the other
        # axes still have to change: keep the source's value on those axes and lower the rest
        kept = found_dst(src, dst)
        if kept == src:
            return HopRule(
                LOCAL, "-", "NaiveB2P / local slice (consumer takes P)", dict.fromkeys(range(len(src)), ZERO)
            )
        return hop_rule(shape, src, kept, hierarchy)
    rsrc, rdst, rh = reduce_nd_sbp(src, dst, hierarchy, shape)
    if len(rh) == 1:
        return _flat_rule(shape, rsrc[0], rdst[0], rh[0], hierarchy)
    if len(rh) != 2:
        return HopRule(SEND_RECV, "N-D", "NDNcclSendRecvBoxingSubTskGphBuilder", _all_sr(hierarchy))
    return _two_d_rule(shape, src, dst, (rh[0], rh[1]))


def _all_sr(hierarchy: Sequence[int]) -> dict[int, Term]:
    return dict.fromkeys(range(len(hierarchy)), SR)


def _flat_rule(shape: Sequence[int], a: SbpValue, b: SbpValue, n: int, hierarchy: Sequence[int]) -> HopRule:
    """``TryBuildNcclBy1DHierarchy`` over all ``n`` devices."""
    rule = "TryBuildNcclBy1DHierarchy"
    kind: str | None = None
    if isinstance(a, Partial) and isinstance(b, Broadcast):
        kind = ALL_REDUCE
    elif isinstance(a, Partial) and isinstance(b, Split) and _divides(shape, b.dim, n):
        kind = REDUCE_SCATTER
    elif isinstance(a, Split) and isinstance(b, Broadcast) and _divides(shape, a.dim, n):
        kind = ALL_GATHER
    elif (
        isinstance(a, Split)
        and isinstance(b, Split)
        and _divides(shape, a.dim, n)
        and _divides(shape, b.dim, n)
    ):
        kind = ALL_TO_ALL
    if kind is None:
        return HopRule(SEND_RECV, "flat", rule, _all_sr(hierarchy))
    if len(hierarchy) == 1:
        return HopRule(kind, "flat", rule, {0: ("ring", kind, n, 1)})
    return HopRule(kind, "flat", rule, _flat_terms(kind, hierarchy))


def _two_d_rule(shape: Sequence[int], src: NdSbp, dst: NdSbp, rh: tuple[int, int]) -> HopRule:
    """The 2-D rules (``TryBuildNcclBy2DHierarchy*``), else send/recv (see the module doc)."""
    n0, n1 = rh
    if src[0] == dst[0]:
        a, b = src[1], dst[1]
        d = n0 if isinstance(src[0], Split) else 1
        piece = list(shape)
        if isinstance(src[0], Split):
            piece[src[0].dim] //= n0
        kind: str | None = None
        if isinstance(a, Partial) and isinstance(b, Broadcast):
            kind = ALL_REDUCE
        elif isinstance(a, Split) and isinstance(b, Broadcast) and _divides(piece, a.dim, n1):
            kind = ALL_GATHER
        elif (
            isinstance(a, Split)
            and isinstance(b, Split)
            and _divides(piece, a.dim, n1)
            and _divides(piece, b.dim, n1)
        ):
            kind = ALL_TO_ALL
        if kind is not None:
            return HopRule(
                kind, "axis 1", "TryBuildNcclBy2DHierarchySameDim0", {0: ZERO, 1: ("ring", kind, n1, d)}
            )
    elif (
        src[1] == dst[1]
        and not (_all_same_split(src) or _all_same_split(dst))
        and isinstance(src[0], Partial)
        and isinstance(dst[0], Broadcast)
    ):
        d = n1 if isinstance(src[1], Split) else 1
        terms = {0: ("ring", ALL_REDUCE, n0, d), 1: ZERO}
        return HopRule(ALL_REDUCE, "axis 0", "TryBuildNcclBy2DHierarchySameDim1", terms)
    if any(isinstance(v, Partial) for v in dst):
        # P kept on an axis (the source has it too), the other changes: the task graph's
        # Intra/InterGroup builder moves slices within each addend's group (SliceBoxing)
        return HopRule(
            "P kept", "2-D", "Intra/InterGroupSubTskGphBuilder + SliceBoxing (P kept)", _all_sr(rh)
        )
    return HopRule(SEND_RECV, "2-D", "TryBuildNcclBy2DHierarchyOthers", _all_sr(rh))


def _flat_terms(kind: str, hierarchy: Sequence[int]) -> dict[int, Term]:
    """A collective over all devices of an N-D mesh, counted per axis.

    Ring collectives as a hierarchical schedule's volumes, innermost axis first:
    an all-gather of ``T`` over ``[n0, n1]`` as an all-gather of the ``T/n0``
    group piece on axis 1, then of ``T`` on axis 0; on axis ``a`` the group
    holds ``T / prod(n[:a])`` and moves ``(n_a-1)/n_a`` of it.  The per-axis
    bytes add up to the flat ring volume ``(N-1)/N * T`` (twice that for an
    all-reduce).  OneFlow 0.9 runs no such schedule: it launches one NCCL
    collective over all ``N`` ranks, whose ring puts ``n0/N`` of that volume on
    axis 0 (see the module doc; :mod:`autopar.bridges.oneflow.kernel_bytes` counts that).
    All-to-all: every device sends ``T/N^2`` to each of the other ``N-1``
    devices; a message counts on the outermost axis where the two devices'
    coordinates differ (the same in both formulas).
    """
    out: dict[int, Term] = {}
    n_all = math.prod(int(h) for h in hierarchy)
    for axis in range(len(hierarchy)):
        n = int(hierarchy[axis])
        if kind == ALL_TO_ALL:
            inner = math.prod(int(h) for h in hierarchy[axis + 1 :])
            out[axis] = ("a2a", (n - 1) * inner, n_all * n_all)
        else:
            out[axis] = ("ring", kind, n, math.prod(int(h) for h in hierarchy[:axis]))
    return out


def _all_same_split(sbp: NdSbp) -> bool:
    return len(set(sbp)) == 1 and isinstance(sbp[0], Split)


def lower_chain(
    shape: Sequence[int], itemsize: int, chain: Sequence[NdSbp], hierarchy: Sequence[int]
) -> list[Hop]:
    """The hops of ``chain`` (source, OneFlow's middle SBPs, destination), each lowered."""
    return [lower_hop(shape, itemsize, a, b, hierarchy) for a, b in itertools.pairwise(chain)]


def observed_table(probe: dict[str, Any], itemsize: int = 4) -> dict[str, Any]:
    """The machine-readable boxing table from a probe run (``tests/oneflow/_probe_boxing.py``).

    For every transition: the middle SBPs OneFlow's ``BoxingWithMiddleNodes`` inserted
    when it compiled the probe job (observed), and each hop as OneFlow 0.9 lowers it on
    GPUs with ``nccl_use_compute_stream`` (:func:`lower_hop`): collective, scope, the
    OneFlow function that chose it, bytes per device per axis, and the same bytes as a
    fraction of the tensor's bytes ``T``.
    """
    from autopar.ir.sbp import parse_nd_sbp

    hierarchy = [int(h) for h in probe["hierarchy"]]
    rows = []
    for t in probe["transitions"]:
        shape = [int(d) for d in t["shape"]]
        total = math.prod(shape) * itemsize
        chain = [parse_nd_sbp(s) for s in (t["src"], *t["middle"], t["dst"])]
        hops = lower_chain(shape, itemsize, chain, hierarchy)
        rows.append(
            {
                "shape": shape,
                "src": t["src"],
                "dst": t["dst"],
                "compiled": t["compiled"],
                "middle": t["middle"],
                "hops": [
                    {
                        "from": str(a),
                        "to": str(b),
                        "kind": h.kind,
                        "scope": h.scope,
                        "rule": h.rule,
                        "bytes_per_axis_over_T": {
                            str(ax): round(v / total, 6) for ax, v in sorted(h.bytes_per_axis.items())
                        },
                    }
                    for (a, b), h in zip(itertools.pairwise(chain), hops)
                ],
                "total_over_T": round(sum(h.total_bytes for h in hops) / total, 6),
            }
        )
    return {
        "oneflow": probe.get("oneflow"),
        "hierarchy": hierarchy,
        "itemsize": itemsize,
        "observed_on": "CPU ranks (middle nodes are device-independent: BoxingWithMiddleNodes runs "
        "before device-specific lowering)",
        "lowering": "OneFlow 0.9 on CUDA with nccl_use_compute_stream (ZeRO >= 2): "
        "InsertNcclLogicalOpPass; see autopar/runtimes/oneflow_09/lowering.py",
        "transitions": rows,
    }
