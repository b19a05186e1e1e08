"""The logical device mesh laid over a cluster: :class:`Mesh` (devices reshaped row-major), the
link each axis's collectives run over (:class:`AxisLink`, :func:`axis_crosses_nodes`,
:func:`axis_node_span`; across nodes :func:`crossing_link`, by the node's network cards), the
link between a device and its peer on another node (:func:`node_boundary_link`), and the
shapes a mesh search tries (:func:`candidate_mesh_shapes`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.hardware.links import COLLECTIVE_NAMES, CollectiveFit, LinkCosts
from autopar.hardware.network import axis_bus_bandwidth

__all__ = [
    "AxisLink",
    "Mesh",
    "axis_node_span",
    "candidate_mesh_shapes",
    "crossing_link",
    "node_boundary_link",
    "parse_mesh_shape",
]


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
        """The measured link of this very axis, else the intra-node link, else (groups
        spanning nodes) :func:`crossing_link` by the node's network cards."""
        size = self.shape[axis]
        crosses = axis_crosses_nodes(self.shape, axis, self.cluster.devices_per_node)
        cluster = self.cluster
        measured = cluster.links.axis_link(cluster.nodes, cluster.devices_per_node, self.shape, axis)
        if measured is not None:
            return AxisLink(size, measured.bandwidth, measured.latency, crosses, measured.collectives)
        if crosses:
            members, nodes = axis_node_span(self.shape, axis, cluster.devices_per_node)
            return crossing_link(cluster, size, members, nodes)
        dev = cluster.device
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
        if not self.cluster.links.is_default:
            key += f";links={self.cluster.links}"
        return key

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "cluster": self.cluster.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Mesh:
        return cls(Cluster.from_dict(data["cluster"]), tuple(data["shape"]))


def crossing_link(cluster: Cluster, size: int, members_per_node: int, nodes: int) -> AxisLink:
    """The link of an axis whose groups of ``size`` span ``nodes`` nodes with
    ``members_per_node`` on each: every collective's bus bandwidth from the node's network
    cards (:func:`autopar.hardware.network.axis_bus_bandwidth`), bounded by the intra-node
    link's bus bandwidth for that collective; its alpha from the inter-node link (its fit for
    that collective, else its latency).  A cluster without ``links.network`` keeps the
    inter-node link's one bandwidth per device."""
    dev, links = cluster.device, cluster.links
    if links.network is None:
        return AxisLink(size, dev.inter_node_bandwidth, dev.inter_node_latency, True, links.inter_node)
    fits: dict[str, CollectiveFit] = {}
    for collective in COLLECTIVE_NAMES:
        inter, intra = links.inter_node.get(collective), links.intra_node.get(collective)
        nvlink = intra.bus_bandwidth if intra is not None else dev.intra_node_bandwidth
        beta = axis_bus_bandwidth(links.network, collective, size, members_per_node, nodes, nvlink)
        fits[collective] = CollectiveFit(inter.alpha if inter is not None else dev.inter_node_latency, beta)
    default = fits["all-reduce"]
    return AxisLink(size, default.bus_bandwidth, default.alpha, True, LinkCosts.of(fits))


def node_boundary_link(cluster: Cluster, crosses_nodes: bool) -> AxisLink:
    """The link between a device and its peer in another group of devices (a pipeline stage's
    send/recv): across nodes one device per node on each end (:func:`crossing_link` with
    ``members_per_node`` 1 on 2 nodes: send/recv gets one card's share), else the intra-node
    link; its measured fits where the profile has them."""
    if crosses_nodes:
        return crossing_link(cluster, 2, 1, 2)
    dev = cluster.device
    return AxisLink(2, dev.intra_node_bandwidth, dev.intra_node_latency, False, cluster.links.intra_node)


def axis_crosses_nodes(shape: Sequence[int], axis: int, devices_per_node: int) -> bool:
    """Whether the groups of mesh ``axis`` (row-major over the devices) span more than one node."""
    stride = math.prod(shape[axis + 1 :])
    nodes_touched = {(k * stride) // devices_per_node for k in range(shape[axis])}
    return len(nodes_touched) > 1


@functools.lru_cache(maxsize=4096)
def axis_node_span(shape: tuple[int, ...], axis: int, devices_per_node: int) -> tuple[int, int]:
    """``(members_per_node, nodes)`` of mesh ``axis``'s groups (row-major over the devices):
    the fewest members any group has on a node it touches (the node where a ring's share of
    the cards is least), and the most nodes a group touches.  ``[4, 2]`` on 2x4: axis 0
    groups ``{0, 2, 4, 6}`` have 2 members on each of 2 nodes, ``(2, 2)``; ``[8]``: ``(4, 2)``;
    ``[2, 4]`` axis 0 ``{0, 4}``: ``(1, 2)``."""
    size, stride = shape[axis], math.prod(shape[axis + 1 :])
    least, most = size, 1
    for base in range(math.prod(shape)):
        if (base // stride) % size:
            continue  # not the first member of its group
        counts: dict[int, int] = {}
        for j in range(size):
            node = (base + j * stride) // devices_per_node
            counts[node] = counts.get(node, 0) + 1
        least, most = min(least, min(counts.values())), max(most, len(counts))
    return least, most


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
