"""ZeRO's parameter gathers: the boxing of a parameter from its sharded update back to its forward
layout, once per optimizer step under ZeRO-1/2 and twice per micro-batch under ZeRO-3
(:func:`optimizer_gather_time`), in the dtype the forward reads it in
(:func:`zero_gather_dtype`).
"""

from __future__ import annotations

from autopar.hardware.mesh import Mesh
from autopar.ir.graph import DTYPE_BYTES, Graph, Op, Role
from autopar.ir.optimizer import grad_port_index, model_port_index
from autopar.ir.sbp import Signature
from autopar.rules.registry import (
    RuleContext,
)
from autopar.runtimes.boxing import BoxingPlan
from autopar.runtimes.registry import boxing_plan

__all__ = ["optimizer_gather_plan", "optimizer_gather_time", "zero_gather_dtype"]


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
