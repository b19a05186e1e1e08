"""Compute cost: an op's valid signatures and its seconds under each (pure functions).

Per op and N-D signature:

* ``CostKind.MATMUL``: :func:`~autopar.hardware.kernels.gemm_time` of the GEMM one device runs under the
  signature (:func:`local_gemm`: ``batch, m, n, k`` of its shard): a roofline whose
  compute side is ``peak_flops * matmul_efficiency`` (a large GEMM's measured
  fraction) scaled down when the GEMM has fewer output tiles than the device has SMs,
  and whose memory side binds thin GEMMs; times :func:`uneven_share` when a split does
  not divide (the device with the largest shard finishes last);
* ``CostKind.MEMORY``: :func:`~autopar.hardware.kernels.memory_time` of ``local input bytes +
  local output bytes`` (``/ (memory_bandwidth * memory_efficiency)``, a streaming kernel's measured
  fraction; local = the largest shard, :func:`autopar.ir.sbp.local_shape`);
* ``CostKind.FREE``: 0 (views, variables, ticks);
* optimizer ops (role ``optimizer``) additionally pay ZeRO's parameter
  all-gathers: boxing of the parameter (in its forward copy's dtype,
  :func:`~autopar.cost.zero_gathers.zero_gather_dtype`) from the gradient's
  SBP to the parameter's, once after the update under ZeRO-1/2, twice (before
  forward and before backward) under ZeRO-3; 0 when the layouts are equal.

``work_share`` is the product of the sizes of the mesh axes on which some port
is split (an axis where every port is ``B`` or ``P`` repeats the work).

Edges are priced in :mod:`autopar.cost.edges`, ZeRO's gathers in
:mod:`autopar.cost.zero_gathers`; the tables built from this model (one entry per unique op
and edge, content keys, the process pool) in :mod:`autopar.cost.build_tables`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from autopar.cost.fusion import KERNEL_ATTR, fused_compute_time
from autopar.cost.zero_gathers import optimizer_gather_time, zero_gather_dtype
from autopar.hardware.cluster import Cluster
from autopar.hardware.collectives import send_recv_time
from autopar.hardware.devices import DeviceSpec
from autopar.hardware.kernels import gemm_time, memory_time
from autopar.hardware.mesh import AxisLink, Mesh, node_boundary_link
from autopar.ir.graph import DTYPE_BYTES, Graph, Op, Role, TensorSpec
from autopar.ir.optimizer import grad_port_index, model_port_index, state_count
from autopar.ir.sbp import NdSbp, Signature, is_even, local_shape
from autopar.rules.registry import (
    CostKind,
    Rule,
    RuleContext,
    RuleSet,
    fallback_signatures,
    nd_signatures,
    work_share,
)

__all__ = [
    "boundary_bytes_per_device",
    "local_gemm",
    "matmul_time",
    "op_compute_time",
    "op_signatures",
    "receive_time",
    "rule_context",
    "stage_boundary_link",
    "uneven_share",
]


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
    ``n`` (OneFlow's ``BalancedSplitter``, :func:`autopar.ir.sbp.shard_numel`).  Unitless."""
    worst = 1.0
    for spec, sbp in zip((*ctx.inputs, *ctx.outputs), (*sig.inputs, *sig.outputs)):
        local = None if is_even(spec.shape, sbp, mesh_shape) else local_shape(spec.shape, sbp, mesh_shape)
        if local is not None:  # uneven and accepted: its largest shard over the even share
            worst = max(worst, math.prod(local) / (spec.numel / sbp.split_factor(mesh_shape)))
    return worst


BATCHED_GEMM_OPS = frozenset({"batch_matmul"})
"""Matmul-like ops whose leading output dims are separate GEMMs (a strided batched GEMM);
the others fold their leading dims into the rows (one GEMM, the weight read once)."""


def local_gemm(ctx: RuleContext, sig: Signature, mesh_shape: Sequence[int], flops: float) -> tuple[int, ...]:
    """``(batch, m, n, k)`` of the GEMM one device runs for matmul-like ``ctx.op`` under ``sig``.

    ``m``, ``n`` (and ``batch`` for :data:`BATCHED_GEMM_OPS`) from the output's local shape
    (the largest shard, :func:`autopar.ir.sbp.local_shape`); ``k`` = the contracted length
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
    op, :mod:`autopar.pipeline.split`): ``alpha + (numel x itemsize / f) / beta``, where ``f``
    is the number of pieces the receiving layout cuts the tensor into: each device receives
    its piece, the sending stage's devices share the sending (Megatron-LM's scatter-gather of
    pipeline tensors: each of ``t`` tensor-parallel ranks sends ``1/t``).  alpha, beta: the
    link between stages, across nodes when the op's ``crosses_nodes`` attr is true
    (:func:`autopar.hardware.collectives.send_recv_time`).  0 for a once-per-step tensor (attr ``per`` =
    ``step``, a tied parameter's gradient included: priced by
    :func:`autopar.pipeline.evaluate.evaluate_pipeline`, as the runtime moves it)."""
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
    """The link between a device of one pipeline stage and its peer in the next
    (:func:`autopar.hardware.mesh.node_boundary_link`: across nodes one network card's share
    per device, with the measured fits, if any; else the intra-node link)."""
    return node_boundary_link(cluster, crosses_nodes)


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
    if KERNEL_ATTR in ctx.op.attrs:  # one kernel with others: autopar.cost.fusion
        return fused_compute_time(rule, ctx, sig, mesh)
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
