"""One device (:class:`DeviceSpec`: peaks, measured efficiencies, default links) and the
``NODESxDEVICES`` geometry of a cluster (:func:`parse_cluster_geometry`).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import ConfigError

__all__ = ["DeviceSpec", "parse_cluster_geometry"]

GIB = 1024**3


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator and its links.  Units: FLOP/s, bytes/s, seconds, bytes."""

    name: str
    peak_flops: float
    """Dense fp16/bf16 tensor-core peak, FLOP/s."""
    memory_bandwidth: float
    """HBM bandwidth, bytes/s."""
    memory_bytes: int
    """Device memory, bytes."""
    intra_node_bandwidth: float
    """Achievable per-device collective bus bandwidth inside a node (NVLink), bytes/s."""
    intra_node_latency: float
    """Per-step latency of an intra-node collective, seconds."""
    inter_node_bandwidth: float
    """Achievable per-device bandwidth across nodes (InfiniBand), bytes/s."""
    inter_node_latency: float
    """Per-step latency of an inter-node collective, seconds."""
    matmul_efficiency: float = 0.5
    """Fraction of ``peak_flops`` a large, well-shaped fp16/bf16 GEMM reaches: the ceiling of
    the GEMM model (:func:`autopar.hardware.kernels.gemm_time`), which lowers it for GEMMs too small
    to fill the device or too thin to be compute-bound.  Presets: a kernel measurement,
    cited in the profile's ``sources``."""
    memory_efficiency: float = 0.7
    """Fraction of ``memory_bandwidth`` that streaming (memory-bound) kernels reach: a
    STREAM-like measurement in the presets, cited in the profile's ``sources``."""
    compute_units: int = 0
    """Streaming multiprocessors: a GEMM of fewer output tiles than this leaves SMs idle
    (:func:`autopar.hardware.kernels.gemm_time`).  0: not modelled (every GEMM fills the device)."""

    def __post_init__(self) -> None:
        for name in (
            "peak_flops",
            "memory_bandwidth",
            "memory_bytes",
            "intra_node_bandwidth",
            "inter_node_bandwidth",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(
                    "bad_device", f"device {self.name!r}: {name} must be > 0, got {getattr(self, name)}"
                )
        for name in ("intra_node_latency", "inter_node_latency"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    "bad_device", f"device {self.name!r}: {name} must be >= 0, got {getattr(self, name)}"
                )
        for name in ("matmul_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(
                    "bad_device", f"device {self.name!r}: {name} must be in (0, 1], got {value}"
                )
        units = self.compute_units
        if isinstance(units, bool) or not isinstance(units, int) or units < 0:
            raise ConfigError(
                "bad_device", f"device {self.name!r}: compute_units must be an integer >= 0, got {units!r}"
            )


def parse_cluster_geometry(text: str) -> tuple[int, int]:
    """``"2x4"`` -> ``(2, 4)``: nodes, devices per node."""
    try:
        nodes_s, per_s = text.lower().split("x")
        return int(nodes_s), int(per_s)
    except ValueError:
        raise ConfigError("bad_cluster", f"cluster {text!r} is not NODESxDEVICES (for example 2x4)") from None
