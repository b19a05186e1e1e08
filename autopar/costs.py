"""Cost model and cost tables.

Per op and N-D signature (pure functions, seconds):

* ``CostKind.MATMUL``: :func:`gemm_time` of the GEMM one device runs under the
  signature (:func:`local_gemm`: ``batch, m, n, k`` of its shard): a roofline whose
  compute side is ``peak_flops * matmul_efficiency`` (a large GEMM's measured
  fraction) scaled down when the GEMM has fewer output tiles than the device has SMs,
  and whose memory side binds thin GEMMs; times :func:`uneven_share` when a split does
  not divide (the device with the largest shard finishes last);
* ``CostKind.MEMORY``: :func:`memory_time` of ``local input bytes + local output bytes``
  (``/ (memory_bandwidth * memory_efficiency)``, a streaming kernel's measured
  fraction; local = the largest shard, :func:`autopar.sbp.local_shape`);
* ``CostKind.FREE``: 0 (views, variables, ticks);
* optimizer ops (role ``optimizer``) additionally pay ZeRO's parameter
  all-gathers: boxing of the parameter (in its forward copy's dtype,
  :func:`zero_gather_dtype`) from the gradient's
  SBP to the parameter's, once after the update under ZeRO-1/2, twice (before
  forward and before backward) under ZeRO-3; 0 when the layouts are equal.

``work_share`` is the product of the sizes of the mesh axes on which some port
is split (an axis where every port is ``B`` or ``P`` repeats the work).

Per edge (producer output port -> consumer input port): boxing time from the
producer's output N-D SBP to the consumer's input N-D SBP as the runtime
profile lowers it (:mod:`autopar.runtime`, :mod:`autopar.boxing`), classified
by :func:`edge_kind` and priced by :func:`edge_time` (a ``like`` port, which lends
only its shape, is free under the ideal lowering and boxed as any input under
OneFlow 0.9's, as OneFlow boxes it).  An edge carrying a
weight gradient is a gradient reduction: frameworks bucket those, so its
per-step latency is scaled by ``min(1, bytes / bucket)`` (:func:`bucketed_time`).

The tables built from this model (one entry per unique op and edge, memo keys
with :func:`model_digest` and the runtime profile, serialisation, the process
pool) live in :mod:`autopar.cost_tables`.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from autopar.boxing import BoxingPlan, boxing_plan, send_recv_time, step_latency
from autopar.cluster import AxisLink, Cluster, DeviceSpec, Mesh
from autopar.content_key import python_sources, source_digest
from autopar.graph import DTYPE_BYTES, Graph, Op, Role, TensorSpec
from autopar.optimizer import (
    IN_PLACE_PORTS,
    grad_port_index,
    model_port_index,
    state_count,
)
from autopar.ports import base_name
from autopar.rules.registry import (
    CostKind,
    Rule,
    RuleContext,
    RuleSet,
    fallback_signatures,
    nd_signatures,
    work_share,
)
from autopar.runtime import Lowering, RuntimeProfile
from autopar.sbp import NdSbp, Signature, is_even, local_shape

__all__ = [
    "COST_MODEL_VERSION",
    "EdgeKind",
    "boundary_bytes_per_device",
    "bucketed_time",
    "edge_kind",
    "edge_time",
    "gemm_efficiency",
    "gemm_time",
    "local_gemm",
    "matmul_time",
    "memory_time",
    "model_digest",
    "op_compute_time",
    "op_signatures",
    "optimizer_gather_plan",
    "optimizer_gather_time",
    "receive_time",
    "rule_context",
    "stage_boundary_link",
    "uneven_share",
    "zero_gather_dtype",
]

COST_MODEL_VERSION = "2"

_MODEL_SOURCES = (
    "boxing.py", "cluster.py", "cost_tables.py", "costs.py", "graph.py", "memory.py", "optimizer.py",
    "runtime.py", "sbp.py", "rules",
)  # fmt: skip
"""Files and folders of :mod:`autopar` whose code can change a cost table entry."""


def model_digest(root: str | None = None) -> str:
    """SHA-256 (hex, 16 chars) of every source file that can change a cost.

    Part of every cost-table key, so a changed rule, boxing or cost formula
    misses entries written by older code instead of serving them.
    """
    if root is None and _DIGEST_CACHE:
        return _DIGEST_CACHE[0]
    base = Path(root or os.path.dirname(os.path.abspath(__file__)))
    digest = source_digest(base, python_sources(base, _MODEL_SOURCES))
    if root is None:
        _DIGEST_CACHE.append(digest)
    return digest


_DIGEST_CACHE: list[str] = []


def optimizer_update_bytes(param_itemsize: int, grad_itemsize: int, states: int) -> int:
    """Memory traffic of an elementwise optimizer update per local element, bytes.

    Reads the parameter, the gradient and each state, writes the parameter and
    each state: ``2 * param + grad + 2 * states * param``.  Adam on float32:
    ``8 + 4 + 16 = 28``.  Source: the update kernels read and write every
    operand once (OneFlow ``adam_update`` kernel).
    """
    return 2 * param_itemsize + grad_itemsize + 2 * states * param_itemsize


# ------------------------------------------------------------------ per op


def rule_context(
    graph: Graph, op: Op, mesh_shape: Sequence[int], zero_stage: int, zero_sharding: str = "all_axes"
) -> RuleContext:
    return RuleContext(
        op=op,
        inputs=tuple(graph.tensors[t] for t in op.inputs.values()),
        outputs=tuple(graph.tensors[t] for t in op.outputs.values()),
        mesh_shape=tuple(mesh_shape),
        zero_stage=zero_stage,
        zero_sharding=str(getattr(zero_sharding, "value", zero_sharding)),
        gather_dtype=zero_gather_dtype(graph, op),
    )


_SIGNATURE_MEMO_SIZE = 8192
_signature_memo: dict[tuple[Any, ...], tuple[RuleSet, list[Signature], bool, frozenset[Signature]]] = {}


def op_signatures(rules: RuleSet, ctx: RuleContext) -> tuple[list[Signature], bool]:
    """Valid N-D signatures of the op and whether the all-``B`` fallback was used.

    Memoised by content (op type, role, attrs, ports, shapes, dtypes, mesh shape, ZeRO
    stage; not the op's name): the same op of identical layers is enumerated once.
    """
    hit = _memoised_signatures(rules, ctx)
    return list(hit[1]), hit[2]


def op_signature_set(rules: RuleSet, ctx: RuleContext) -> tuple[frozenset[Signature], bool]:
    """:func:`op_signatures` as a set (for membership tests), built once per distinct op."""
    hit = _memoised_signatures(rules, ctx)
    return hit[3], hit[2]


def _memoised_signatures(
    rules: RuleSet, ctx: RuleContext
) -> tuple[RuleSet, list[Signature], bool, frozenset[Signature]]:
    op = ctx.op
    key = (
        id(rules),
        op.type,
        op.role,
        json.dumps(op.attrs, sort_keys=True, default=str),
        tuple(op.inputs),
        tuple(op.outputs),
        tuple((t.shape, t.dtype) for t in ctx.inputs),
        tuple((t.shape, t.dtype) for t in ctx.outputs),
        tuple(ctx.mesh_shape),
        ctx.zero_stage,
        ctx.zero_sharding,
    )
    hit = _signature_memo.get(key)
    if hit is not None and hit[0] is rules:
        return hit
    sigs, fallback = _enumerate_signatures(rules, ctx)
    if len(_signature_memo) >= _SIGNATURE_MEMO_SIZE:
        _signature_memo.pop(next(iter(_signature_memo)))
    hit = _signature_memo[key] = (rules, sigs, fallback, frozenset(sigs))
    return hit


def _enumerate_signatures(rules: RuleSet, ctx: RuleContext) -> tuple[list[Signature], bool]:
    rule = rules.get(ctx.op.type)
    if rule is None:
        return fallback_signatures(ctx), True
    sigs = nd_signatures(rule, ctx)
    if not sigs:
        # the rule offers nothing that fits these shapes: replicate rather than fail
        return fallback_signatures(ctx), True
    return sigs, False


def _local_bytes(specs: Sequence[TensorSpec], sbps: Sequence[NdSbp], mesh_shape: Sequence[int]) -> float:
    total = 0.0
    for spec, sbp in zip(specs, sbps):
        local = local_shape(spec.shape, sbp, mesh_shape)
        numel = math.prod(local) if local is not None else spec.numel
        total += numel * DTYPE_BYTES[spec.dtype]
    return total


def uneven_share(ctx: RuleContext, sig: Signature, mesh_shape: Sequence[int]) -> float:
    """The largest shard over the even share, the most over the op's ports: 1 when every
    split divides (exactly), ``ceil(d / n) / (d / n)`` for one uneven split of ``d`` over
    ``n`` (OneFlow's ``BalancedSplitter``, :func:`autopar.sbp.shard_numel`).  Unitless."""
    worst = 1.0
    for spec, sbp in zip((*ctx.inputs, *ctx.outputs), (*sig.inputs, *sig.outputs)):
        local = None if is_even(spec.shape, sbp, mesh_shape) else local_shape(spec.shape, sbp, mesh_shape)
        if local is not None:  # uneven and accepted: its largest shard over the even share
            worst = max(worst, math.prod(local) / (spec.numel / sbp.split_factor(mesh_shape)))
    return worst


GEMM_TILE = 128
"""Rows (and columns) of the output tile one thread block of a GEMM computes, elements.

NVIDIA, "Matrix Multiplication Background User's Guide" (DU-09799-001, 2023), section 2.3
"Typical Tile Dimensions in cuBLAS and Performance": cuBLAS tiles are 256x128, 128x256,
128x128 down to 64x64; 128x128 is the middle of that range."""


@functools.lru_cache(maxsize=1 << 16)
def gemm_time(dev: DeviceSpec, batch: int, m: int, n: int, k: int, itemsize: int) -> float:
    """Seconds of ``batch`` GEMMs ``[m, k] x [k, n]`` on one device: a roofline with a fill term.

    ``t = max(2 batch m n k / (peak_flops x matmul_efficiency x fill),
    batch (m k + k n + m n) itemsize / (memory_bandwidth x memory_efficiency))``

    * the compute term: ``matmul_efficiency`` is what a large, well-shaped GEMM reaches (the
      preset's kernel measurement, ``autopar/profiles``);
    * ``fill = min(1, tiles / compute_units)`` with ``tiles = batch ceil(m / T) ceil(n / T)``,
      ``T`` = :data:`GEMM_TILE`: a GEMM of fewer output tiles than the device has SMs leaves
      the others idle (NVIDIA "Matrix Multiplication Background", sections 2.1 and 3.2, wave
      quantization: one thread block per tile, one tile per SM at a time).  Only the first,
      partial wave is charged: past it cuBLAS's heuristics pick among tile shapes and
      split-K, which a one-tile quantization would overstate.  ``compute_units = 0``: 1;
    * the memory term: reading both operands and writing the result once (NVIDIA "GPU
      Performance Background User's Guide", section 4 "Understanding Performance":
      arithmetic intensity ``2 m n k / ((m k + k n + m n) bytes)`` against the device's
      ops:byte ratio); it binds for thin GEMMs (one of ``m``, ``n``, ``k`` small).

    Units: elements for ``m, n, k``, bytes for ``itemsize``, FLOP/s and bytes/s in ``dev``.
    Cached per (device, shape, itemsize): a cost table asks for the same shapes per layer.
    """
    flops = 2.0 * batch * m * n * k
    fill = 1.0
    if dev.compute_units > 0:
        tiles = batch * math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
        fill = min(1.0, tiles / dev.compute_units)
    compute = flops / (dev.peak_flops * dev.matmul_efficiency * fill)
    moved = float(batch) * (m * k + k * n + m * n) * itemsize
    return max(compute, memory_time(dev, moved))


def gemm_efficiency(dev: DeviceSpec, batch: int, m: int, n: int, k: int, itemsize: int = 2) -> float:
    """Achieved fraction of ``peak_flops`` of :func:`gemm_time`'s GEMMs: ``2 batch m n k /
    (t x peak_flops)``, in (0, ``matmul_efficiency``]; unitless."""
    return 2.0 * batch * m * n * k / (gemm_time(dev, batch, m, n, k, itemsize) * dev.peak_flops)


def memory_time(dev: DeviceSpec, moved_bytes: float) -> float:
    """Seconds to stream ``moved_bytes`` (read + written) through device memory:
    ``bytes / (memory_bandwidth x memory_efficiency)``, the roofline of a memory-bound kernel
    with the preset's measured fraction of the HBM bandwidth (``autopar/profiles``)."""
    return moved_bytes / (dev.memory_bandwidth * dev.memory_efficiency)


BATCHED_GEMM_OPS = frozenset({"batch_matmul"})
"""Matmul-like ops whose leading output dims are separate GEMMs (a strided batched GEMM);
the others fold their leading dims into the rows (one GEMM, the weight read once)."""


def local_gemm(ctx: RuleContext, sig: Signature, mesh_shape: Sequence[int], flops: float) -> tuple[int, ...]:
    """``(batch, m, n, k)`` of the GEMM one device runs for matmul-like ``ctx.op`` under ``sig``.

    ``m``, ``n`` (and ``batch`` for :data:`BATCHED_GEMM_OPS`) from the output's local shape
    (the largest shard, :func:`autopar.sbp.local_shape`); ``k`` = the contracted length
    ``flops / (2 numel(out))`` (the rule's logical FLOPs) divided by the devices that split
    it: ``work_share / split factor of the output``.
    """
    out, out_sbp = ctx.outputs[0], sig.outputs[0]
    local = local_shape(out.shape, out_sbp, mesh_shape) or out.shape
    split_out = out_sbp.split_factor(mesh_shape)
    k = max(1, round(flops / (2.0 * max(1, out.numel)) * split_out / work_share(sig, mesh_shape)))
    dims = tuple(int(d) for d in local) or (1,)
    if len(dims) == 1:
        return 1, 1, dims[0], k
    if ctx.op.type in BATCHED_GEMM_OPS:
        return math.prod(dims[:-2]), dims[-2], dims[-1], k
    return 1, math.prod(dims[:-1]), dims[-1], k


def matmul_time(
    ctx: RuleContext, sig: Signature, mesh_shape: Sequence[int], dev: DeviceSpec, flops: float
) -> float:
    """Seconds of matmul-like ``ctx.op`` under ``sig``: :func:`gemm_time` of its local GEMM
    (:func:`local_gemm`), in the output's dtype, times the unevenness the output's shard
    does not already carry (:func:`uneven_share` over the output's own)."""
    batch, m, n, k = local_gemm(ctx, sig, mesh_shape, flops)
    out, out_sbp = ctx.outputs[0], sig.outputs[0]
    time = gemm_time(dev, batch, m, n, k, DTYPE_BYTES[out.dtype])
    even_out = out.numel / out_sbp.split_factor(mesh_shape)
    out_uneven = batch * m * n / even_out if even_out > 0 else 1.0
    return time * max(1.0, uneven_share(ctx, sig, mesh_shape) / max(1.0, out_uneven))


def receive_time(ctx: RuleContext, sig: Signature, mesh: Mesh) -> float:
    """Seconds a pipeline stage spends receiving a tensor of another stage (a ``pipeline_recv``
    op, :mod:`autopar.pipeline_split`): ``alpha + (numel x itemsize / f) / beta``, where ``f``
    is the number of pieces the receiving layout cuts the tensor into: each device receives
    its piece, the sending stage's devices share the sending (Megatron-LM's scatter-gather of
    pipeline tensors: each of ``t`` tensor-parallel ranks sends ``1/t``).  alpha, beta: the
    link between stages, across nodes when the op's ``crosses_nodes`` attr is true
    (:func:`autopar.boxing.send_recv_time`).  0 for a once-per-step tensor (attr ``per`` =
    ``step``, a tied parameter's gradient included: priced by
    :func:`autopar.pipeline.evaluate_pipeline`, as the runtime moves it)."""
    if not ctx.outputs or ctx.attrs.get("per") == "step":
        return 0.0
    spec = ctx.outputs[0]
    piece = boundary_bytes_per_device(spec.numel, spec.dtype, sig.outputs[0], mesh.shape)
    return send_recv_time(piece, stage_boundary_link(mesh.cluster, bool(ctx.attrs.get("crosses_nodes"))))


def boundary_bytes_per_device(numel: int, dtype: str, receiver: NdSbp, receiver_mesh: Sequence[int]) -> float:
    """Bytes a device of the receiving stage gets for one tensor crossing pipeline stages:
    ``numel * itemsize / f``, ``f`` the pieces its layout cuts the tensor into (the sending
    stage's devices share the sending: Megatron-LM's scatter-gather of pipeline tensors)."""
    return numel * DTYPE_BYTES[dtype] / receiver.split_factor(receiver_mesh)


def stage_boundary_link(cluster: Cluster, crosses_nodes: bool) -> AxisLink:
    """The link between a device of one pipeline stage and its peer in the next: the
    inter-node link (its measured fits, if any) or the intra-node one."""
    dev = cluster.device
    if crosses_nodes:
        return AxisLink(2, dev.inter_node_bandwidth, dev.inter_node_latency, True, cluster.links.inter_node)
    return AxisLink(2, dev.intra_node_bandwidth, dev.intra_node_latency, False, cluster.links.intra_node)


def op_compute_time(
    rule: Rule | None, ctx: RuleContext, sig: Signature, mesh: Mesh, lowering: str = "ideal"
) -> float:
    """Seconds of compute for ``ctx.op`` under ``sig`` (formulas in the module docstring)."""
    dev = mesh.cluster.device
    if ctx.op.role is Role.OPTIMIZER and ctx.op.type not in ("variable", "input", "output"):
        t = 0.0
        if ctx.inputs:
            # the gradient port decides the local slice each device updates
            grad_index = grad_port_index(ctx.op)
            spec = ctx.inputs[grad_index]
            local = local_shape(spec.shape, sig.inputs[grad_index], mesh.shape)
            numel = math.prod(local) if local is not None else spec.numel
            model_index = model_port_index(ctx.op)
            param = ctx.inputs[model_index] if model_index is not None else spec
            per_element = optimizer_update_bytes(
                DTYPE_BYTES[param.dtype], DTYPE_BYTES[spec.dtype], state_count(ctx.op.type, ctx.op.attrs)
            )
            t += memory_time(dev, float(numel * per_element))
        return t + optimizer_gather_time(ctx, sig, mesh, lowering)
    kind = rule.cost if rule is not None else CostKind.MEMORY
    if kind is CostKind.FREE:
        return 0.0
    if kind is CostKind.RECEIVE:
        return receive_time(ctx, sig, mesh)
    if kind is CostKind.MATMUL and rule is not None and rule.flops is not None:
        return matmul_time(ctx, sig, mesh.shape, dev, rule.flops(ctx))
    moved = _local_bytes(ctx.inputs, sig.inputs, mesh.shape) + _local_bytes(
        ctx.outputs, sig.outputs, mesh.shape
    )
    return memory_time(dev, moved)


def zero_gathers_per_step(zero_stage: int) -> int:
    """Parameter all-gathers per step under ZeRO: 1 after the update (stages 1-2); 2 under
    ZeRO-3, which keeps parameters sharded and gathers them before forward and again
    before backward.  Source: ZeRO paper section 7.2 (ZeRO-3 moves 3 Psi vs 2 Psi)."""
    return 2 if zero_stage >= 3 else 1


ZERO_GATHER_PASS_THROUGH = frozenset({"cast", "identity", "amp_white_identity"})
"""Ops a ZeRO gather moves past when each is its tensor's sole forward reader
(:func:`zero_gather_dtype`)."""


def zero_gather_dtype(graph: Graph, op: Op) -> str | None:
    """The dtype optimizer op ``op``'s parameter is all-gathered in under ZeRO (None: not an
    optimizer op with a parameter port).

    The dtype of the parameter's forward copy: follow the variable's tensor while its sole
    reader outside the optimizer is a one-input, one-output op of
    :data:`ZERO_GATHER_PASS_THROUGH` (AMP's ``cast`` to float16 / bfloat16); the dtype of
    the last tensor reached.  A parameter read by two ops (or by none of those) is gathered
    in its own dtype.  Bytes moved per element: ``DTYPE_BYTES[dtype]`` (2 for a float16 or
    bfloat16 copy, 4 for a float32 parameter read as it is).

    Sources: OneFlow 0.9 ``optimizer_placement_optimization_pass.cpp`` runs after
    ``AutoMixedPrecision`` (``job_build_and_infer_ctx.cpp`` L987-990, v0.9.0) and walks
    "vairable -> cast_fp32_to_fp16" (``GetDataParallelVariableAndNaiveSuccNode`` L92-129:
    while a node has one out edge, the next has one input and one output, both with a
    ``B`` axis); ``SetNdSbp4Consumers`` (L161-198) puts ``System-ZeRO-ParallelCast``
    after the LAST node of that sequence (``ShardSequence`` L417-442: the cast supports the
    split layout, so the sequence keeps it), i.e. on the float16 copy.  Checked on a
    compiled ZeRO-2 job on 4 CPU ranks (``tests/oneflow/test_amp_gather.py``).
    Megatron-LM's distributed optimizer all-gathers the bf16 / fp16 model parameters (its
    ``param_and_grad_buffer``), the fp32 main copy staying sharded; DeepSpeed ZeRO-1/2
    all-gathers the fp16 parameters the same way."""
    model_index = model_port_index(op) if op.role is Role.OPTIMIZER else None
    if model_index is None:
        return None
    tensor = list(op.inputs.values())[model_index]
    while True:
        readers = [
            c for c, _ in graph.consumers.get(tensor, []) if graph.op_by_name[c].role is not Role.OPTIMIZER
        ]
        if len(readers) != 1:
            break
        reader = graph.op_by_name[readers[0]]
        if reader.type not in ZERO_GATHER_PASS_THROUGH or len(reader.inputs) != 1 or len(reader.outputs) != 1:
            break
        tensor = next(iter(reader.outputs.values()))
    return graph.tensors[tensor].dtype


def optimizer_gather_plan(
    ctx: RuleContext, sig: Signature, mesh: Mesh, lowering: str = "ideal"
) -> BoxingPlan | None:
    """One ZeRO all-gather of the parameter, or None when there is none.

    Boxing of the parameter from the gradient's layout (sharded over the data-parallel
    axes under ZeRO >= 1) back to the parameter's layout, in the dtype of the forward's
    copy (``ctx.gather_dtype``, :func:`zero_gather_dtype`: float16 / bfloat16 under mixed
    precision; the parameter's own dtype when unknown).  Bytes: ``numel x
    DTYPE_BYTES[gather dtype]``.  None when both layouts agree (ZeRO stage 0).  It runs
    :func:`zero_gathers_per_step` times per step.
    Source: ZeRO paper section 7 (ZeRO-2 traffic = reduce-scatter + all-gather).
    """
    model_index = model_port_index(ctx.op)
    if model_index is None:
        return None
    grad_index = grad_port_index(ctx.op)
    src, dst = sig.inputs[grad_index], sig.inputs[model_index]
    if src == dst:
        return None
    param = ctx.inputs[model_index]
    itemsize = DTYPE_BYTES[ctx.gather_dtype or param.dtype]
    return boxing_plan(param.shape, itemsize, src, dst, mesh, lowering)


def optimizer_gather_time(ctx: RuleContext, sig: Signature, mesh: Mesh, lowering: str = "ideal") -> float:
    """Seconds per step of :func:`optimizer_gather_plan` (0 when there is no gather)."""
    plan = optimizer_gather_plan(ctx, sig, mesh, lowering)
    return 0.0 if plan is None else plan.time_s * zero_gathers_per_step(ctx.zero_stage)


def bucketed_time(plan: BoxingPlan, tensor_bytes: float, bucket_bytes: int, mesh: Mesh) -> float:
    """Seconds of a gradient reduction when gradients are reduced in buckets.

    ``time - latency * (1 - min(1, tensor_bytes / bucket_bytes))``: a tensor
    that fills a fraction ``f`` of a bucket pays ``f`` of the bucket's
    collective latency, so the sum over gradients is one latency per bucket.
    ``bucket_bytes = 0``: no bucketing.  Source: PyTorch DDP (``bucket_cap_mb``),
    DeepSpeed ``reduce_bucket_size``.
    """
    if bucket_bytes <= 0 or not plan.steps:
        return plan.time_s
    share = min(1.0, tensor_bytes / bucket_bytes)
    latency = sum(step_latency(s, mesh) for s in plan.steps)
    return plan.time_s - latency * (1.0 - share)


# ------------------------------------------------------------------ edges


class EdgeKind(str, Enum):
    """How an edge into an op's input port is costed."""

    BOXING = "boxing"
    """Data flows: boxing time from the producer's SBP to the consumer's."""
    SHAPE_ONLY = "shape_only"
    """The port only lends its shape (``like`` of ``reduce_sum_like``, ``ones_like`` ...): free
    under the ideal lowering.  OneFlow 0.9 boxes it as any other input (:func:`edge_kind`)."""
    IN_PLACE = "in_place"
    """The op updates the tensor in place (optimizer ``model``): the layouts must be equal,
    any other pair is forbidden (``inf``)."""
    GRADIENT = "gradient"
    """A weight gradient on its way to the optimizer: boxing with bucketed latency
    (:func:`bucketed_time`), overlappable with the backward pass."""


SHAPE_ONLY_PORTS = frozenset({"like"})


def edge_kind(op: Op, port: str, gradient: bool = False, lowering: str = Lowering.IDEAL.value) -> EdgeKind:
    """Classify the edge into ``op``'s input ``port`` (the one place that forbids layout changes).

    ``gradient``: the tensor is on a weight gradient's path to its optimizer
    (:func:`autopar.optimizer.weight_gradient_path`); so is the optimizer's
    ``model_diff`` port.  ``lowering``: the runtime's (:class:`autopar.runtime.Lowering`
    value).  A ``like`` port is shape-only (free) under the ideal lowering; OneFlow 0.9
    boxes it as any other input: the op's SBP signature gives ``like`` a layout of its
    own (``oneflow/user/ops/split_like_op.cpp`` ``GetSbp``: ``S(i)``, ``B`` or ``P``,
    e.g. ``(in P, like B) -> P``) and the boxing of an input blob is inserted whatever
    the kernel reads of it (``InsertNcclLogicalOpPass`` walks every op edge; the
    compiled LLaMA job of ``benchmarks/heldout_truth.py`` carries ``(S(0), P) -> (S(0), B)``
    and ``(S(0), S(3)) -> (S(0), B)`` into ``split_like``'s ``like`` ports).
    """
    base = base_name(port)
    if base in SHAPE_ONLY_PORTS and lowering != Lowering.ONEFLOW_0_9.value:
        return EdgeKind.SHAPE_ONLY
    if op.role is Role.OPTIMIZER and base in IN_PLACE_PORTS:
        return EdgeKind.IN_PLACE
    if gradient or (op.role is Role.OPTIMIZER and base == "model_diff"):
        return EdgeKind.GRADIENT
    return EdgeKind.BOXING


def edge_time(
    spec: TensorSpec, src: NdSbp, dst: NdSbp, mesh: Mesh, kind: EdgeKind, runtime: RuntimeProfile
) -> tuple[float, BoxingPlan | None]:
    """Seconds of one edge and the boxing behind it (None when nothing moves).

    The one place an edge is priced: shape-only ports are free, in-place ports
    forbid any change (``inf``), gradient edges are bucketed, the rest is boxing
    as ``runtime`` lowers it.
    """
    if src == dst or kind is EdgeKind.SHAPE_ONLY:
        return 0.0, None
    if kind is EdgeKind.IN_PLACE:
        return math.inf, None
    plan = boxing_plan(spec.shape, DTYPE_BYTES[spec.dtype], src, dst, mesh, runtime.lowering.value)
    if kind is EdgeKind.GRADIENT and plan.feasible:
        return bucketed_time(
            plan, spec.numel * DTYPE_BYTES[spec.dtype], runtime.grad_bucket_bytes, mesh
        ), plan
    return plan.time_s, plan
