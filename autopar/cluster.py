"""Physical cluster, presets, and the logical device mesh laid over it.

A :class:`Cluster` is ``nodes x devices_per_node`` identical devices with an
intra-node link (NVLink) and an inter-node link (InfiniBand).  A :class:`Mesh`
reshapes its devices row-major into ``shape`` (for 2x4: ``[8]``, ``[2, 4]``,
``[4, 2]``).  Mesh axis ``i`` groups devices that differ only in coordinate
``i``; a group whose members sit on more than one node pays the inter-node
link, so each axis gets its own latency (alpha) and bandwidth (beta).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autopar.errors import ConfigError

__all__ = ["PRESETS", "AxisLink", "Cluster", "DeviceSpec", "Mesh", "candidate_mesh_shapes"]

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
    """Fraction of ``peak_flops`` that matmul-like ops reach."""
    memory_efficiency: float = 0.7
    """Fraction of ``memory_bandwidth`` that memory-bound ops reach."""

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
        for name in ("matmul_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(
                    "bad_device", f"device {self.name!r}: {name} must be in (0, 1], got {value}"
                )


# Sources: NVIDIA A100/H100/V100 datasheets (dense fp16 tensor peak, HBM bandwidth);
# NCCL bus bandwidth measured on DGX-class nodes is ~60-80 % of NVLink peak;
# inter-node: one 200 Gb/s HDR (25 GB/s) or 400 Gb/s NDR (50 GB/s) NIC per GPU,
# ~80 % achievable.  Latencies: NCCL ring step ~ 5 us intra, ~ 10-20 us inter.
PRESETS: dict[str, DeviceSpec] = {
    "a100-40g": DeviceSpec("a100-40g", 312e12, 1.555e12, 40 * GIB, 150e9, 5e-6, 20e9, 15e-6),
    "a100-80g": DeviceSpec("a100-80g", 312e12, 2.039e12, 80 * GIB, 150e9, 5e-6, 20e9, 15e-6),
    "h100-80g": DeviceSpec("h100-80g", 989e12, 3.35e12, 80 * GIB, 300e9, 4e-6, 40e9, 12e-6),
    "v100-32g": DeviceSpec("v100-32g", 125e12, 0.9e12, 32 * GIB, 100e9, 6e-6, 10e9, 20e-6),
}


@dataclass(frozen=True)
class Cluster:
    """``nodes x devices_per_node`` devices of one kind."""

    nodes: int
    devices_per_node: int
    device: DeviceSpec

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.devices_per_node < 1:
            raise ConfigError(
                "bad_cluster",
                f"cluster needs nodes >= 1 and devices_per_node >= 1, "
                f"got {self.nodes}x{self.devices_per_node}",
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @classmethod
    def parse(cls, text: str, preset: str = "a100-40g") -> Cluster:
        """Build from ``"2x4"`` (nodes x devices per node) and a preset name."""
        try:
            nodes_s, per_s = text.lower().split("x")
            nodes, per = int(nodes_s), int(per_s)
        except ValueError:
            raise ConfigError(
                "bad_cluster", f"cluster {text!r} is not NODESxDEVICES (for example 2x4)"
            ) from None
        if preset not in PRESETS:
            raise ConfigError(
                "unknown_preset", f"unknown device preset {preset!r}; choose one of {sorted(PRESETS)}"
            )
        return cls(nodes, per, PRESETS[preset])

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "devices_per_node": self.devices_per_node, "device": asdict(self.device)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cluster:
        try:
            device = DeviceSpec(**data["device"])
            return cls(int(data["nodes"]), int(data["devices_per_node"]), device)
        except (KeyError, TypeError) as exc:
            raise ConfigError("bad_cluster", f"malformed cluster description: {exc}") from None

    def __str__(self) -> str:
        return f"{self.nodes}x{self.devices_per_node} {self.device.name}"


@dataclass(frozen=True)
class AxisLink:
    """The link a mesh axis's collectives run over."""

    size: int
    bandwidth: float
    """bytes/s per device"""
    latency: float
    """seconds per collective step"""
    crosses_nodes: bool


@dataclass(frozen=True)
class Mesh:
    """A logical mesh ``shape`` over a cluster's devices (row-major)."""

    cluster: Cluster
    shape: tuple[int, ...]
    axes: tuple[AxisLink, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        object.__setattr__(self, "shape", shape)
        if not shape or any(s < 1 for s in shape):
            raise ConfigError("bad_mesh", f"mesh shape {list(shape)} must be non-empty and positive")
        if math.prod(shape) != self.cluster.world_size:
            raise ConfigError(
                "bad_mesh",
                f"mesh shape {list(shape)} has {math.prod(shape)} devices but cluster "
                f"{self.cluster.nodes}x{self.cluster.devices_per_node} has {self.cluster.world_size}",
            )
        object.__setattr__(self, "axes", tuple(self._axis_link(i) for i in range(len(shape))))

    def _axis_link(self, axis: int) -> AxisLink:
        size = self.shape[axis]
        stride = math.prod(self.shape[axis + 1 :])
        per_node = self.cluster.devices_per_node
        nodes_touched = {(k * stride) // per_node for k in range(size)}
        crosses = len(nodes_touched) > 1
        dev = self.cluster.device
        if crosses:
            return AxisLink(size, dev.inter_node_bandwidth, dev.inter_node_latency, True)
        return AxisLink(size, dev.intra_node_bandwidth, dev.intra_node_latency, False)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def key(self) -> str:
        """Content key of everything that changes a cost: mesh shape and cluster."""
        dev = self.cluster.device
        return (
            f"mesh={list(self.shape)};cluster={self.cluster.nodes}x{self.cluster.devices_per_node};dev={dev}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "cluster": self.cluster.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Mesh:
        return cls(Cluster.from_dict(data["cluster"]), tuple(data["shape"]))


def candidate_mesh_shapes(cluster: Cluster, max_axes: int = 2) -> list[tuple[int, ...]]:
    """Logical mesh shapes of up to ``max_axes`` axes (each > 1) over the cluster.

    For 2x4: ``[(8,), (2, 4), (4, 2)]``.
    """
    n = cluster.world_size
    shapes: list[tuple[int, ...]] = [(n,)]
    if max_axes >= 2:
        for a in range(2, n):
            if n % a == 0:
                shapes.append((a, n // a))
    return shapes


def parse_mesh_shape(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"4,2"`` or ``[4, 2]`` -> ``(4, 2)``."""
    if isinstance(text, str):
        try:
            return tuple(int(t) for t in text.replace("[", "").replace("]", "").split(",") if t.strip())
        except ValueError:
            raise ConfigError("bad_mesh", f"mesh shape {text!r} is not a comma list like 4,2") from None
    return tuple(int(t) for t in text)
