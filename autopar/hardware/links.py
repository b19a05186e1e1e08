"""Measured link costs of a cluster profile: per collective (:class:`CollectiveFit`), per link
(:class:`LinkCosts`), per mesh axis (:class:`MeshAxisLink`), and the table of a profile
(:class:`LinkTable`), with their JSON form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autopar.errors import ConfigError
from autopar.hardware.devices import parse_cluster_geometry
from autopar.hardware.json_fields import check_keys as _check_keys
from autopar.hardware.json_fields import number as _number
from autopar.hardware.network import NodeNetwork

__all__ = ["COLLECTIVE_NAMES", "CollectiveFit", "LinkCosts", "LinkTable", "MeshAxisLink"]


# ------------------------------------------------------------- measured links

COLLECTIVE_NAMES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
"""The collectives a link can carry a fit for, as printed (``boxing.Collective`` values + send-recv)."""


@dataclass(frozen=True)
class CollectiveFit:
    """A collective's measured cost on one link: ``t = steps(n) * alpha + bus_bytes / bus_bandwidth``.

    ``alpha`` is seconds per algorithm step (a ring all-reduce on ``n``
    devices has ``2(n-1)`` steps, all-gather / reduce-scatter / all-to-all
    ``n-1``, send/recv 1); ``bus_bandwidth`` is bytes/s of nccl-tests "bus
    bandwidth" (bus bytes = ``2(n-1)/n * T`` for all-reduce, ``(n-1)/n * T``
    for all-gather / reduce-scatter / all-to-all, ``T`` for send/recv).
    """

    alpha: float
    """seconds per algorithm step"""
    bus_bandwidth: float
    """bytes/s"""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ConfigError("bad_profile", f"collective alpha must be >= 0 seconds, got {self.alpha}")
        if not (math.isfinite(self.bus_bandwidth) and self.bus_bandwidth > 0):
            raise ConfigError(
                "bad_profile", f"collective bus bandwidth must be > 0 bytes/s, got {self.bus_bandwidth}"
            )

    def to_dict(self) -> dict[str, float]:
        return {"alpha_s": self.alpha, "bus_bandwidth_bytes_per_s": self.bus_bandwidth}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> CollectiveFit:
        _check_keys(data, {"alpha_s", "bus_bandwidth_bytes_per_s"}, where)
        return cls(_number(data, "alpha_s", where), _number(data, "bus_bandwidth_bytes_per_s", where))


@dataclass(frozen=True)
class LinkCosts:
    """Per-collective fits of one link; ``None`` = not measured (use the link's latency/bandwidth)."""

    all_reduce: CollectiveFit | None = None
    all_gather: CollectiveFit | None = None
    reduce_scatter: CollectiveFit | None = None
    all_to_all: CollectiveFit | None = None
    send_recv: CollectiveFit | None = None

    def get(self, collective: str) -> CollectiveFit | None:
        """The fit for ``collective`` (a name in :data:`COLLECTIVE_NAMES`), or None."""
        if collective not in COLLECTIVE_NAMES:
            raise KeyError(f"unknown collective {collective!r}; one of {COLLECTIVE_NAMES}")
        fit: CollectiveFit | None = getattr(self, collective.replace("-", "_"))
        return fit

    @property
    def measured(self) -> bool:
        return any(self.get(c) is not None for c in COLLECTIVE_NAMES)

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {c: fit.to_dict() for c in COLLECTIVE_NAMES if (fit := self.get(c)) is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> LinkCosts:
        _check_keys(data, set(COLLECTIVE_NAMES), where)
        return cls(
            **{c.replace("-", "_"): CollectiveFit.from_dict(v, f"{where}.{c}") for c, v in data.items()}
        )

    @classmethod
    def of(cls, fits: Mapping[str, CollectiveFit]) -> LinkCosts:
        """From ``{"all-reduce": fit, ...}``."""
        unknown = set(fits) - set(COLLECTIVE_NAMES)
        if unknown:
            raise ConfigError("bad_profile", f"unknown collectives {sorted(unknown)}; use {COLLECTIVE_NAMES}")
        return cls(**{c.replace("-", "_"): f for c, f in fits.items()})


@dataclass(frozen=True)
class MeshAxisLink:
    """The link measured on one axis of one mesh shape over one cluster geometry."""

    nodes: int
    devices_per_node: int
    mesh_shape: tuple[int, ...]
    axis: int
    latency: float
    """seconds per collective step (default for collectives without a fit)"""
    bandwidth: float
    """bytes/s (default for collectives without a fit)"""
    collectives: LinkCosts

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": f"{self.nodes}x{self.devices_per_node}",
            "mesh_shape": list(self.mesh_shape),
            "axis": self.axis,
            "latency_s": self.latency,
            "bandwidth_bytes_per_s": self.bandwidth,
            "collectives": self.collectives.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> MeshAxisLink:
        _check_keys(
            data,
            {"cluster", "mesh_shape", "axis", "latency_s", "bandwidth_bytes_per_s", "collectives"},
            where,
        )
        nodes, per = parse_cluster_geometry(str(data["cluster"]))
        return cls(
            nodes,
            per,
            tuple(int(s) for s in data["mesh_shape"]),
            int(_number(data, "axis", where)),
            _number(data, "latency_s", where),
            _number(data, "bandwidth_bytes_per_s", where),
            LinkCosts.from_dict(data.get("collectives", {}), f"{where}.collectives"),
        )


@dataclass(frozen=True)
class LinkTable:
    """Collective costs beyond a device's default links: fits measured per link class and per
    mesh axis where calibrated on that mesh, and the node's network cards (how NCCL runs a
    group that spans nodes, :mod:`autopar.hardware.network`)."""

    intra_node: LinkCosts = LinkCosts()
    inter_node: LinkCosts = LinkCosts()
    mesh_axes: tuple[MeshAxisLink, ...] = ()
    network: NodeNetwork | None = None
    """None: a profile from before the network was stated; an axis that spans nodes then
    gets ``inter_node`` (one flat per-device bandwidth), as it did."""

    @property
    def measured(self) -> bool:
        return self.intra_node.measured or self.inter_node.measured or bool(self.mesh_axes)

    @property
    def is_default(self) -> bool:
        """Nothing measured and no network stated: the device's links alone price a mesh."""
        return not self.measured and self.network is None

    def axis_link(
        self, nodes: int, devices_per_node: int, mesh_shape: tuple[int, ...], axis: int
    ) -> MeshAxisLink | None:
        """The link measured on exactly this axis of this mesh over this cluster, if any."""
        for link in self.mesh_axes:
            if (link.nodes, link.devices_per_node, link.mesh_shape, link.axis) == (
                nodes,
                devices_per_node,
                mesh_shape,
                axis,
            ):
                return link
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "intra_node": self.intra_node.to_dict(),
            "inter_node": self.inter_node.to_dict(),
            "mesh_axes": [m.to_dict() for m in self.mesh_axes],
        }
        if self.network is not None:
            out["network"] = self.network.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "links") -> LinkTable:
        _check_keys(data, {"intra_node", "inter_node", "mesh_axes", "network"}, where)
        return cls(
            LinkCosts.from_dict(data.get("intra_node", {}), f"{where}.intra_node"),
            LinkCosts.from_dict(data.get("inter_node", {}), f"{where}.inter_node"),
            tuple(
                MeshAxisLink.from_dict(m, f"{where}.mesh_axes[{i}]")
                for i, m in enumerate(data.get("mesh_axes", []))
            ),
            NodeNetwork.from_dict(data["network"], f"{where}.network") if "network" in data else None,
        )
