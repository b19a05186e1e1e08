"""Edges: what a producer-consumer edge carries (:class:`EdgeKind`, :func:`edge_kind`) and its
boxing seconds as the runtime lowers it (:func:`edge_time`); a gradient reduction's latency
is paid per bucket (:func:`bucketed_time`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

from autopar.hardware.mesh import Mesh
from autopar.ir.graph import DTYPE_BYTES, Op, Role, TensorSpec
from autopar.ir.optimizer import IN_PLACE_PORTS
from autopar.ir.ports import base_name
from autopar.ir.sbp import B, NdSbp
from autopar.runtimes.boxing import BoxingPlan, step_latency
from autopar.runtimes.profile import Lowering, RuntimeProfile
from autopar.runtimes.registry import boxing_plan

__all__ = ["EdgeKind", "bucketed_time", "edge_kind", "edge_time", "placed_layout", "same_layout"]


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
    FUSED = "fused"
    """Inside one fused kernel (:mod:`autopar.cost.fusion`): the layouts must be equal, any
    other pair is forbidden (``inf``): a kernel cannot box between its own ops."""


SHAPE_ONLY_PORTS = frozenset({"like"})


def edge_kind(
    op: Op, port: str, gradient: bool = False, lowering: str = Lowering.IDEAL.value, fused: bool = False
) -> EdgeKind:
    """Classify the edge into ``op``'s input ``port`` (the one place that forbids layout changes).

    ``gradient``: the tensor is on a weight gradient's path to its optimizer
    (:func:`autopar.ir.optimizer.weight_gradient_path`); so is the optimizer's
    ``model_diff`` port.  ``lowering``: the runtime's (:class:`autopar.runtimes.profile.Lowering`
    value).  A ``like`` port is shape-only (free) under the ideal lowering; OneFlow 0.9
    boxes it as any other input: the op's SBP signature gives ``like`` a layout of its
    own (``oneflow/user/ops/split_like_op.cpp`` ``GetSbp``: ``S(i)``, ``B`` or ``P``,
    e.g. ``(in P, like B) -> P``) and the boxing of an input blob is inserted whatever
    the kernel reads of it (``InsertNcclLogicalOpPass`` walks every op edge; the
    compiled LLaMA job of ``benchmarks/heldout_truth.py`` carries ``(S(0), P) -> (S(0), B)``
    and ``(S(0), S(3)) -> (S(0), B)`` into ``split_like``'s ``like`` ports).  ``fused``: the
    edge runs inside one fused kernel (:meth:`autopar.cost.fusion.Kernels.same_kernel`).
    """
    if fused:
        return EdgeKind.FUSED
    base = base_name(port)
    if base in SHAPE_ONLY_PORTS and lowering != Lowering.ONEFLOW_0_9.value:
        return EdgeKind.SHAPE_ONLY
    if op.role is Role.OPTIMIZER and base in IN_PLACE_PORTS:
        return EdgeKind.IN_PLACE
    if gradient or (op.role is Role.OPTIMIZER and base == "model_diff"):
        return EdgeKind.GRADIENT
    return EdgeKind.BOXING


def same_layout(src: NdSbp, dst: NdSbp, mesh_shape: Sequence[int]) -> bool:
    """Whether ``src`` and ``dst`` place a tensor alike: equal on every mesh axis of more than
    one device (on a size-1 axis every value holds the whole tensor)."""
    return all(a == b or n == 1 for a, b, n in zip(src, dst, mesh_shape, strict=True))


def placed_layout(sbp: NdSbp, mesh_shape: Sequence[int]) -> NdSbp:
    """``sbp`` with ``B`` on every mesh axis of one device: two layouts with the same placed
    layout hold the same pieces on every device (:func:`same_layout`)."""
    return NdSbp(tuple(v if n > 1 else B for v, n in zip(sbp, mesh_shape, strict=True)))


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
    if kind is EdgeKind.FUSED:
        return (0.0, None) if same_layout(src, dst, mesh.shape) else (math.inf, None)
    if kind is EdgeKind.IN_PLACE:
        return math.inf, None
    plan = boxing_plan(spec.shape, DTYPE_BYTES[spec.dtype], src, dst, mesh, runtime.lowering.value)
    if kind is EdgeKind.GRADIENT and plan.feasible:
        return bucketed_time(
            plan, spec.numel * DTYPE_BYTES[spec.dtype], runtime.grad_bucket_bytes, mesh
        ), plan
    return plan.time_s, plan
