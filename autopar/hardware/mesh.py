"""The logical device mesh laid over a cluster: :class:`Mesh` (devices reshaped row-major), the
link each axis's collectives run over (:class:`AxisLink`, :func:`axis_crosses_nodes`), and the
shapes a mesh search tries (:func:`candidate_mesh_shapes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.hardware.links import LinkCosts

__all__ = ["AxisLink", "Mesh", "candidate_mesh_shapes", "parse_mesh_shape"]


@dataclass(frozen=True)
class AxisLink:
    """The link a mesh axis's collectives run over."""

    size: int
    bandwidth: float
    """bytes/s per device"""
    latency: float
    """seconds per collective step"""
    crosses_nodes: bool
    collectives: LinkCosts = LinkCosts()
    """Measured per-collective (alpha, bus bandwidth); a missing one uses ``latency`` / ``bandwidth``."""

    def alpha_beta(self, collective: str) -> tuple[float, float]:
        """(seconds per step, bytes/s) for ``collective`` (a name in :data:`COLLECTIVE_NAMES`)."""
        fit = self.collectives.get(collective)
        if fit is None:
            return self.latency, self.bandwidth
        return fit.alpha, fit.bus_bandwidth


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
        crosses = axis_crosses_nodes(self.shape, axis, self.cluster.devices_per_node)
        cluster = self.cluster
        measured = cluster.links.axis_link(cluster.nodes, cluster.devices_per_node, self.shape, axis)
        if measured is not None:
            return AxisLink(size, measured.bandwidth, measured.latency, crosses, measured.collectives)
        dev = cluster.device
        if crosses:
            return AxisLink(
                size, dev.inter_node_bandwidth, dev.inter_node_latency, True, cluster.links.inter_node
            )
        return AxisLink(
            size, dev.intra_node_bandwidth, dev.intra_node_latency, False, cluster.links.intra_node
        )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def key(self) -> str:
        """Content key of everything that changes a cost: mesh shape and cluster (device and links)."""
        dev = self.cluster.device
        key = (
            f"mesh={list(self.shape)};cluster={self.cluster.nodes}x{self.cluster.devices_per_node};dev={dev}"
        )
        if self.cluster.links.measured:
            key += f";links={self.cluster.links}"
        return key

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "cluster": self.cluster.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Mesh:
        return cls(Cluster.from_dict(data["cluster"]), tuple(data["shape"]))


def axis_crosses_nodes(shape: Sequence[int], axis: int, devices_per_node: int) -> bool:
    """Whether the groups of mesh ``axis`` (row-major over the devices) span more than one node."""
    stride = math.prod(shape[axis + 1 :])
    nodes_touched = {(k * stride) // devices_per_node for k in range(shape[axis])}
    return len(nodes_touched) > 1


def candidate_mesh_shapes(cluster: Cluster, max_axes: int = 3) -> list[tuple[int, ...]]:
    """Every ordered factorisation of the device count into at most ``max_axes`` axes,
    each of size > 1 (a size-1 axis changes nothing), by number of axes then shape.

    Every shape is a valid :class:`Mesh` (row-major over the devices; an axis whose
    groups span nodes is priced on the inter-node link, :func:`axis_crosses_nodes`).
    For 2x4: ``[(8,), (2, 4), (4, 2), (2, 2, 2)]``; for 4x8, 11 shapes.
    """
    shapes = [s for s in _factorisations(cluster.world_size, max_axes) if s]
    return sorted(shapes, key=lambda s: (len(s), s)) or [(cluster.world_size,)]


def _factorisations(n: int, max_axes: int) -> list[tuple[int, ...]]:
    """Ordered tuples of factors > 1 whose product is ``n``, at most ``max_axes`` long."""
    if n == 1:
        return [()]
    if max_axes == 0:
        return []
    out: list[tuple[int, ...]] = []
    for first in range(2, n + 1):
        if n % first == 0:
            out.extend((first, *rest) for rest in _factorisations(n // first, max_axes - 1))
    return out


def parse_mesh_shape(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"4,2"`` or ``[4, 2]`` -> ``(4, 2)``."""
    if isinstance(text, str):
        try:
            return tuple(int(t) for t in text.replace("[", "").replace("]", "").split(",") if t.strip())
        except ValueError:
            raise ConfigError("bad_mesh", f"mesh shape {text!r} is not a comma list like 4,2") from None
    return tuple(int(t) for t in text)
