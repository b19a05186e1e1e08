"""A second per-hop byte formula for counted OneFlow traffic, apart from the runtime's own lowering.

Kept apart from :mod:`autopar.runtimes.oneflow_09.lowering` on purpose.

``autopar oneflow fidelity`` compares what autopar predicts with what a compiled
job's own SBPs make it move.  :func:`autopar.runtimes.oneflow_09.lowering.lower_hop` prices a
hop for both the runtime profile the model uses and the counter, so a count made
with it alone shares the model's formula.  This module counts each hop again,
with code and conventions of its own, written from:

* which kernel OneFlow 0.9 runs for a hop: the ``_nccl_logical_*`` ops that
  ``InsertNcclLogicalOpPass`` (``oneflow/core/job_rewriter/insert_nccl_logical_op_pass.cpp``)
  inserts, whose kernels are in ``oneflow/user/kernels/nccl_logical_kernels.cpp``
  (1-D: all-reduce, reduce-scatter, all-gather, s2s), ``nccl_logical_2d_sbp_kernels.cpp``
  (2-D, one axis changing: all-reduce and all-gather on axis 1 of a same-axis-0
  pair, all-to-all on axis 1, all-reduce on axis 0 of a same-axis-1 pair) and
  ``nccl_logical_send_recv_kernel.cpp`` (any other change: each rank receives the
  part of its output slice other ranks hold); a consumer that takes ``P`` from
  ``B`` or ``S`` fills zeros locally (``oneflow/core/graph/boxing/b21_sub_task_graph_builder.cpp``,
  ``naive_b2p_sub_task_graph_builder.cpp``);
* what each collective moves, from NCCL's definitions (``docs/collectives`` and
  nccl-tests ``doc/PERFORMANCE.md``, "bus bandwidth"): per rank of a group of ``n``
  over a buffer of ``S`` bytes (the whole tensor as the group sees it), AllReduce
  ``2 (n-1)/n * S``, AllGather and ReduceScatter ``(n-1)/n * S``, AlltoAll
  ``(n-1)/n`` of the rank's own ``S/n``;
* where the bytes go: a collective over one mesh axis moves them on that axis; a
  collective over all devices runs as NCCL's ring over the ranks in order, so a
  rank's bytes cross axis ``a`` when its ring neighbour first differs from it on
  axis ``a`` (averaged over the ranks: axis 0 carries ``m0 / N`` of the ring's
  bytes on a ``[m0, m1]`` mesh); point-to-point messages count on the outermost
  axis where sender and receiver differ.

What the two formulas count, and where they differ.  Both give every hop the
same total.  Send/recv and the 2-D (one-axis) kernels they count alike, here by
visiting device pairs (the receiver's slice intersected with each sender's),
there by tensor contraction.  They split a *flat* collective (both ends one
value on every axis, ``InOutParallelDimReduce`` to 1-D over all ``N`` devices)
differently between the axes:

* here, as NCCL's ring sends it: OneFlow 0.9 launches one collective on the
  communicator of all ``N`` ranks (``nccl_logical_kernels.cpp``,
  ``NcclLogicalKernelCommState``; the task-graph path's ``FlatSubTskGphBuilder``
  likewise), and a ring enters and leaves each node (axis-0 index) once per
  channel, so axis 0 carries ``n0 / N`` of the ring's bytes per device on
  average (on ``[4, 2]`` an all-gather of ``T``: 0.44 T on each axis).  With one
  NIC per device (the cluster profiles' per-device inter-node bandwidth) NCCL
  spreads the channels over the NICs and a device's inter-node bytes are exactly
  that;
* in ``lower_hop``, as the volumes of a hierarchical schedule OneFlow does not run
  (:func:`autopar.runtimes.oneflow_09.lowering._flat_terms`: 0.75 T on axis 0, 0.125 T on axis
  1): the model's convention for pricing such a hop.

On the held-out compiled jobs (``benchmarks/heldout_truth.py``) that is the whole
difference: every flat all-gather, reduce-scatter and all-reduce differs by this
split and no other hop differs.  This formula is the count of what the kernels
send per axis (given NCCL's ring algorithm and node-major ranks; NCCL's tree
all-reduce would split otherwise); ``lower_hop``'s is what autopar prices.
Units: bytes per device (averaged over the devices of the mesh), per mesh axis.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

from autopar.ir.sbp import Broadcast, NdSbp, Partial, SbpValue, Split

__all__ = ["kernel_hop_bytes"]


def kernel_hop_bytes(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, hierarchy: Sequence[int]
) -> dict[int, float]:
    """Bytes per device per mesh axis of the hop ``src -> dst`` of a tensor of ``shape``
    (elements of ``itemsize`` bytes) on a mesh of ``hierarchy`` (see the module doc)."""
    return dict(_hop(tuple(int(d) for d in shape), int(itemsize), src, dst, tuple(int(h) for h in hierarchy)))


@functools.lru_cache(maxsize=65536)
def _hop(
    shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp, mesh: tuple[int, ...]
) -> tuple[tuple[int, float], ...]:
    zero = {a: 0.0 for a in range(len(mesh))}
    if src == dst:
        return tuple(zero.items())
    # a consumer taking P where the producer has B or S: local zero-fill on that axis
    kept = NdSbp(
        tuple(s if isinstance(d, Partial) and not isinstance(s, Partial) else d for s, d in zip(src, dst))
    )
    if kept == src:
        return tuple(zero.items())
    out = _collective(shape, itemsize, src, kept, mesh)
    if out is None:
        out = _pairwise(shape, itemsize, src, kept, mesh)
    return tuple({**zero, **out}.items())


def _tensor_bytes(shape: tuple[int, ...], itemsize: int) -> float:
    return float(math.prod(shape) * itemsize)


def _evenly(shape: tuple[int, ...], value: SbpValue, n: int) -> bool:
    return not isinstance(value, Split) or (value.dim < len(shape) and shape[value.dim] % n == 0)


def _group_factor(a: SbpValue, b: SbpValue) -> float | None:
    """Bytes a rank moves over the buffer's bytes ``S`` for one NCCL collective in a
    group of ``n``, as a function of ``n`` applied by the caller: None when ``a -> b``
    is not one collective."""
    if isinstance(a, Partial) and isinstance(b, Broadcast):
        return 2.0  # AllReduce: 2 (n-1)/n
    if isinstance(a, Partial) and isinstance(b, Split):
        return 1.0  # ReduceScatter: (n-1)/n
    if isinstance(a, Split) and isinstance(b, Broadcast):
        return 1.0  # AllGather: (n-1)/n
    if isinstance(a, Split) and isinstance(b, Split):
        return -1.0  # AlltoAll: (n-1)/n of S/n
    return None


def _collective_bytes(a: SbpValue, b: SbpValue, buffer: float, n: int) -> float | None:
    factor = _group_factor(a, b)
    if factor is None:
        return None
    if factor < 0:
        return (n - 1) / n * buffer / n
    return factor * (n - 1) / n * buffer


def _collective(
    shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp, mesh: tuple[int, ...]
) -> dict[int, float] | None:
    """The hop as one ``_nccl_logical_*`` collective, or None when OneFlow sends and receives slices."""
    total = _tensor_bytes(shape, itemsize)
    if len(set(src)) == 1 and len(set(dst)) == 1:  # one value on every axis: a 1-D op over all ranks
        n = math.prod(mesh)
        if not (_evenly(shape, src[0], n) and _evenly(shape, dst[0], n)):
            return None
        moved = _collective_bytes(src[0], dst[0], total, n)
        if moved is None:
            return None
        if isinstance(src[0], Split) and isinstance(dst[0], Split):
            return _pairwise(shape, itemsize, src, dst, mesh)  # AlltoAll: point-to-point messages
        return {a: moved * share for a, share in _ring_link_shares(mesh).items()}
    if len(mesh) != 2:
        return None
    changed = [a for a in range(2) if src[a] != dst[a]]
    if changed == [1]:
        # same axis 0: all-reduce, all-gather or all-to-all within each axis-0 group
        # (nccl_logical_2d_sbp_kernels.cpp has no reduce-scatter for (*, P) -> (*, S))
        if isinstance(src[1], Partial) and isinstance(dst[1], Split):
            return None
        piece = _piece(shape, src[0], mesh[0])
        if piece is None or not (_evenly(piece, src[1], mesh[1]) and _evenly(piece, dst[1], mesh[1])):
            return None
        moved = _collective_bytes(src[1], dst[1], _tensor_bytes(piece, itemsize), mesh[1])
        return None if moved is None else {1: moved}
    if changed == [0] and isinstance(src[0], Partial) and isinstance(dst[0], Broadcast):
        if isinstance(src[1], Split) and src[1] == src[0]:
            return None
        piece = _piece(shape, src[1], mesh[1])
        if piece is None:
            return None
        return {0: 2 * (mesh[0] - 1) / mesh[0] * _tensor_bytes(piece, itemsize)}
    return None


def _piece(shape: tuple[int, ...], value: SbpValue, n: int) -> tuple[int, ...] | None:
    """The part of the tensor one group along the other axis holds (None: uneven split)."""
    if not isinstance(value, Split):
        return shape
    if not _evenly(shape, value, n):
        return None
    return tuple(d // n if i == value.dim else d for i, d in enumerate(shape))


def _ring_link_shares(mesh: tuple[int, ...]) -> dict[int, float]:
    """Share of a ring's links (rank r -> r+1 mod N, ranks in row-major mesh order) that first
    differ on each mesh axis."""
    n = math.prod(mesh)
    counts = dict.fromkeys(range(len(mesh)), 0)
    coords = list(itertools.product(*(range(m) for m in mesh)))
    for r in range(n):
        a, b = coords[r], coords[(r + 1) % n]
        if a != b:
            counts[next(i for i in range(len(mesh)) if a[i] != b[i])] += 1
    return {a: c / n for a, c in counts.items()}


def _interval(size: int, parts: int, index: int) -> tuple[int, int]:
    """OneFlow's ``BalancedSplitter``: the first ``size % parts`` parts get one more element."""
    base, extra = divmod(size, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def _box(
    shape: tuple[int, ...], sbp: NdSbp, mesh: tuple[int, ...], coord: tuple[int, ...]
) -> list[tuple[int, int]]:
    box = [(0, d) for d in shape]
    for axis, value in enumerate(sbp):
        if isinstance(value, Split):
            lo, hi = box[value.dim]
            a, b = _interval(hi - lo, mesh[axis], coord[axis])
            box[value.dim] = (lo + a, lo + b)
    return box


def _sends_to(src: NdSbp, dst: NdSbp, sender: tuple[int, ...], receiver: tuple[int, ...]) -> bool:
    """Whether ``sender``'s data reaches ``receiver``: of replicas (``B``) the receiver reads its
    own coordinate's; a ``P`` kept ``P`` stays in its addend's group."""
    for a, (s, d) in enumerate(zip(src, dst)):
        same = sender[a] == receiver[a]
        if isinstance(s, Broadcast) and not same:
            return False
        if isinstance(s, Partial) and isinstance(d, Partial) and not same:
            return False
    return True


def _pairwise(
    shape: tuple[int, ...], itemsize: int, src: NdSbp, dst: NdSbp, mesh: tuple[int, ...]
) -> dict[int, float]:
    """Point-to-point bytes (``NcclLogicalSendRecv``): every rank receives from every other rank
    that :func:`_sends_to` it the overlap of that rank's input slice with its own output slice."""
    coords = list(itertools.product(*(range(m) for m in mesh)))
    out = dict.fromkeys(range(len(mesh)), 0.0)
    for receiver in coords:
        want = _box(shape, dst, mesh, receiver)
        for sender in coords:
            if sender == receiver or not _sends_to(src, dst, sender, receiver):
                continue
            have = _box(shape, src, mesh, sender)
            overlap = math.prod(max(0, min(h1, h2) - max(l1, l2)) for (l1, h1), (l2, h2) in zip(want, have))
            if overlap:
                axis = next(i for i in range(len(mesh)) if sender[i] != receiver[i])
                out[axis] += overlap * itemsize
    n = len(coords)
    return {a: b / n for a, b in out.items()}
