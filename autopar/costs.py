"""Cost model and cost tables.

Per op and N-D signature (pure functions, seconds):

* ``CostKind.MATMUL``: ``flops / work_share / (peak_flops * matmul_efficiency)``;
* ``CostKind.MEMORY``: ``(local input bytes + local output bytes) /
  (memory_bandwidth * memory_efficiency)`` (roofline for memory-bound ops);
* ``CostKind.FREE``: 0 (views, variables, ticks);
* optimizer ops (role ``optimizer``) additionally pay the ZeRO all-gather of the
  updated fp16 parameter: boxing from the gradient's SBP to the parameter's
  (0 when they are equal, i.e. ZeRO stage 0).

``work_share`` is the product of the sizes of the mesh axes on which some port
is split (an axis where every port is ``B`` or ``P`` repeats the work).

Per edge (producer output port -> consumer input port): boxing time from the
producer's output N-D SBP to the consumer's input N-D SBP (:mod:`autopar.boxing`),
classified by :func:`edge_kind`.

The tables built from this model (one entry per unique op and edge, memo keys,
serialisation, the process pool) live in :mod:`autopar.cost_tables`;
:data:`COST_MODEL_VERSION` is part of their keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from enum import Enum
from typing import Any

from autopar.boxing import BoxingPlan, boxing_plan
from autopar.cluster import Mesh
from autopar.graph import DTYPE_BYTES, Graph, Op, Role, TensorSpec
from autopar.rules.registry import (
    CostKind,
    Rule,
    RuleContext,
    RuleSet,
    base_name,
    fallback_signatures,
    nd_signatures,
    work_share,
)
from autopar.sbp import NdSbp, Signature, local_shape

__all__ = [
    "COST_MODEL_VERSION",
    "EdgeKind",
    "edge_kind",
    "op_compute_time",
    "op_signatures",
    "optimizer_gather_plan",
    "optimizer_gather_time",
    "rule_context",
]

COST_MODEL_VERSION = "1"


OPTIMIZER_BYTES_PER_ELEMENT = 32
"""Adam update traffic per local element, bytes: read fp32 param, m, v, grad (16),
write param, m, v (12), write the fp16 copy (2) ~ 32 (rounded)."""


# ------------------------------------------------------------------ per op


def rule_context(graph: Graph, op: Op, mesh_shape: Sequence[int], zero_stage: int) -> RuleContext:
    return RuleContext(
        op=op,
        inputs=tuple(graph.tensors[t] for t in op.inputs.values()),
        outputs=tuple(graph.tensors[t] for t in op.outputs.values()),
        mesh_shape=tuple(mesh_shape),
        zero_stage=zero_stage,
    )


_SIGNATURE_MEMO_SIZE = 8192
_signature_memo: dict[tuple[Any, ...], tuple[RuleSet, list[Signature], bool]] = {}


def op_signatures(rules: RuleSet, ctx: RuleContext) -> tuple[list[Signature], bool]:
    """Valid N-D signatures of the op and whether the all-``B`` fallback was used.

    Memoised by content (op type, role, attrs, ports, shapes, dtypes, mesh shape, ZeRO
    stage; not the op's name): the same op of identical layers is enumerated once.
    """
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
    )
    hit = _signature_memo.get(key)
    if hit is not None and hit[0] is rules:
        return list(hit[1]), hit[2]
    sigs, fallback = _enumerate_signatures(rules, ctx)
    if len(_signature_memo) >= _SIGNATURE_MEMO_SIZE:
        _signature_memo.pop(next(iter(_signature_memo)))
    _signature_memo[key] = (rules, sigs, fallback)
    return list(sigs), fallback


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


def op_compute_time(rule: Rule | None, ctx: RuleContext, sig: Signature, mesh: Mesh) -> float:
    """Seconds of compute for ``ctx.op`` under ``sig`` (formulas in the module docstring)."""
    dev = mesh.cluster.device
    if ctx.op.role is Role.OPTIMIZER and ctx.op.type not in ("variable", "input", "output"):
        t = 0.0
        if ctx.inputs:
            # the gradient port decides the local slice each device updates
            grad_index = _grad_port_index(ctx.op)
            spec = ctx.inputs[grad_index]
            local = local_shape(spec.shape, sig.inputs[grad_index], mesh.shape)
            numel = math.prod(local) if local is not None else spec.numel
            t += numel * OPTIMIZER_BYTES_PER_ELEMENT / (dev.memory_bandwidth * dev.memory_efficiency)
        return t + optimizer_gather_time(ctx, sig, mesh)
    kind = rule.cost if rule is not None else CostKind.MEMORY
    if kind is CostKind.FREE:
        return 0.0
    if kind is CostKind.MATMUL and rule is not None and rule.flops is not None:
        flops = rule.flops(ctx)
        return flops / work_share(sig, mesh.shape) / (dev.peak_flops * dev.matmul_efficiency)
    moved = _local_bytes(ctx.inputs, sig.inputs, mesh.shape) + _local_bytes(
        ctx.outputs, sig.outputs, mesh.shape
    )
    return moved / (dev.memory_bandwidth * dev.memory_efficiency)


def _grad_port_index(op: Op) -> int:
    ports = list(op.inputs)
    for i, port in enumerate(ports):
        if port.startswith("model_diff"):
            return i
    return 0


def _model_port_index(op: Op) -> int | None:
    for i, port in enumerate(op.inputs):
        if port.startswith("model_") and not port.startswith("model_diff"):
            return i
    return None


def optimizer_gather_plan(ctx: RuleContext, sig: Signature, mesh: Mesh) -> BoxingPlan | None:
    """The ZeRO all-gather of the updated parameter, or None when there is none.

    Boxing of the fp16 parameter (2 bytes per element) from the gradient's
    layout (sharded over the data-parallel axes under ZeRO >= 1) back to the
    parameter's layout.  Zero when both layouts agree (ZeRO stage 0).
    Source: ZeRO paper section 7 (ZeRO-2 traffic = reduce-scatter + all-gather).
    """
    model_index = _model_port_index(ctx.op)
    if model_index is None:
        return None
    grad_index = _grad_port_index(ctx.op)
    src, dst = sig.inputs[grad_index], sig.inputs[model_index]
    if src == dst:
        return None
    return boxing_plan(ctx.inputs[model_index].shape, 2, src, dst, mesh)


def optimizer_gather_time(ctx: RuleContext, sig: Signature, mesh: Mesh) -> float:
    """Seconds of :func:`optimizer_gather_plan` (0 when there is no gather)."""
    plan = optimizer_gather_plan(ctx, sig, mesh)
    return 0.0 if plan is None else plan.time_s


# ------------------------------------------------------------------ edges


class EdgeKind(str, Enum):
    """How an edge into an op's input port is costed."""

    BOXING = "boxing"
    """Data flows: boxing time from the producer's SBP to the consumer's."""
    SHAPE_ONLY = "shape_only"
    """The port only lends its shape (``like`` of ``reduce_sum_like``, ``ones_like`` ...): free."""
    IN_PLACE = "in_place"
    """The op updates the tensor in place (optimizer ``model``): the layouts must be equal,
    any other pair is forbidden (``inf``)."""


SHAPE_ONLY_PORTS = frozenset({"like"})
IN_PLACE_OPTIMIZER_PORTS = frozenset({"model", "m", "v", "momentum", "max_v"})


def edge_kind(op: Op, port: str) -> EdgeKind:
    """Classify the edge into ``op``'s input ``port`` (the one place that forbids layout changes)."""
    base = base_name(port)
    if base in SHAPE_ONLY_PORTS:
        return EdgeKind.SHAPE_ONLY
    if op.role is Role.OPTIMIZER and base in IN_PLACE_OPTIMIZER_PORTS:
        return EdgeKind.IN_PLACE
    return EdgeKind.BOXING
