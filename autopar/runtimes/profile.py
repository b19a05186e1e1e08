"""Runtime profiles: how the framework that runs a plan executes what the plan asks for.

The cost model prices the same plan differently depending on who runs it.  A
:class:`RuntimeProfile` records, with sources, the three things that differ:

* **lowering** -- how an N-D SBP change becomes communication:

  - ``ideal``: the cheapest sequence of 1-D ring collectives through
    intermediate N-D SBPs (:class:`autopar.runtimes.ideal.BoxingSearch`); what a perfect
    boxing collector would run.
  - ``oneflow-0.9``: what OneFlow 0.9 inserts for each change on a mesh
    (:class:`autopar.runtimes.oneflow_09.boxing.OneFlowBoxing`): hierarchical NCCL
    collectives where its builders have one, point-to-point send/recv of the
    needed slices otherwise.

* **gradient bucketing** -- data-parallel frameworks reduce gradients in
  buckets, so the per-collective latency is paid once per bucket, not once per
  parameter.  Default 25 MiB (PyTorch DDP ``bucket_cap_mb=25``; DeepSpeed's
  ``reduce_bucket_size`` defaults to 5e8 elements).  ``0`` disables it.

* **ZeRO sharding** -- over which mesh axes a replicated parameter's gradient
  and optimizer states are sharded under ZeRO (:class:`ZeroSharding`):

  - ``all_axes`` (``ideal``): every axis where the parameter is ``B`` (the ZeRO
    paper's data-parallel group is every replica).
  - ``one_axis`` (``oneflow-0.9``): OneFlow 0.9's ``distributed_split``
    (``oneflow/core/job_rewriter/optimizer_placement_optimization_pass.cpp``,
    ``GenerateSplitSignature``) splits ONE more mesh axis: an all-``B``
    variable becomes ``S(0)`` on the last axis (``(B, B) -> (B, S(0))``);
    otherwise the first ``B`` axis next to a split axis takes that axis's split
    (``(B, S(1)) -> (S(1), S(1))``, ``(S(0), B) -> (S(0), S(0))``).  The
    variable itself, ``model`` and ``model_diff`` of its update and the
    optimizer states all take that layout; a ``System-ZeRO-ParallelCast``
    restores the original layout for the forward consumers (OneFlow's
    ``PruneParallelCastOpsPass`` drops the cast when one op reads it, in its
    layout: that op then boxes the sharded variable itself; observed with
    ``tests/oneflow/_probe_zero_shard.py``, e.g. ViT's replicated patch-embedding
    conv weight, stored ``(B, S(0))`` with no cast).  A variable
    stays unsharded (its gradient and states too) when the split would leave
    a shard of fewer than ``shard_min_size`` elements (``IsSplitValid``:
    every split axis of the new layout, floor division, checked in turn;
    OneFlow's default ``enable_zero(shard_min_size=1024)``,
    ``optimizer_placement_optimization_threshold``): norm weights and biases
    keep ``(B, B)``.  ``oneflow-0.9-shard-min-1`` is the same runtime with
    ``shard_min_size=1`` (every splittable variable sharded).

* **overlap** -- whether data-parallel gradient reduction overlaps the backward
  pass (DDP, DeepSpeed ``overlap_comm``, OneFlow's stream scheduling).  Every
  plan reports both the serial and the overlapped step time; this flag says
  which of the two the profile's framework achieves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from autopar.errors import ConfigError
from autopar.ir.blocks import GROUPS

__all__ = ["ONEFLOW_SHARD_MIN_SIZE", "Lowering", "RuntimeProfile", "ZeroSharding", "parse_zero_sharding"]

MIB = 1024**2

ONEFLOW_SHARD_MIN_SIZE = 1024
"""OneFlow 0.9's default ``shard_min_size`` (``GraphConfig.enable_zero``; ``JobConfigProto``
``optimizer_placement_optimization_threshold [default = 1024]``): elements per shard."""


class Lowering(str, Enum):
    IDEAL = "ideal"
    ONEFLOW_0_9 = "oneflow-0.9"
    DIRECT = "direct"
    """Ideal ring collectives within fixed process groups: an axis that keeps its value is
    never touched (:class:`autopar.runtimes.megatron_lm.boxing.DirectBoxing`; Megatron-LM)."""


class ZeroSharding(str, Enum):
    """Mesh axes over which ZeRO shards a replicated parameter (see the module docstring)."""

    ALL_AXES = "all_axes"
    ONE_AXIS = "one_axis"
    """OneFlow 0.9 with its default ``shard_min_size`` (1024 elements per shard)."""
    ONE_AXIS_SHARD_MIN_1 = "one_axis:shard_min_size=1"
    """OneFlow 0.9 with ``enable_zero(shard_min_size=1)``."""
    DATA_AXES = "data_axes"
    """Megatron-LM's distributed optimizer: over the data-parallel group only, every mesh axis
    but the last (the tensor-parallel one) of a mesh of two or more axes
    (``megatron/core/optimizer/distrib_optimizer.py`` shards over
    ``parallel_state.get_data_parallel_group()``); a parameter replicated on the
    tensor-parallel axis keeps a whole copy there."""


def parse_zero_sharding(text: str) -> tuple[str, int]:
    """``"one_axis"`` -> ``("one_axis", 1024)``; ``"one_axis:shard_min_size=1"`` -> ``("one_axis", 1)``.

    The text of a :class:`ZeroSharding` (what rule contexts carry): the axes rule
    and the fewest elements a shard may keep (OneFlow's ``shard_min_size``;
    :data:`ONEFLOW_SHARD_MIN_SIZE` for ``one_axis`` when not given, 1 for
    ``all_axes``, the ZeRO paper's rule, which has no threshold).
    """
    text = str(getattr(text, "value", text))
    axes, _, option = text.partition(":")
    if axes not in ("all_axes", "one_axis", "data_axes"):
        raise ConfigError(
            "bad_zero_sharding", f"unknown ZeRO sharding {text!r}; use all_axes, one_axis or data_axes"
        )
    if not option:
        return axes, ONEFLOW_SHARD_MIN_SIZE if axes == "one_axis" else 1
    key, _, value = option.partition("=")
    if key != "shard_min_size" or not value.isdigit() or int(value) < 1:
        raise ConfigError(
            "bad_zero_sharding", f"bad ZeRO sharding option {option!r}; write shard_min_size=N, N >= 1"
        )
    return axes, int(value)


@dataclass(frozen=True)
class RuntimeProfile:
    """How a framework executes plans (see the module docstring)."""

    name: str
    lowering: Lowering
    grad_bucket_bytes: int = 25 * MIB
    """Gradient bucket size in bytes; 0 = every gradient is its own collective."""
    overlap_grad_comm: bool = True
    """Data-parallel gradient reduction overlaps the backward pass: the reduction after the
    last micro-batch hides behind that micro-batch's backward (or each reduction behind its
    micro-batch's, where the runtime reduces every micro-batch)."""
    overlap_param_gather: bool = False
    """The parameter all-gather after the update (ZeRO-1/2, Megatron-LM's distributed
    optimizer) hides behind the next step's first forward (Megatron-LM's
    ``--overlap-param-gather``)."""
    zero_sharding: ZeroSharding = ZeroSharding.ALL_AXES
    """Mesh axes ZeRO shards a replicated parameter's gradient and states over."""
    groups_fan_out: bool = True
    """The framework boxes a tensor once per destination layout, for every consumer that takes
    it in that layout (OneFlow 0.9: ``oneflow/core/job_rewriter/group_boxing_by_dst_parallel.cpp``,
    one boxing per tensor and destination placement and N-D SBP; Megatron-LM: one explicit
    collective per tensor its layers need, e.g. one all-gather before the fused QKV GEMM;
    ideal collectives likewise).  :func:`autopar.cost.evaluate.evaluate` prices a plan so."""
    fused_kernels: tuple[str, ...] = ()
    """The kernel fusions the framework runs (:data:`autopar.cost.fusion.FUSIONS`):
    ``flash_attention``, ``bias_gelu``, ``bias_dropout_add``; :mod:`autopar.cost.fusion` prices
    them (one kernel, what it keeps in memory)."""
    fuses_sibling_linears: bool = False
    """The framework runs the column-parallel linears that read one activation as one GEMM
    (Megatron-LM's ``query_key_value``, a cross-attention's ``key_value``, the gated
    ``dense_h_to_4h``): a graph's separate ``k`` and ``v`` input gradients are one tensor
    there, all-reduced once (``copy_to_tensor_model_parallel_region``,
    megatron/core/tensor_parallel/mappings.py).  :func:`autopar.cost.evaluate.evaluate` prices
    their reductions into one sum once."""
    recompute_groups: tuple[str, ...] = ()
    """The op groups of a block (:data:`autopar.ir.blocks.GROUPS`) the framework can recompute
    apart from the rest of their block (Megatron-Core's ``--recompute-granularity selective
    --recompute-modules``: ``core_attn`` is ``attention_core``, ``layernorm`` is ``norm``,
    megatron/core/transformer/transformer_config.py); empty: a block recomputes whole or not
    at all.  :mod:`autopar.cost.recompute_policies` makes a block's choices of them."""
    interleaved_1f1b: bool = False
    """The framework runs a pipeline's stages under interleaved 1F1B, each device holding ``v``
    model chunks (Megatron-LM's ``--num-virtual-stages-per-pipeline-rank``;
    :func:`autopar.pipeline.schedule.interleaved_iteration`): the pipeline search may choose
    ``v > 1``.  It changes no cost of a stage, so :meth:`key` leaves it out."""
    source: str = ""

    def __post_init__(self) -> None:
        unknown = [g for g in self.recompute_groups if g not in GROUPS]
        if unknown:
            raise ConfigError(
                "bad_runtime",
                f"runtime {self.name!r}: unknown recompute groups {unknown}; use some of {', '.join(GROUPS)}",
            )
        if self.grad_bucket_bytes < 0:
            raise ConfigError(
                "bad_runtime",
                f"runtime {self.name!r}: grad_bucket_bytes must be >= 0, got {self.grad_bucket_bytes}",
            )

    def key(self) -> dict[str, Any]:
        """What changes costs (for cache keys)."""
        d = asdict(self)
        d["lowering"] = self.lowering.value
        d["zero_sharding"] = self.zero_sharding.value
        d.pop("source")
        d.pop("interleaved_1f1b")  # a schedule the pipeline may use, not a cost of a stage
        d["zero_shard_min_size"] = self.zero_shard_min_size
        return d

    @property
    def zero_shard_min_size(self) -> int:
        """Fewest elements a ZeRO shard may keep (OneFlow's ``shard_min_size``; 1: no limit)."""
        return parse_zero_sharding(self.zero_sharding.value)[1]
