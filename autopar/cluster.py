"""Physical cluster, cluster profiles, and the logical device mesh laid over it.

A :class:`Cluster` is ``nodes x devices_per_node`` identical devices with an
intra-node link (NVLink) and an inter-node link (InfiniBand).  A :class:`Mesh`
reshapes its devices row-major into ``shape`` (for 2x4: ``[8]``, ``[2, 4]``,
``[4, 2]``).  Mesh axis ``i`` groups devices that differ only in coordinate
``i``; a group whose members sit on more than one node pays the inter-node
link, so each axis gets its own latency (alpha) and bandwidth (beta).

A :class:`ClusterProfile` is what a cluster is priced with: the device
(:class:`DeviceSpec`: peaks, efficiencies, default link numbers) and a
:class:`LinkTable` of measured per-collective costs.  The built-in presets are
profiles shipped as JSON in ``autopar/profiles/`` with a ``sources`` field
citing where each number comes from; ``autopar calibrate`` fits one from
nccl-tests output (``autopar.calibrate``, ``docs/calibration.md``) and
``--cluster-profile FILE`` selects it (:func:`load_cluster_profile`).

Which numbers a mesh axis gets (:meth:`Mesh._axis_link`):

1. the link measured on that very axis (same cluster geometry, mesh shape and
   axis) when the profile has one;
2. otherwise the profile's intra-node or inter-node link, by whether the
   axis's groups cross nodes;
3. a collective that the chosen link has no fit for uses the link's
   ``latency`` / ``bandwidth``, which is all the presets have.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from autopar.errors import ConfigError

__all__ = [
    "COLLECTIVE_NAMES",
    "PRESETS",
    "PROFILES",
    "AxisLink",
    "Cluster",
    "ClusterProfile",
    "CollectiveFit",
    "DeviceSpec",
    "LinkCosts",
    "LinkTable",
    "Mesh",
    "MeshAxisLink",
    "candidate_mesh_shapes",
    "load_cluster_profile",
    "parse_cluster_geometry",
    "parse_mesh_shape",
]

GIB = 1024**3

PROFILE_FORMAT = "autopar-cluster-profile"
PROFILE_VERSION = 1


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
    the GEMM model (:func:`autopar.costs.gemm_time`), which lowers it for GEMMs too small
    to fill the device or too thin to be compute-bound.  Presets: a kernel measurement,
    cited in the profile's ``sources``."""
    memory_efficiency: float = 0.7
    """Fraction of ``memory_bandwidth`` that streaming (memory-bound) kernels reach: a
    STREAM-like measurement in the presets, cited in the profile's ``sources``."""
    compute_units: int = 0
    """Streaming multiprocessors: a GEMM of fewer output tiles than this leaves SMs idle
    (:func:`autopar.costs.gemm_time`).  0: not modelled (every GEMM fills the device)."""

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
    """Measured collective costs: per link class, and per mesh axis where calibrated on that mesh."""

    intra_node: LinkCosts = LinkCosts()
    inter_node: LinkCosts = LinkCosts()
    mesh_axes: tuple[MeshAxisLink, ...] = ()

    @property
    def measured(self) -> bool:
        return self.intra_node.measured or self.inter_node.measured or bool(self.mesh_axes)

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
        return {
            "intra_node": self.intra_node.to_dict(),
            "inter_node": self.inter_node.to_dict(),
            "mesh_axes": [m.to_dict() for m in self.mesh_axes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "links") -> LinkTable:
        _check_keys(data, {"intra_node", "inter_node", "mesh_axes"}, where)
        return cls(
            LinkCosts.from_dict(data.get("intra_node", {}), f"{where}.intra_node"),
            LinkCosts.from_dict(data.get("inter_node", {}), f"{where}.inter_node"),
            tuple(
                MeshAxisLink.from_dict(m, f"{where}.mesh_axes[{i}]")
                for i, m in enumerate(data.get("mesh_axes", []))
            ),
        )


def _check_keys(data: Any, allowed: set[str], where: str) -> None:
    if not isinstance(data, Mapping):
        raise ConfigError("bad_profile", f"{where} must be a JSON object, got {type(data).__name__}")
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(
            "bad_profile", f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}"
        )


def _number(data: Mapping[str, Any], key: str, where: str) -> float:
    if key not in data:
        raise ConfigError("bad_profile", f"{where}: missing field {key!r}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("bad_profile", f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def parse_cluster_geometry(text: str) -> tuple[int, int]:
    """``"2x4"`` -> ``(2, 4)``: nodes, devices per node."""
    try:
        nodes_s, per_s = text.lower().split("x")
        return int(nodes_s), int(per_s)
    except ValueError:
        raise ConfigError("bad_cluster", f"cluster {text!r} is not NODESxDEVICES (for example 2x4)") from None


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
                   "inter_node": {...}, "mesh_axes": [...]},
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
        _check_keys(links, {"intra_node", "inter_node", "mesh_axes"}, f"{where}.links")
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
        )
        return cls(spec, table, str(data.get("description", "")), dict(sources))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def load_cluster_profile(path: str | Path) -> ClusterProfile:
    """Read a profile JSON file (``autopar calibrate --out``, or a preset's in ``autopar/profiles``)."""
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
    folder = resources.files("autopar").joinpath("profiles")
    profiles: dict[str, ClusterProfile] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            profile = _profile_from_text(entry.read_text(), f"autopar/profiles/{entry.name}")
            profiles[profile.name] = profile
    return profiles


PROFILES: dict[str, ClusterProfile] = _builtin_profiles()
"""Built-in profiles by name, read from ``autopar/profiles/*.json`` (each cites its sources)."""

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
        if self.links.measured:
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
