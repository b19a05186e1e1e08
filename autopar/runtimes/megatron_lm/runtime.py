"""Megatron-LM as a runtime: how it reduces, shards and fuses what a plan asks for."""

from __future__ import annotations

from autopar.runtimes.profile import Lowering, RuntimeProfile, ZeroSharding

__all__ = ["MEGATRON_LM"]

MEGATRON_LM = RuntimeProfile(
    "megatron-lm",
    Lowering.DIRECT,
    overlap_grad_comm=False,
    zero_sharding=ZeroSharding.DATA_AXES,
    fuses_sibling_linears=True,
    source=(
        "Megatron-LM (NVIDIA/Megatron-LM megatron/core/distributed/distributed_data_parallel.py, "
        "megatron/core/optimizer/distrib_optimizer.py): NCCL ring collectives; gradients "
        "accumulate in a full-size main_grad buffer and are all-reduced (DDP) or "
        "reduce-scattered (--use-distributed-optimizer) once per optimizer step, the "
        "updated parameters all-gathered once per step; --overlap-grad-reduce is off by "
        "default (the serial iteration)"
    ),
)
"""Megatron-LM (Megatron-Core): boxing within fixed process groups
(:class:`~autopar.runtimes.megatron_lm.boxing.DirectBoxing`), the distributed optimizer's
sharding over the data-parallel group only, sibling column-parallel linears run as one GEMM
(:mod:`autopar.runtimes.megatron_lm.linears`)."""
