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

__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "Lowering", "RuntimeProfile", "runtime_profile"]

MIB = 1024**2


class Lowering(str, Enum):
    IDEAL = "ideal"
    ONEFLOW_0_9 = "oneflow-0.9"


@dataclass(frozen=True)
class RuntimeProfile:
    """How a framework executes plans (see the module docstring)."""

    name: str
    lowering: Lowering
    grad_bucket_bytes: int = 25 * MIB
    """Gradient bucket size in bytes; 0 = every gradient is its own collective."""
    overlap_grad_comm: bool = True
    """Data-parallel gradient reduction overlaps the backward pass."""
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
        source=(
            "OneFlow v0.9.0 oneflow/core/graph/boxing/hierarchical_sub_task_graph_builder_impl.cpp "
            "(DispatchHierarchicalSubTskGphBuilder, Same2DHierarchySubTskGphBuilder, "
            "Dim0NdSbpMismatchedSubTskGphBuilder, NDNcclSendRecvBoxingSubTskGphBuilder); "
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
