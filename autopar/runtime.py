"""Runtime profiles: how the framework that runs a plan executes what the plan asks for.

The cost model prices the same plan differently depending on who runs it.  A
:class:`RuntimeProfile` records, with sources, the three things that differ:

* **lowering** -- how an N-D SBP change becomes communication:

  - ``ideal``: the cheapest sequence of 1-D ring collectives through
    intermediate N-D SBPs (:class:`autopar.boxing.BoxingSearch`); what a perfect
    boxing collector would run.
  - ``oneflow-0.9``: what OneFlow 0.9 inserts for each change on a mesh
    (:class:`autopar.boxing.OneFlowBoxing`): hierarchical NCCL
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
    restores the original layout for the forward consumers.

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

__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "Lowering", "RuntimeProfile", "ZeroSharding", "runtime_profile"]

MIB = 1024**2


class Lowering(str, Enum):
    IDEAL = "ideal"
    ONEFLOW_0_9 = "oneflow-0.9"


class ZeroSharding(str, Enum):
    """Mesh axes over which ZeRO shards a replicated parameter (see the module docstring)."""

    ALL_AXES = "all_axes"
    ONE_AXIS = "one_axis"


@dataclass(frozen=True)
class RuntimeProfile:
    """How a framework executes plans (see the module docstring)."""

    name: str
    lowering: Lowering
    grad_bucket_bytes: int = 25 * MIB
    """Gradient bucket size in bytes; 0 = every gradient is its own collective."""
    overlap_grad_comm: bool = True
    """Data-parallel gradient reduction overlaps the backward pass."""
    zero_sharding: ZeroSharding = ZeroSharding.ALL_AXES
    """Mesh axes ZeRO shards a replicated parameter's gradient and states over."""
    source: str = ""

    def __post_init__(self) -> None:
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
        return d


RUNTIMES: dict[str, RuntimeProfile] = {
    "ideal": RuntimeProfile(
        "ideal",
        Lowering.IDEAL,
        source="cheapest 1-D ring collective sequence (Thakur et al. 2005); DDP bucket_cap_mb=25",
    ),
    "oneflow-0.9": RuntimeProfile(
        "oneflow-0.9",
        Lowering.ONEFLOW_0_9,
        zero_sharding=ZeroSharding.ONE_AXIS,
        source=(
            "OneFlow v0.9.0 oneflow/core/graph/boxing/hierarchical_sub_task_graph_builder_impl.cpp "
            "(DispatchHierarchicalSubTskGphBuilder, Same2DHierarchySubTskGphBuilder, "
            "Dim0NdSbpMismatchedSubTskGphBuilder, NDNcclSendRecvBoxingSubTskGphBuilder); "
            "oneflow/core/job_rewriter/optimizer_placement_optimization_pass.cpp (ZeRO over one axis); "
            "docs/runtime-profiles.md"
        ),
    ),
}

DEFAULT_RUNTIME = "oneflow-0.9"
"""Plans are applied to OneFlow jobs: price them as OneFlow 0.9 runs them."""


def runtime_profile(name: str | RuntimeProfile | None = None) -> RuntimeProfile:
    """The profile called ``name`` (default :data:`DEFAULT_RUNTIME`)."""
    if isinstance(name, RuntimeProfile):
        return name
    name = name or DEFAULT_RUNTIME
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ConfigError(
            "unknown_runtime", f"unknown runtime profile {name!r}; choose one of {sorted(RUNTIMES)}"
        ) from None
