"""Physical cluster, cluster profiles, and the logical device mesh laid over it.

A :class:`Cluster` is ``nodes x devices_per_node`` identical devices with an
intra-node link (NVLink) and network cards between nodes (InfiniBand).  A :class:`Mesh`
reshapes its devices row-major into ``shape`` (for 2x4: ``[8]``, ``[2, 4]``,
``[4, 2]``).  Mesh axis ``i`` groups devices that differ only in coordinate
``i``; a group whose members sit on more than one node crosses the cards, so
each axis gets its own latency (alpha) and bandwidth (beta).

A :class:`ClusterProfile` is what a cluster is priced with: the device
(:class:`DeviceSpec`: peaks, efficiencies, default link numbers) and a
:class:`LinkTable` of measured per-collective costs.  The built-in presets are
profiles shipped as JSON in ``autopar/hardware/profiles/`` with a ``sources`` field
citing where each number comes from; ``autopar calibrate`` fits one from
nccl-tests output (``autopar.hardware.calibrate``, ``docs/calibration.md``) and
``--cluster-profile FILE`` selects it (:func:`load_cluster_profile`).

Which numbers a mesh axis gets (:meth:`Mesh._axis_link`):

1. the link measured on that very axis (same cluster geometry, mesh shape and
   axis) when the profile has one;
2. otherwise, for an axis inside a node, the profile's intra-node link;
3. for an axis whose groups span nodes, the bus bandwidth NCCL gets from the
   node's network cards (the profile's ``links.network``; formulas in
   :mod:`autopar.hardware.network`), each collective's alpha from the
   inter-node link; a profile without ``links.network`` (written before it
   existed) keeps the inter-node link's one bandwidth per device;
4. a collective that the chosen link has no fit for uses the link's
   ``latency`` / ``bandwidth``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from autopar.errors import ConfigError
from autopar.hardware.devices import DeviceSpec, parse_cluster_geometry
from autopar.hardware.json_fields import check_keys as _check_keys
from autopar.hardware.json_fields import number as _number
from autopar.hardware.links import LinkCosts, LinkTable, MeshAxisLink
from autopar.hardware.network import NodeNetwork

__all__ = ["PRESETS", "PROFILES", "Cluster", "ClusterProfile", "load_cluster_profile"]

PROFILE_FORMAT = "autopar-cluster-profile"
PROFILE_VERSION = 1


# ------------------------------------------------------------- profiles

# Profile JSON field -> DeviceSpec field.  Units are in the JSON names.
_DEVICE_FIELDS = {
    "peak_flops": "peak_flops",
    "memory_bandwidth_bytes_per_s": "memory_bandwidth",
    "memory_bytes": "memory_bytes",
    "matmul_efficiency": "matmul_efficiency",
    "memory_efficiency": "memory_efficiency",
    "compute_units": "compute_units",
}
_OPTIONAL_DEVICE_FIELDS = ("matmul_efficiency", "memory_efficiency", "compute_units")
"""Device fields a profile may leave out (the :class:`DeviceSpec` defaults apply)."""
_LINK_FIELDS = {"latency_s": "latency", "bandwidth_bytes_per_s": "bandwidth", "collectives": "collectives"}


@dataclass(frozen=True)
class ClusterProfile:
    """What a cluster is priced with: a device, its measured links, and where every number comes from.

    JSON form (``docs/calibration.md``)::

        {"format": "autopar-cluster-profile", "version": 1, "name": "a100-40g",
         "description": "...",
         "device": {"peak_flops": ..., "memory_bandwidth_bytes_per_s": ..., "memory_bytes": ...,
                    "matmul_efficiency": ..., "memory_efficiency": ..., "compute_units": ...},
         "links": {"intra_node": {"latency_s": ..., "bandwidth_bytes_per_s": ..., "collectives": {...}},
                   "inter_node": {...}, "mesh_axes": [...],
                   "network": {"cards_per_node": ..., "devices_per_node": ...,
                               "card_bandwidth_bytes_per_s": ..., "card_efficiency": ...}},
         "sources": {"device.peak_flops": "NVIDIA A100 datasheet ...", ...}}
    """

    device: DeviceSpec
    links: LinkTable = LinkTable()
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.device.name

    def cluster(self, nodes: int, devices_per_node: int) -> Cluster:
        """``nodes x devices_per_node`` devices priced by this profile."""
        return Cluster(nodes, devices_per_node, self.device, self.links)

    def to_dict(self) -> dict[str, Any]:
        dev = self.device
        return {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "name": dev.name,
            "description": self.description,
            "device": {key: getattr(dev, attr) for key, attr in _DEVICE_FIELDS.items()},
            "links": {
                "intra_node": {
                    "latency_s": dev.intra_node_latency,
                    "bandwidth_bytes_per_s": dev.intra_node_bandwidth,
                    "collectives": self.links.intra_node.to_dict(),
                },
                "inter_node": {
                    "latency_s": dev.inter_node_latency,
                    "bandwidth_bytes_per_s": dev.inter_node_bandwidth,
                    "collectives": self.links.inter_node.to_dict(),
                },
                "mesh_axes": [m.to_dict() for m in self.links.mesh_axes],
                **({"network": self.links.network.to_dict()} if self.links.network else {}),
            },
            "sources": dict(self.sources),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> ClusterProfile:
        """Parse the JSON form; a ConfigError names the field that is wrong."""
        _check_keys(data, {"format", "version", "name", "description", "device", "links", "sources"}, where)
        if data.get("format") != PROFILE_FORMAT or data.get("version") != PROFILE_VERSION:
            raise ConfigError(
                "bad_profile",
                f'{where}: not a cluster profile (needs "format": {PROFILE_FORMAT!r}, '
                f'"version": {PROFILE_VERSION}); write one with `autopar calibrate`',
            )
        for key in ("name", "device", "links"):
            if key not in data:
                raise ConfigError("bad_profile", f"{where}: missing field {key!r}")
        device = data["device"]
        _check_keys(device, set(_DEVICE_FIELDS), f"{where}.device")
        links = data["links"]
        _check_keys(links, {"intra_node", "inter_node", "mesh_axes", "network"}, f"{where}.links")
        link_numbers: dict[str, Any] = {}
        for cls_name in ("intra_node", "inter_node"):
            link = links.get(cls_name)
            if link is None:
                raise ConfigError("bad_profile", f"{where}.links: missing field {cls_name!r}")
            _check_keys(link, set(_LINK_FIELDS), f"{where}.links.{cls_name}")
            for key in ("latency_s", "bandwidth_bytes_per_s"):
                link_numbers[f"{cls_name}_{_LINK_FIELDS[key]}"] = _number(
                    link, key, f"{where}.links.{cls_name}"
                )
        numbers: dict[str, Any] = {
            attr: _number(device, key, f"{where}.device")
            for key, attr in _DEVICE_FIELDS.items()
            if key in device or key not in _OPTIONAL_DEVICE_FIELDS
        }
        for key in ("memory_bytes", "compute_units"):
            if key in numbers:
                if not float(numbers[key]).is_integer():
                    raise ConfigError("bad_profile", f"{where}.device.{key} must be a whole number")
                numbers[key] = int(numbers[key])
        sources = data.get("sources", {})
        if not isinstance(sources, Mapping) or not all(isinstance(v, str) for v in sources.values()):
            raise ConfigError("bad_profile", f"{where}.sources must map field names to strings")
        spec = DeviceSpec(name=str(data["name"]), **numbers, **link_numbers)
        table = LinkTable(
            LinkCosts.from_dict(
                links["intra_node"].get("collectives", {}), f"{where}.links.intra_node.collectives"
            ),
            LinkCosts.from_dict(
                links["inter_node"].get("collectives", {}), f"{where}.links.inter_node.collectives"
            ),
            tuple(
                MeshAxisLink.from_dict(m, f"{where}.links.mesh_axes[{i}]")
                for i, m in enumerate(links.get("mesh_axes", []))
            ),
            NodeNetwork.from_dict(links["network"], f"{where}.links.network") if "network" in links else None,
        )
        return cls(spec, table, str(data.get("description", "")), dict(sources))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def load_cluster_profile(path: str | Path) -> ClusterProfile:
    """Read a profile JSON file (``autopar calibrate --out``, or a preset's in
    ``autopar/hardware/profiles``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(
            "profile_not_found", f"cannot read cluster profile {str(p)!r}: {exc.strerror}"
        ) from None
    return _profile_from_text(text, str(p))


def _profile_from_text(text: str, where: str) -> ClusterProfile:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "bad_profile", f"{where}:{exc.lineno}: not valid JSON ({exc.msg})", line=exc.lineno
        ) from None
    return ClusterProfile.from_dict(data, f"{where}: profile")


def _builtin_profiles() -> dict[str, ClusterProfile]:
    folder = resources.files("autopar.hardware").joinpath("profiles")
    profiles: dict[str, ClusterProfile] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            profile = _profile_from_text(entry.read_text(), f"autopar/hardware/profiles/{entry.name}")
            profiles[profile.name] = profile
    return profiles


PROFILES: dict[str, ClusterProfile] = _builtin_profiles()
"""Built-in profiles by name, read from ``autopar/hardware/profiles/*.json`` (each cites its sources)."""

PRESETS: dict[str, DeviceSpec] = {name: p.device for name, p in PROFILES.items()}
"""The built-in profiles' devices (``--preset``)."""

DEFAULT_PRESET = "a100-40g"


# ------------------------------------------------------------- cluster and mesh


@dataclass(frozen=True)
class Cluster:
    """``nodes x devices_per_node`` devices of one kind, priced by ``device`` and ``links``."""

    nodes: int
    devices_per_node: int
    device: DeviceSpec
    links: LinkTable = LinkTable()

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
    def parse(
        cls, text: str, preset: str | None = DEFAULT_PRESET, profile: ClusterProfile | None = None
    ) -> Cluster:
        """Build from ``"2x4"`` (nodes x devices per node) and a preset name or a profile."""
        nodes, per = parse_cluster_geometry(text)
        if profile is not None:
            return profile.cluster(nodes, per)
        preset = preset or DEFAULT_PRESET
        if preset not in PROFILES:
            raise ConfigError(
                "unknown_preset", f"unknown device preset {preset!r}; choose one of {sorted(PRESETS)}"
            )
        return PROFILES[preset].cluster(nodes, per)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "device": asdict(self.device),
        }
        if not self.links.is_default:
            out["links"] = self.links.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cluster:
        try:
            device = DeviceSpec(**data["device"])
            links = LinkTable.from_dict(data["links"], "cluster.links") if "links" in data else LinkTable()
            return cls(int(data["nodes"]), int(data["devices_per_node"]), device, links)
        except (KeyError, TypeError) as exc:
            raise ConfigError("bad_cluster", f"malformed cluster description: {exc}") from None

    def __str__(self) -> str:
        return f"{self.nodes}x{self.devices_per_node} {self.device.name}"
