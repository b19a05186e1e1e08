"""``autopar calibrate``: a cluster profile from nccl-tests output and GEMM timings
(:func:`autopar.hardware.calibrate.calibrate_profile`), written as JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autopar.errors import ConfigError
from autopar.hardware.calibrate import Calibration, Results, calibrate_profile, read_results
from autopar.hardware.cluster import DEFAULT_PRESET, PROFILES, load_cluster_profile
from autopar.hardware.devices import parse_cluster_geometry
from autopar.hardware.kernel_timings import parse_copy_table, parse_gemm_table
from autopar.hardware.mesh import parse_mesh_shape
from autopar.hardware.nccl_tests import GB, CollectiveCalibration

__all__ = ["add_calibrate_arguments", "cmd_calibrate"]


# ------------------------------------------------------------------ CLI


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "results",
        nargs="?",
        help="directory with axis<i>/ and nodes<N>/ folders of <nccl-tests binary>.txt outputs "
        "(leave out to calibrate compute only)",
    )
    p.add_argument("--cluster", help="NODESxDEVICES the tests ran on, e.g. 2x4 (with RESULTS)")
    p.add_argument("--mesh-shape", help="the mesh whose axes were measured, e.g. 4,2 (with axis<i>/ results)")
    p.add_argument(
        "--cards-per-node",
        type=int,
        help="network cards of the compute fabric per node (default: the base profile's)",
    )
    p.add_argument(
        "--card-gbps",
        type=float,
        help="line rate of one card in Gb/s, e.g. 200 for HDR InfiniBand (default: the base profile's)",
    )
    base = p.add_mutually_exclusive_group()
    base.add_argument(
        "--preset",
        choices=sorted(PROFILES),
        help=f"base profile for what is not measured (default {DEFAULT_PRESET})",
    )
    base.add_argument("--base-profile", help="a profile JSON file to start from instead of a preset")
    p.add_argument(
        "--gemm-table",
        help="CSV m,n,k,dtype,seconds (or m,n,k,dtype,tflops; optional batch) of timed fp16/bf16 GEMMs",
    )
    p.add_argument("--copy-table", help="CSV bytes,seconds of timed device copies (bytes = read + written)")
    p.add_argument("--name", help="profile name (default: <base>-calibrated)")
    p.add_argument("--out", required=True, help="profile JSON to write")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError("file_not_found", f"cannot read {path!r}: {exc.strerror}") from None


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``autopar calibrate``: fit a profile, print what was fitted, write the JSON."""
    if args.results and not args.cluster:
        raise ConfigError(
            "missing_argument",
            "nccl-tests results need --cluster NODESxDEVICES (and --mesh-shape for axis<i>/ results)",
        )
    if not (args.results or args.gemm_table or args.copy_table or args.cards_per_node or args.card_gbps):
        raise ConfigError(
            "no_measurements",
            "give nccl-tests RESULTS, a --gemm-table or a --copy-table (docs/calibration.md)",
        )
    results = read_results(args.results) if args.results else Results({}, {})
    if results.axes and not args.mesh_shape:
        raise ConfigError("missing_argument", "nccl-tests results of mesh axes (axis<i>/) need --mesh-shape")
    nodes, per = parse_cluster_geometry(args.cluster) if args.cluster else (1, 1)
    shape = parse_mesh_shape(args.mesh_shape) if args.mesh_shape else (nodes * per,)
    base = (
        load_cluster_profile(args.base_profile)
        if args.base_profile
        else PROFILES[args.preset or DEFAULT_PRESET]
    )
    gemms = parse_gemm_table(_read(args.gemm_table), args.gemm_table) if args.gemm_table else []
    copies = parse_copy_table(_read(args.copy_table), args.copy_table) if args.copy_table else []
    calibration = calibrate_profile(
        base,
        nodes,
        per,
        shape,
        results.axes,
        gemms=gemms,
        gemm_source=args.gemm_table or "",
        copies=copies,
        copy_source=args.copy_table or "",
        name=args.name,
        node_runs=results.nodes,
        cards_per_node=args.cards_per_node,
        card_bandwidth=args.card_gbps * 1e9 / 8 if args.card_gbps else None,
    )
    profile = calibration.profile
    out = sys.stdout
    out.write(
        f"profile {profile.name}: {nodes}x{per} cluster, mesh {list(shape)}\n"
        if results.axes
        else f"profile {profile.name}: {nodes}x{per} cluster\n"
        if args.results
        else f"profile {profile.name}: compute only (links from {base.name})\n"
    )
    _print_fits(calibration)
    dev = profile.device
    out.write(
        f"  matmul efficiency (large-GEMM ceiling) {dev.matmul_efficiency:.3f}"
        f"{'' if gemms else ' (from ' + base.name + ')'}, memory efficiency {dev.memory_efficiency:.3f}"
        f"{'' if copies else ' (from ' + base.name + ')'}\n"
    )
    profile.save(args.out)
    out.write(f"profile written to {args.out}\n")
    return 0


def _print_fits(calibration: Calibration) -> None:
    """Each measured axis's and node count's fits, and the network cards that came of them."""
    out = sys.stdout
    for axis in calibration.axes:
        where = "crosses nodes" if axis.crosses_nodes else "inside a node"
        out.write(f"  axis {axis.axis} ({axis.size} ranks, {where})\n")
        for c in axis.collectives:
            out.write(_fit_line(c))
    for nodes in sorted({n.nodes for n in calibration.nodes}):
        runs = [n.calibration for n in calibration.nodes if n.nodes == nodes]
        out.write(f"  {nodes} nodes ({runs[0].ranks} ranks)\n")
        for c in runs:
            out.write(_fit_line(c))
    network = calibration.profile.links.network
    if calibration.nodes and network is not None:
        out.write(
            f"  network: {network.cards_per_node} cards per {network.devices_per_node} devices at "
            f"{network.card_bandwidth * 8 / GB:g} Gb/s, card efficiency {network.card_efficiency:.3f}\n"
        )


def _fit_line(c: CollectiveCalibration) -> str:
    return (
        f"    {c.collective:<15} alpha {c.fit.alpha * 1e6:8.2f} us/step   "
        f"bus bandwidth {c.fit.bus_bandwidth / GB:8.2f} GB/s   "
        f"({c.line.points} timings, max error {100 * c.line.max_relative_error:.1f} %)\n"
    )
