"""Megatron-LM as a runtime: how it reduces, shards and fuses what a plan asks for."""

from __future__ import annotations

from autopar.runtimes.profile import Lowering, RuntimeProfile, ZeroSharding

__all__ = ["MEGATRON_LM"]

MEGATRON_LM = RuntimeProfile(
    "megatron-lm",
    Lowering.DIRECT,
    overlap_grad_comm=True,
    overlap_param_gather=True,
    zero_sharding=ZeroSharding.DATA_AXES,
    fuses_sibling_linears=True,
    fused_kernels=("flash_attention", "bias_gelu", "bias_dropout_add"),
    recompute_groups=("attention_core", "norm"),
    interleaved_1f1b=True,
    source=(
        "Megatron-LM (NVIDIA/Megatron-LM megatron/core/distributed/distributed_data_parallel.py, "
        "megatron/core/optimizer/distrib_optimizer.py): NCCL ring collectives; gradients "
        "accumulate in a full-size main_grad buffer and are all-reduced (DDP) or "
        "reduce-scattered (--use-distributed-optimizer) once per optimizer step, the "
        "updated parameters all-gathered once per step; with --overlap-grad-reduce and "
        "--overlap-param-gather, which its users turn on (Megatron-LM's own "
        "examples/llama/train_llama3_8b_h100_fp8.sh: --use-distributed-optimizer "
        "--overlap-grad-reduce --overlap-param-gather --sequence-parallel), the reduction "
        "hides behind the last micro-batch's backward and the gather behind the first forward; "
        "attention as FlashAttention (--attention-backend flash/fused, the same example), bias-GeLU "
        "and bias-dropout-add fused (megatron/core/fusions/); selective recomputation of "
        "core_attn and layernorm (--recompute-modules, megatron/core/transformer/transformer_config.py); "
        "interleaved 1F1B (--num-virtual-stages-per-pipeline-rank, "
        "megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving)"
    ),
)
"""Megatron-LM (Megatron-Core): boxing within fixed process groups
(:class:`~autopar.runtimes.megatron_lm.boxing.DirectBoxing`), the distributed optimizer's
sharding over the data-parallel group only, sibling column-parallel linears run as one GEMM
(:mod:`autopar.runtimes.megatron_lm.linears`)."""
