"""Calibration: a cluster profile fitted from nccl-tests output and GEMM / copy timings.

``autopar calibrate RESULTS --cluster 2x4 --mesh-shape 4,2 --out profile.json``
reads one nccl-tests output file per mesh axis and collective, and per node count::

    RESULTS/axis0/all_reduce_perf.txt      # stdout of all_reduce_perf on one group of axis 0
    RESULTS/axis0/all_gather_perf.txt
    RESULTS/axis0/reduce_scatter_perf.txt
    RESULTS/axis0/sendrecv_perf.txt
    RESULTS/axis0/alltoall_perf.txt        # optional
    RESULTS/axis1/...
    RESULTS/nodes2/all_reduce_perf.txt     # all_reduce_perf on every device of 2 nodes
    RESULTS/nodes2/sendrecv_perf.txt       # optional: the cards' efficiency
    RESULTS/nodes4/...                     # reduce_scatter_perf, all_gather_perf optional

(any extension, or none; a collective left out keeps the link's default
numbers; ``nodes<N>/``: :mod:`autopar.hardware.network_calibration`, the bus
bandwidth per node count and the cards' efficiency of the profile's
``links.network``) and, optionally, a GEMM timing table (``--gemm-table``, CSV
``m,n,k,dtype,seconds`` or ``m,n,k,dtype,tflops``, optional ``batch``) and a
device-copy timing table (``--copy-table``, CSV ``bytes,seconds``).  How to run the
tests per axis: ``docs/calibration.md``.

The fit
-------
nccl-tests prints, per message size ``S`` (bytes, the ``size`` column: the
whole tensor ``T`` for all-reduce, all-gather and reduce-scatter, the bytes
each rank sends for send/recv and all-to-all), the time ``t`` (us) and the bus
bandwidth ``busbw = S / t * f(n)`` (GB/s = 1e9 bytes/s) with the collective's
factor ``f(n)``: ``2(n-1)/n`` all-reduce, ``(n-1)/n`` all-gather /
reduce-scatter / all-to-all, ``1`` send/recv (nccl-tests doc/PERFORMANCE.md).
With bus bytes ``x = f(n) * S`` the model is

    t(S) = A + x / beta,   A = steps(n) * alpha

``steps(n)`` = ``2(n-1)`` all-reduce, ``n-1`` all-gather / reduce-scatter /
all-to-all, ``1`` send/recv (ring algorithms), so ``alpha`` is seconds per
step and ``beta`` bus bytes/s: exactly the parameters of the collective time
functions in :mod:`autopar.runtimes.ideal`, which then reproduce the measured times.
``A`` and ``1/beta`` are the weighted least-squares line through every
(size, time) row, out-of-place and in-place, with weights ``1/t^2`` (it
minimises the *relative* error): small sizes, where ``t`` is mostly ``A``,
set the intercept, large sizes set the slope.  Rows of size 0 (an all-gather
whose per-rank count rounds to 0) are skipped.

Matmul efficiency is the ceiling of the GEMM model (:func:`autopar.hardware.kernels.gemm_time`)
fitted to the GEMM table (:func:`fit_gemm_ceiling`: fp16 / bf16 rows, the peak is the
dense fp16/bf16 tensor-core peak; each row's fill of the SMs is the model's, rows under
their memory roofline are left out).  Memory efficiency = the bandwidth fitted, the
same way as a collective, to the copy table (``bytes`` = bytes read + bytes written) /
``memory_bandwidth``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autopar.errors import ConfigError
from autopar.hardware.cluster import ClusterProfile
from autopar.hardware.devices import DeviceSpec
from autopar.hardware.kernel_timings import GemmTiming, fit_gemm_ceiling, memory_efficiency
from autopar.hardware.links import COLLECTIVE_NAMES, CollectiveFit, LinkCosts, LinkTable, MeshAxisLink
from autopar.hardware.mesh import axis_crosses_nodes
from autopar.hardware.nccl_tests import (
    NCCL_TESTS,
    CollectiveCalibration,
    NcclRun,
    calibrate_collective,
    parse_nccl_tests,
)
from autopar.hardware.network_calibration import NodeCalibration, calibrate_network

__all__ = [
    "AxisCalibration",
    "Calibration",
    "Results",
    "calibrate_profile",
    "read_results",
    "read_results_dir",
]


# ------------------------------------------------------------------ the profile


@dataclass(frozen=True)
class AxisCalibration:
    axis: int
    size: int
    crosses_nodes: bool
    collectives: tuple[CollectiveCalibration, ...]

    def default_fit(self) -> CollectiveFit:
        """The link's default (latency, bandwidth): the all-reduce fit, else the first measured."""
        by_name = {c.collective: c.fit for c in self.collectives}
        return next(by_name[c] for c in COLLECTIVE_NAMES if c in by_name)


@dataclass(frozen=True)
class Calibration:
    profile: ClusterProfile
    axes: tuple[AxisCalibration, ...]
    nodes: tuple[NodeCalibration, ...] = ()
    """the runs over whole nodes (``nodes<N>/``), fitted"""


def calibrate_profile(
    base: ClusterProfile,
    nodes: int,
    devices_per_node: int,
    mesh_shape: Sequence[int],
    runs: Mapping[int, Mapping[str, NcclRun]],
    *,
    gemms: Sequence[GemmTiming] = (),
    gemm_source: str = "",
    copies: Sequence[tuple[float, float]] = (),
    copy_source: str = "",
    name: str | None = None,
    node_runs: Mapping[int, Mapping[str, NcclRun]] | None = None,
    cards_per_node: int | None = None,
    card_bandwidth: float | None = None,
) -> Calibration:
    """A profile: ``base`` with every measured number replaced (:mod:`autopar.hardware.calibrate` docstring).

    ``runs[axis][collective]`` is the nccl-tests output of ``collective`` on one
    group of mesh ``axis``.  Each measured axis becomes a per-axis link of the
    profile; the intra-node (inter-node) link becomes the measured axis of that
    kind with the most ranks (the lowest axis on a tie).  ``node_runs[N][collective]``
    is a run over every device of ``N`` nodes; with ``cards_per_node`` and
    ``card_bandwidth`` (line rate, bytes/s) they give the profile's network cards
    (:func:`autopar.hardware.network_calibration.calibrate_network`).  Links,
    efficiencies and sources that nothing measured stay the base's.
    """
    shape = tuple(int(s) for s in mesh_shape)
    if math.prod(shape) != nodes * devices_per_node:
        raise ConfigError(
            "bad_mesh",
            f"mesh shape {list(shape)} has {math.prod(shape)} devices but cluster "
            f"{nodes}x{devices_per_node} has {nodes * devices_per_node}",
        )
    if not (runs or node_runs or gemms or copies or cards_per_node or card_bandwidth):
        raise ConfigError(
            "no_measurements",
            "no nccl-tests output for any mesh axis or node count, GEMM table or copy table given",
        )
    sources = dict(base.sources)
    axes: list[AxisCalibration] = []
    device, links = base.device, base.links
    if runs:
        axes, mesh_links = _calibrate_axes(nodes, devices_per_node, shape, runs, sources)
        device, link_costs = _node_links(base, axes, nodes, devices_per_node, shape, sources)
        links = LinkTable(
            link_costs["intra_node"], link_costs["inter_node"], tuple(mesh_links), links.network
        )
    network = calibrate_network(
        links.network, devices_per_node, node_runs or {}, cards_per_node, card_bandwidth, sources
    )
    links = replace(links, network=network.network)
    device = _calibrate_compute(device, gemms, gemm_source, copies, copy_source, sources)
    device = replace(device, name=name or f"{base.name}-calibrated")
    measured = [
        what
        for what, given in (
            ("nccl-tests output", runs or node_runs),
            ("GEMM timings", gemms),
            ("copy timings", copies),
        )
        if given
    ]
    where = f"on a {nodes}x{devices_per_node} cluster, mesh {list(shape)}, " if runs else ""
    where = f"on {devices_per_node}-device nodes, " if node_runs and not runs else where
    what = f"from {' and '.join(measured)}" if measured else "with the network cards given"
    profile = ClusterProfile(
        device,
        links,
        description=f"Calibrated {where}{what}; unmeasured numbers from profile {base.name}.",
        sources=sources,
    )
    return Calibration(profile, tuple(axes), network.runs)


def _calibrate_compute(
    device: DeviceSpec,
    gemms: Sequence[GemmTiming],
    gemm_source: str,
    copies: Sequence[tuple[float, float]],
    copy_source: str,
    sources: dict[str, str],
) -> DeviceSpec:
    """``device`` with the memory efficiency fitted to ``copies`` and then the GEMM ceiling to
    ``gemms`` (the GEMM fit's memory roofline uses the memory efficiency), where given."""
    if copies:
        eff = memory_efficiency(copies, device.memory_bandwidth)
        device = replace(device, memory_efficiency=eff)
        sources["device.memory_efficiency"] = (
            f"{copy_source}: {len(copies)} copies, fitted bandwidth (read + write bytes) / memory_bandwidth"
        )
    if gemms:
        fit = fit_gemm_ceiling(gemms, device)
        device = replace(device, matmul_efficiency=fit.ceiling)
        sources["device.matmul_efficiency"] = (
            f"{gemm_source}: {fit.points} GEMMs ({fit.compute_bound} compute-bound), ceiling = "
            f"sum(2 batch m n k / fill) / sum(seconds) / peak_flops over the compute-bound rows; "
            "autopar.hardware.kernels.gemm_time reproduces every row within "
            f"{100 * fit.max_relative_error:.1f} %"
        )
    return device


def _calibrate_axes(
    nodes: int,
    devices_per_node: int,
    shape: tuple[int, ...],
    runs: Mapping[int, Mapping[str, NcclRun]],
    sources: dict[str, str],
) -> tuple[list[AxisCalibration], list[MeshAxisLink]]:
    """Each measured mesh axis's collectives fitted, as a per-axis link of the profile
    (its fits' descriptions added to ``sources``)."""
    axes: list[AxisCalibration] = []
    mesh_links: list[MeshAxisLink] = []
    for axis in sorted(runs):
        if not 0 <= axis < len(shape):
            raise ConfigError(
                "bad_axis",
                f"measurements for mesh axis {axis}, but mesh {list(shape)} has axes 0..{len(shape) - 1}",
            )
        if not runs[axis]:
            continue
        size = shape[axis]
        calibrations = tuple(
            calibrate_collective(runs[axis][c], c, size) for c in COLLECTIVE_NAMES if c in runs[axis]
        )
        cal = AxisCalibration(axis, size, axis_crosses_nodes(shape, axis, devices_per_node), calibrations)
        axes.append(cal)
        default = cal.default_fit()
        mesh_links.append(
            MeshAxisLink(
                nodes,
                devices_per_node,
                shape,
                axis,
                default.alpha,
                default.bus_bandwidth,
                LinkCosts.of({c.collective: c.fit for c in calibrations}),
            )
        )
        index = len(mesh_links) - 1
        for c in calibrations:
            sources[f"links.mesh_axes[{index}].{c.collective}"] = c.describe()
    if not axes:
        raise ConfigError("no_measurements", "no nccl-tests output given for any mesh axis")
    return axes, mesh_links


def _node_links(
    base: ClusterProfile,
    axes: list[AxisCalibration],
    nodes: int,
    devices_per_node: int,
    shape: tuple[int, ...],
    sources: dict[str, str],
) -> tuple[DeviceSpec, dict[str, LinkCosts]]:
    """The device with its intra-node (inter-node) latency and bandwidth from the measured
    axis of that kind with the most ranks (the lowest axis on a tie), and both links'
    collective costs; the base's where no axis of a kind was measured."""
    device = base.device
    link_costs = {"intra_node": base.links.intra_node, "inter_node": base.links.inter_node}
    for kind, crosses in (("intra_node", False), ("inter_node", True)):
        candidates = [a for a in axes if a.crosses_nodes == crosses]
        if not candidates:
            continue
        chosen = max(candidates, key=lambda a: (a.size, -a.axis))
        default = chosen.default_fit()
        numbers: dict[str, Any] = {
            f"{kind}_latency": default.alpha,
            f"{kind}_bandwidth": default.bus_bandwidth,
        }
        device = replace(device, **numbers)
        link_costs[kind] = LinkCosts.of({c.collective: c.fit for c in chosen.collectives})
        origin = (
            f"fitted on mesh {list(shape)} axis {chosen.axis} ({chosen.size} ranks) of a "
            f"{nodes}x{devices_per_node} cluster"
        )
        default_name = next(c for c in COLLECTIVE_NAMES if any(x.collective == c for x in chosen.collectives))
        sources[f"links.{kind}.latency_s"] = f"{origin}: alpha of the {default_name} fit"
        sources[f"links.{kind}.bandwidth_bytes_per_s"] = f"{origin}: bus bandwidth of the {default_name} fit"
        sources[f"links.{kind}.collectives"] = origin
    return device, link_costs


@dataclass(frozen=True)
class Results:
    """The nccl-tests outputs of a results folder: ``axes[i][collective]`` from ``axis<i>/``,
    ``nodes[N][collective]`` from ``nodes<N>/``."""

    axes: dict[int, dict[str, NcclRun]]
    nodes: dict[int, dict[str, NcclRun]]


def read_results(path: str | Path) -> Results:
    """Every ``axis<i>/<binary>[.ext]`` and ``nodes<N>/<binary>[.ext]`` of ``path``."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(
            "results_not_found",
            f"{str(root)!r} is not a directory of axis<i>/ or nodes<N>/ folders of nccl-tests outputs",
        )
    axes: dict[int, dict[str, NcclRun]] = {}
    nodes: dict[int, dict[str, NcclRun]] = {}
    for sub in sorted(root.iterdir()):
        m = re.fullmatch(r"(axis|nodes)(\d+)", sub.name)
        if not (m and sub.is_dir()):
            continue
        found = _read_runs(sub)
        if found:
            (axes if m.group(1) == "axis" else nodes)[int(m.group(2))] = found
    if not (axes or nodes):
        raise ConfigError(
            "no_measurements",
            f"{str(root)!r} has no axis<i>/<binary>.txt or nodes<N>/<binary>.txt files "
            f"(e.g. axis0/all_reduce_perf.txt, nodes2/all_reduce_perf.txt); see docs/calibration.md",
        )
    return Results(axes, nodes)


def read_results_dir(path: str | Path) -> dict[int, dict[str, NcclRun]]:
    """``{axis: {collective: run}}`` from ``RESULTS/axis<i>/<nccl-tests binary>[.ext]``."""
    axes = read_results(path).axes
    if not axes:
        raise ConfigError(
            "no_measurements",
            f"{str(path)!r} has no axis<i>/<binary>.txt files (e.g. axis0/all_reduce_perf.txt); "
            f"see docs/calibration.md",
        )
    return axes


def _read_runs(sub: Path) -> dict[str, NcclRun]:
    """``{collective: run}`` of the nccl-tests outputs in one folder."""
    found: dict[str, NcclRun] = {}
    for f in sorted(sub.iterdir()):
        stem = f.name.split(".", 1)[0]
        if not f.is_file() or not stem.endswith("_perf"):
            continue
        if stem not in NCCL_TESTS:
            raise ConfigError(
                "unknown_nccl_test",
                f"{f}: {stem!r} is not an nccl-tests binary autopar reads: {sorted(NCCL_TESTS)}",
            )
        collective = NCCL_TESTS[stem]
        if collective in found:
            raise ConfigError(
                "duplicate_measurement", f"{sub}: two outputs of {stem} ({found[collective].source}, {f})"
            )
        found[collective] = parse_nccl_tests(f.read_text(), str(f))
    return found
