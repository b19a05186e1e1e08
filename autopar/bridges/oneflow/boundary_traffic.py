"""The bytes a compiled pipeline job moves between stages, per direction, matched to the plan's
stage boundaries by tensor shape (:func:`count_boundary_traffic`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autopar.bridges.oneflow.convert import input_bns, nd_sbp_from_proto
from autopar.bridges.oneflow.jobs import load_job
from autopar.ir.sbp import NdSbp, P, Split

__all__ = ["BoundaryEdge", "count_boundary_traffic"]


# ------------------------------------------------------------------ boundary traffic


@dataclass
class BoundaryEdge:
    """One edge of a compiled job between two placements, and what it moves."""

    producer: str
    consumer: str
    lbn: str
    shape: list[int]
    itemsize: int
    src_devices: list[tuple[int, int]]
    """(machine, device) of each device of the sending placement"""
    dst_devices: list[tuple[int, int]]
    src_sbp: str
    dst_sbp: str
    phase: str
    """``per_micro_batch`` or ``once_per_step`` (the consumer runs after an ``acc``)"""
    direction: str
    """``forward`` (to a later stage) or ``backward`` (to an earlier one)"""
    received_per_device: float
    """the most bytes one device of the receiving placement gets"""
    sent_per_device: float
    """the most bytes one device of the sending placement sends"""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _pieces(sbp: NdSbp, hierarchy: Sequence[int], shape: Sequence[int]) -> list[tuple[tuple[int, int], ...]]:
    """Per device (row-major over ``hierarchy``), the box ``[(lo, hi) per dim]`` of the
    logical tensor it holds (a ``P`` device holds a partial of the whole box)."""
    import itertools

    out = []
    for index in itertools.product(*(range(n) for n in hierarchy)):
        box = [(0, d) for d in shape]
        for axis, v in enumerate(sbp):
            if isinstance(v, Split):
                lo, hi = box[v.dim]
                # OneFlow's BalancedSplitter: the first ``extra`` pieces one larger
                base, extra = divmod(hi - lo, hierarchy[axis])
                i = index[axis]
                start = lo + i * base + min(i, extra)
                box[v.dim] = (start, start + base + (1 if i < extra else 0))
        out.append(tuple(box))
    return out


def _volume(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> int:
    return math.prod(max(0, min(x[1], y[1]) - max(x[0], y[0])) for x, y in zip(a, b))


def _transfer(
    shape: Sequence[int], itemsize: int, src: NdSbp, src_h: Sequence[int], dst: NdSbp, dst_h: Sequence[int]
) -> tuple[float, float]:
    """(most bytes one receiving device gets, most bytes one sending device sends) for a
    tensor moved between two disjoint placements.

    With the same layout on both sides, device ``i`` sends its piece to device ``i``.  Else
    each receiving device needs the box of its layout; it gets each part of it from the
    sending devices that hold it: from every partial holder where the sender is ``P`` (the
    sum is taken on the receiver), else from one of the replicas (receiver ``j`` from
    replica ``j mod r``, which spreads the sending over the replicas)."""
    src_boxes = _pieces(src, src_h, shape)
    dst_boxes = _pieces(dst, dst_h, shape)
    if src == dst and tuple(src_h) == tuple(dst_h):
        # the same layout on the same mesh shape: device i sends its piece (a partial
        # sum too) to device i of the other placement
        most = max(math.prod(hi - lo for lo, hi in box) for box in src_boxes) * itemsize
        return float(most), float(most)
    partial = any(isinstance(v, type(P)) for v in src)
    sent: dict[int, float] = defaultdict(float)
    received = 0.0
    for j, want in enumerate(dst_boxes):
        got = 0.0
        # group the senders by the box they hold
        holders: dict[tuple[tuple[int, int], ...], list[int]] = defaultdict(list)
        for i, box in enumerate(src_boxes):
            if _volume(box, want):
                holders[box].append(i)
        for box, who in holders.items():
            n = _volume(box, want) * itemsize
            for i in who if partial else [who[j % len(who)]]:
                sent[i] += n
                got += n
        received = max(received, got)
    return received, max(sent.values(), default=0.0)


def count_boundary_traffic(job: Any) -> list[BoundaryEdge]:
    """Every data edge of ``job`` (a compiled ``nn.Graph``'s ``_compiled_job_proto``, its
    bytes or a ``.pb`` path) whose producer and consumer lie on different placements, with
    the bytes it moves per device (:func:`_transfer`, from the two ends' N-D SBPs as the job
    records them).  Edges from one-device sources (the graph's input ticks) are left out."""
    from autopar.bridges.oneflow.iteration import op_phases
    from autopar.bridges.oneflow.traffic import _JobView

    job = load_job(job)
    placement: dict[str, tuple[tuple[int, ...], list[tuple[int, int]]]] = {}
    for group in job.placement.placement_group:
        conf = group.parallel_conf
        devices: list[tuple[int, int]] = []
        for d in conf.device_name:  # "@<machine>:<first>-<last>" or "<machine>:<device>"
            machine, _, ids = d.lstrip("@").partition(":")
            lo, _, hi = ids.partition("-")
            devices.extend((int(machine), i) for i in range(int(lo), int(hi or lo) + 1))
        hierarchy = tuple(int(d) for d in conf.hierarchy.dim) or (len(devices),)
        for name in group.op_set.op_name:
            placement[name] = (hierarchy, devices)
    conf_map = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
    view = _JobView(job, (1,))
    phases = op_phases(job)
    first_rank = {name: min(devs) for name, (_, devs) in placement.items() if devs}
    edges: list[BoundaryEdge] = []
    for op in job.net.op:
        if op.name not in placement or op.name not in conf_map:
            continue
        dst_h, dst_devs = placement[op.name]
        for bn, lbn in input_bns(op, view.blob_desc):
            producer, out_bn = lbn.split("/", 1)
            if producer not in placement or producer not in conf_map:
                continue
            src_h, src_devs = placement[producer]
            if set(src_devs) == set(dst_devs) or len(src_devs) == 1:
                continue
            src_sig, dst_sig = conf_map[producer], conf_map[op.name]
            if out_bn not in src_sig.bn_in_op2nd_sbp or bn not in dst_sig.bn_in_op2nd_sbp:
                continue
            src = nd_sbp_from_proto(src_sig.bn_in_op2nd_sbp[out_bn], len(src_h))
            dst = nd_sbp_from_proto(dst_sig.bn_in_op2nd_sbp[bn], len(dst_h))
            shape, itemsize = view.blob(lbn)
            received, sent = _transfer(shape, itemsize, src, src_h, dst, dst_h)
            edges.append(
                BoundaryEdge(
                    producer, op.name, lbn, shape, itemsize, sorted(src_devs), sorted(dst_devs),
                    str(src), str(dst),
                    "once_per_step" if phases.get(op.name) == "step" else "per_micro_batch",
                    "forward" if first_rank[op.name] > first_rank[producer] else "backward",
                    received, sent,
                )
            )  # fmt: skip
    return edges
