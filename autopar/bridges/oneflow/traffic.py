"""Count the bytes a OneFlow job moves, from the job's own N-D SBP on every edge.

:func:`count_job_traffic` walks every data edge of a OneFlow ``Job`` (every op
of ``job.net.op``: the ZeRO casts, the optimizer's ``model`` / ``model_diff``
inputs, the ops autopar's import drops, OneFlow's ``System-Boxing-Middle-Identity``
hops), reads the producer's output N-D SBP and the consumer's input N-D SBP
from ``job_parallel_view_conf`` and, where they differ, prices the hop twice:

* ``bytes_per_axis``: as OneFlow 0.9 lowers it, with
  :func:`autopar.runtimes.oneflow_09.lowering.lower_hop`.  That is the same per-hop formula the
  ``oneflow-0.9`` runtime profile prices predicted boxing with, so this count is
  not independent of the model's bytes: it checks the SBPs each edge carries
  (which the compiled job, not autopar, decides), not the formula;
* ``kernel_bytes_per_axis``: with :func:`autopar.bridges.oneflow.kernel_bytes.kernel_hop_bytes`,
  a formula of its own written from OneFlow's boxing kernels and NCCL's collective
  definitions, shared with nothing autopar predicts with.  The two give every hop
  the same total; they split a flat collective (one NCCL collective over all
  devices) differently between the axes: this one as NCCL's ring sends it, which
  is what the kernels send, ``lower_hop`` as the hierarchical-schedule volumes the
  model prices with (see :mod:`autopar.bridges.oneflow.kernel_bytes`).

Nothing here calls autopar's cost model, rules or evaluator.

Use the *compiled* job (``nn.Graph._compiled_job_proto`` after
``finish_complie_and_init_runtime``): it holds the middle nodes OneFlow's
``BoxingCollector`` inserted, so every counted edge is one hop as OneFlow runs
it.  A built, uncompiled job lacks them; its multi-step transitions are then
priced as one hop (``JobTraffic.compiled`` is False and says so).  Ops that
OneFlow inserted as ``System-NCCL-Logical-*`` (GPU compiles with
``nccl_use_compute_stream``) do their own transition: the op's input and
output SBPs are priced as one hop.

An op placed on the same devices as a 1-D hierarchy (the ``Sys-Boxing-GroupIdentity``
ops of ``GroupBoxingByDstParallel`` are) is on the mesh: its 1-D SBP is that
value on every axis (``InOutParallelDimReduce``).  Edges between two
placements on different devices (a 1-device op feeding the mesh) are not
priced (OneFlow boxes them across placements); they are counted in
``JobTraffic.cross_placement_edges``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from autopar.bridges.oneflow.convert import dtype_name, input_bns, nd_sbp_from_proto, parallel_size
from autopar.bridges.oneflow.iteration import job_micro_batches, op_phases, recompute_ops, zero_gather_ops
from autopar.bridges.oneflow.jobs import load_job
from autopar.bridges.oneflow.kernel_bytes import kernel_hop_bytes
from autopar.ir.graph import DTYPE_BYTES
from autopar.ir.sbp import NdSbp
from autopar.runtimes.oneflow_09.lowering import lower_hop

__all__ = ["PHASES", "JobTraffic", "count_job_traffic", "edge_category"]

PHASES = ("per_micro_batch", "recompute", "once_per_step")
"""When a hop runs: every micro-batch, again in a recomputed block's backward, once per step."""

_MIDDLE_PREFIX = "System-Boxing-Middle-Identity"
_ZERO_PREFIX = "System-ZeRO-"
_NCCL_PREFIX = "System-NCCL-Logical"
_COMPILED_MARK = "System-EagerCriticalSection"
"""ops nn.Graph adds when it compiles a job (absent from the built job)"""


@dataclass
class JobTraffic:
    """Bytes per device that a job's own SBPs make it move, per mesh axis."""

    hierarchy: tuple[int, ...]
    compiled: bool
    """True for a compiled job (it has nn.Graph's ``System-EagerCriticalSection`` ops and
    OneFlow's middle nodes); False for a built job, whose multi-step transitions count as one hop"""
    bytes_per_axis: dict[int, float]
    bytes_per_category: dict[str, dict[int, float]]
    """``model`` (edges between model ops), ``zero_cast``, ``optimizer``, ``middle_node``, ``dropped``"""
    bytes_per_kind: dict[str, float]
    hops: int
    middle_nodes: int
    cross_placement_edges: int
    edges: list[dict[str, Any]] = field(default_factory=list)
    """the largest hops (``keep_edges`` of them): producer, consumer, port, src, dst, kind, bytes"""
    kernel_bytes_per_axis: dict[int, float] = field(default_factory=dict)
    """the same hops counted with :func:`autopar.bridges.oneflow.kernel_bytes.kernel_hop_bytes`, the
    formula of its own (OneFlow's kernels, NCCL's collective definitions): the same total as
    ``bytes_per_axis``, flat collectives split between the axes as NCCL's ring sends them
    (``bytes_per_axis``: as the model prices them)"""
    micro_batches: int = 1
    """``K``: the job's ``num_gradient_accumulation_steps``"""
    bytes_per_phase: dict[str, dict[int, float]] = field(default_factory=dict)
    """``bytes_per_axis`` by when each hop runs (:data:`PHASES`): ``per_micro_batch`` (the
    consumer runs once per micro-batch), ``recompute`` (it is a recompute copy of
    checkpointing, or a boxing op only they read), ``once_per_step`` (it runs once per
    optimizer step: downstream of an ``acc``; see :func:`autopar.bridges.oneflow.iteration.op_phases`)"""
    recompute_zero_cast_bytes: dict[int, float] = field(default_factory=dict)
    """the part of ``recompute`` that re-runs a ZeRO parameter gather (a recomputed block's
    copy of its ``System-ZeRO-ParallelCast``)"""

    def per_step_bytes(self, axis: int) -> float:
        """Bytes per device per optimizer step on ``axis``: ``K x (per_micro_batch +
        recompute) + once_per_step``."""
        get = self.bytes_per_phase.get
        micro = (get("per_micro_batch") or {}).get(axis, 0.0) + (get("recompute") or {}).get(axis, 0.0)
        return self.micro_batches * micro + (get("once_per_step") or {}).get(axis, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hierarchy": list(self.hierarchy),
            "compiled": self.compiled,
            "bytes_per_axis": {str(a): b for a, b in sorted(self.bytes_per_axis.items())},
            "kernel_bytes_per_axis": {str(a): b for a, b in sorted(self.kernel_bytes_per_axis.items())},
            "bytes_per_category": {
                c: {str(a): b for a, b in sorted(v.items())}
                for c, v in sorted(self.bytes_per_category.items())
            },
            "bytes_per_kind": dict(sorted(self.bytes_per_kind.items())),
            "hops": self.hops,
            "middle_nodes": self.middle_nodes,
            "cross_placement_edges": self.cross_placement_edges,
            "largest_edges": self.edges,
            "micro_batches": self.micro_batches,
            "bytes_per_phase": {
                ph: {str(a): b for a, b in sorted(v.items())} for ph, v in self.bytes_per_phase.items()
            },
            "recompute_zero_cast_bytes": {
                str(a): b for a, b in sorted(self.recompute_zero_cast_bytes.items())
            },
        }


def _placements(job: Any) -> dict[str, tuple[int, ...]]:
    """op name -> hierarchy of its placement (with the device list as a key suffix)."""
    out: dict[str, tuple[int, ...]] = {}
    for group in job.placement.placement_group:
        conf = group.parallel_conf
        shape = tuple(int(d) for d in conf.hierarchy.dim) or (parallel_size(conf.device_name),)
        for name in group.op_set.op_name:
            out[name] = (*shape, hash(tuple(conf.device_name)))
    return out


def edge_category(producer: str, consumer: str, consumer_is_update: bool, dropped: set[str]) -> str:
    """Which part of the job an edge belongs to (see :class:`JobTraffic`)."""
    if consumer.startswith(_MIDDLE_PREFIX) or producer.startswith(_MIDDLE_PREFIX):
        return "middle_node"
    if consumer.startswith(_ZERO_PREFIX) or producer.startswith(_ZERO_PREFIX):
        return "zero_cast"
    if consumer_is_update:
        return "optimizer"
    if consumer in dropped or producer in dropped:
        return "dropped"
    return "model"


def count_job_traffic(job: Any, *, dropped: set[str] | None = None, keep_edges: int = 20) -> JobTraffic:
    """Bytes per device per mesh axis that ``job`` (message, bytes or ``.pb`` path) moves.

    ``dropped``: op names to report under the ``dropped`` category (those
    :func:`autopar.bridges.oneflow.import_job` leaves out; computed when omitted).
    ``keep_edges``: how many of the largest hops to keep in ``JobTraffic.edges``.
    """
    from autopar.bridges.oneflow.importer import job_mesh_shape

    job = load_job(job)
    if dropped is None:
        from autopar.bridges.oneflow.importer import import_job

        meta = import_job(job).meta["oneflow"]
        dropped = {n for names in meta["dropped"].values() for n in names}
    tally = _Tally(tuple(job_mesh_shape(job)), dropped)
    tally.micro_batches = job_micro_batches(job)
    tally.phases, tally.recompute = op_phases(job), recompute_ops(job)
    tally.zero_gathers = zero_gather_ops(job)
    view = _JobView(job, tally.hierarchy)
    for op in job.net.op:
        if op.name.startswith(_MIDDLE_PREFIX):
            tally.middle += 1
        if view.on_main(op.name) and op.name in view.conf:
            _count_op(op, view, tally)
    return tally.result(any(op.name.startswith(_COMPILED_MARK) for op in job.net.op), keep_edges)


class _JobView:
    """What the counter reads of a job: blob shapes, each op's N-D SBP and placement."""

    def __init__(self, job: Any, hierarchy: tuple[int, ...]) -> None:
        self.ndim = len(hierarchy)
        self.blob_desc = job.helper.lbn2logical_blob_desc
        self.conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
        self.placement = _placements(job)
        self.main = next((pl for pl in self.placement.values() if pl[:-1] == tuple(hierarchy)), None)

    def sbp_of(self, op_name: str, bn: str) -> NdSbp | None:
        sig = self.conf.get(op_name) if op_name in self.conf else None
        if sig is None or bn not in sig.bn_in_op2nd_sbp:
            return None
        return nd_sbp_from_proto(sig.bn_in_op2nd_sbp[bn], self.ndim)

    def on_main(self, op_name: str) -> bool:
        """On the main placement, or the same devices as a 1-D hierarchy (OneFlow places the
        ``Sys-Boxing-GroupIdentity`` of a boxing so): its 1-D SBP is that value on every axis."""
        pl, main = self.placement.get(op_name), self.main
        if pl is None or main is None:
            return False
        return pl == main or (pl[-1] == main[-1] and len(pl) == 2 and pl[0] == math.prod(main[:-1]))

    def blob(self, lbn: str) -> tuple[list[int], int]:
        """Shape and bytes per element of logical blob ``lbn``."""
        desc = self.blob_desc[lbn]
        enum = desc.DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_number[desc.data_type].name
        return [int(d) for d in desc.shape.dim], DTYPE_BYTES[dtype_name(enum, f"blob {lbn!r}")]


@dataclass
class _Tally:
    """Running sums of :func:`count_job_traffic`."""

    hierarchy: tuple[int, ...]
    dropped: set[str]
    per_axis: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    per_axis_kernel: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    per_cat: dict[str, dict[int, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    per_kind: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    hops: int = 0
    middle: int = 0
    cross: int = 0
    edges: list[dict[str, Any]] = field(default_factory=list)
    micro_batches: int = 1
    phases: dict[str, str] = field(default_factory=dict)
    recompute: set[str] = field(default_factory=set)
    zero_gathers: set[str] = field(default_factory=set)
    per_phase: dict[str, dict[int, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    recompute_zero: dict[int, float] = field(default_factory=lambda: defaultdict(float))

    def phase(self, consumer: str) -> str:
        """When the hop into ``consumer`` runs (:data:`PHASES`)."""
        if consumer in self.recompute:
            return "recompute"
        return "once_per_step" if self.phases.get(consumer) == "step" else "per_micro_batch"

    def add(
        self, edge: tuple[str, str, str], view: _JobView, lbn: str, src: NdSbp, dst: NdSbp, update: bool
    ) -> None:
        """Count the hop ``src -> dst`` of blob ``lbn`` on ``edge`` (producer, consumer, port)
        with both byte formulas (``lower_hop`` and :func:`kernel_hop_bytes`)."""
        producer, consumer, port = edge
        shape, itemsize = view.blob(lbn)
        hop = lower_hop(shape, itemsize, src, dst, self.hierarchy)
        kernel = kernel_hop_bytes(shape, itemsize, src, dst, self.hierarchy)
        for a, b in kernel.items():
            self.per_axis_kernel[a] += b
        if hop.total_bytes <= 0:
            return
        self.hops += 1
        cat = edge_category(producer, consumer, update, self.dropped)
        phase = self.phase(consumer)
        for a, b in hop.bytes_per_axis.items():
            self.per_axis[a] += b
            self.per_cat[cat][a] += b
            self.per_phase[phase][a] += b
            if phase == "recompute" and consumer in self.zero_gathers:
                self.recompute_zero[a] += b
        self.per_kind[hop.kind] += hop.total_bytes
        self.edges.append(
            {
                "producer": producer,
                "consumer": consumer,
                "port": port,
                "shape": shape,
                "src": str(src),
                "dst": str(dst),
                "kind": f"{hop.kind} ({hop.scope})",
                "category": cat,
                "phase": phase,
                "zero_gather": consumer in self.zero_gathers,
                "bytes": hop.total_bytes,
                "bytes_per_axis": {str(a): b for a, b in sorted(hop.bytes_per_axis.items())},
                "kernel_bytes_per_axis": {str(a): b for a, b in sorted(kernel.items())},
            }
        )

    def result(self, compiled: bool, keep_edges: int) -> JobTraffic:
        ndim = len(self.hierarchy)
        self.edges.sort(key=lambda e: -e["bytes"])
        return JobTraffic(
            tuple(self.hierarchy),
            compiled,
            {a: self.per_axis.get(a, 0.0) for a in range(ndim)},
            {c: {a: v.get(a, 0.0) for a in range(ndim)} for c, v in self.per_cat.items()},
            dict(self.per_kind),
            self.hops,
            self.middle,
            self.cross,
            self.edges[:keep_edges],
            {a: self.per_axis_kernel.get(a, 0.0) for a in range(ndim)},
            self.micro_batches,
            {ph: {a: self.per_phase.get(ph, {}).get(a, 0.0) for a in range(ndim)} for ph in PHASES},
            {a: self.recompute_zero.get(a, 0.0) for a in range(ndim)},
        )


def _count_op(op: Any, view: _JobView, tally: _Tally) -> None:
    """Count the hops into ``op``: its data inputs, or its own transition for a
    ``System-NCCL-Logical-*`` op (the op itself does it)."""
    if op.name.startswith(_NCCL_PREFIX):
        src, dst = view.sbp_of(op.name, "in_0"), view.sbp_of(op.name, "out_0")
        (lbn,) = op.user_conf.input["in"].s
        if src is not None and dst is not None and src != dst:
            tally.add((op.name, op.name, "in_0"), view, lbn, src, dst, False)
        return
    update = (
        op.WhichOneof("op_type") == "user_conf"
        and "model" in op.user_conf.input
        and "model_diff" in op.user_conf.input
    )
    for bn, lbn in input_bns(op, view.blob_desc):
        producer, out_bn = lbn.split("/", 1)
        if not view.on_main(producer):
            tally.cross += view.placement.get(producer) is not None
            continue
        src, dst = view.sbp_of(producer, out_bn), view.sbp_of(op.name, bn)
        if src is None or dst is None or src == dst:
            continue
        tally.add((producer, op.name, bn), view, lbn, src, dst, update)
