"""Calibration: a cluster profile fitted from nccl-tests output and GEMM / copy timings.

``autopar calibrate RESULTS --cluster 2x4 --mesh-shape 4,2 --out profile.json``
reads one nccl-tests output file per mesh axis and collective::

    RESULTS/axis0/all_reduce_perf.txt      # stdout of all_reduce_perf on one group of axis 0
    RESULTS/axis0/all_gather_perf.txt
    RESULTS/axis0/reduce_scatter_perf.txt
    RESULTS/axis0/sendrecv_perf.txt
    RESULTS/axis0/alltoall_perf.txt        # optional
    RESULTS/axis1/...

(any extension, or none; a collective left out keeps the link's default
numbers) and, optionally, a GEMM timing table (``--gemm-table``, CSV
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
functions in :mod:`autopar.boxing`, which then reproduce the measured times.
``A`` and ``1/beta`` are the weighted least-squares line through every
(size, time) row, out-of-place and in-place, with weights ``1/t^2`` (it
minimises the *relative* error): small sizes, where ``t`` is mostly ``A``,
set the intercept, large sizes set the slope.  Rows of size 0 (an all-gather
whose per-rank count rounds to 0) are skipped.

Matmul efficiency is the ceiling of the GEMM model (:func:`autopar.costs.gemm_time`)
fitted to the GEMM table (:func:`fit_gemm_ceiling`: fp16 / bf16 rows, the peak is the
dense fp16/bf16 tensor-core peak; each row's fill of the SMs is the model's, rows under
their memory roofline are left out).  Memory efficiency = the bandwidth fitted, the
same way as a collective, to the copy table (``bytes`` = bytes read + bytes written) /
``memory_bandwidth``.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autopar.cluster import (
    COLLECTIVE_NAMES,
    DEFAULT_PRESET,
    PROFILES,
    ClusterProfile,
    CollectiveFit,
    DeviceSpec,
    LinkCosts,
    LinkTable,
    MeshAxisLink,
    axis_crosses_nodes,
    load_cluster_profile,
    parse_cluster_geometry,
    parse_mesh_shape,
)
from autopar.errors import ConfigError

__all__ = [
    "NCCL_TESTS",
    "AxisCalibration",
    "Calibration",
    "CollectiveCalibration",
    "GemmFit",
    "GemmTiming",
    "LinearFit",
    "NcclRow",
    "NcclRun",
    "add_calibrate_arguments",
    "algorithm_steps",
    "bus_factor",
    "calibrate_collective",
    "calibrate_profile",
    "cmd_calibrate",
    "fit_gemm_ceiling",
    "fit_latency_bandwidth",
    "memory_efficiency",
    "parse_copy_table",
    "parse_gemm_table",
    "parse_nccl_tests",
    "read_results_dir",
]

GB = 1e9
"""nccl-tests prints bandwidths in GB/s = 1e9 bytes/s."""
US = 1e-6
"""nccl-tests prints times in microseconds."""

NCCL_TESTS: dict[str, str] = {
    "all_reduce_perf": "all-reduce",
    "all_gather_perf": "all-gather",
    "reduce_scatter_perf": "reduce-scatter",
    "alltoall_perf": "all-to-all",
    "sendrecv_perf": "send-recv",
}
"""nccl-tests binary -> the collective it measures."""

GEMM_DTYPES = {"float16", "fp16", "half", "bfloat16", "bf16"}
"""GEMM dtypes the device peak (dense fp16/bf16 tensor core) applies to."""


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests bus bytes / message size on ``n`` ranks (doc/PERFORMANCE.md)."""
    if collective == "all-reduce":
        return 2 * (n - 1) / n
    if collective in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    if collective == "send-recv":
        return 1.0
    raise ConfigError("unknown_collective", f"unknown collective {collective!r}; one of {COLLECTIVE_NAMES}")


def algorithm_steps(collective: str, n: int) -> int:
    """Latency steps of the ring algorithm on ``n`` ranks (the multiplier of alpha in autopar.boxing)."""
    if collective == "all-reduce":
        return 2 * (n - 1)
    if collective in ("all-gather", "reduce-scatter", "all-to-all"):
        return n - 1
    if collective == "send-recv":
        return 1
    raise ConfigError("unknown_collective", f"unknown collective {collective!r}; one of {COLLECTIVE_NAMES}")


# ------------------------------------------------------------------ nccl-tests output


@dataclass(frozen=True)
class NcclRow:
    """One timed run of one size: the out-of-place or the in-place half of a result row."""

    line: int
    size_bytes: int
    time_s: float
    algbw: float
    """GB/s as printed"""
    busbw: float
    """GB/s as printed"""


@dataclass(frozen=True)
class NcclRun:
    """The result rows of one nccl-tests output and the number of ranks in the measured group."""

    source: str
    rows: tuple[NcclRow, ...]
    ranks: int | None
    """Ranks in rank 0's group per the "# Using devices" lines; None when the output has none."""


_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\b")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")


def _bad(source: str, line: int, message: str) -> ConfigError:
    return ConfigError("bad_nccl_output", f"{source}:{line}: {message}", path=source, line=line)


def parse_nccl_tests(text: str, source: str = "<nccl-tests output>") -> NcclRun:
    """Parse the stdout of an nccl-tests binary (``all_reduce_perf`` and friends).

    Result rows are ``size count type redop root`` then ``time algbw busbw
    #wrong`` out-of-place and again in-place (13 fields; outputs older than the
    ``root`` column have 12).  Lines starting with ``#`` are comments except the
    ``# Using devices`` rank lines (which give the group size) and ``# Out of
    bounds values`` (a non-zero count means wrong results).  Other lines (NCCL
    INFO logs, launcher noise) are skipped unless their first word is a number.
    """
    rows: list[NcclRow] = []
    ranks: list[tuple[int, int | None]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _RANK_LINE.match(line)
            if m:
                ranks.append((int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None))
            m = _OUT_OF_BOUNDS.match(line)
            if m and int(m.group(1)):
                raise _bad(source, lineno, f"nccl-tests reported {m.group(1)} wrong values; rerun the test")
            continue
        fields = line.split()
        if not fields[0].isdigit():  # NCCL INFO logs, launcher output
            continue
        if len(fields) not in (12, 13):
            raise _bad(
                source,
                lineno,
                f"a result row has 13 fields (size count type redop root, then time algbw busbw #wrong "
                f"out-of-place and in-place), this one has {len(fields)}: {line!r}",
            )
        results = fields[-8:]
        try:
            size = int(fields[0])
            halves = [
                (float(results[i]), float(results[i + 1]), float(results[i + 2]), results[i + 3])
                for i in (0, 4)
            ]
        except ValueError:
            raise _bad(source, lineno, f"size, time, algbw and busbw must be numbers: {line!r}") from None
        for time_us, algbw, busbw, wrong in halves:
            if wrong not in ("N/A", "-1") and not re.fullmatch(r"0+(\.0*)?(e[+-]?\d+)?", wrong):
                raise _bad(source, lineno, f"#wrong = {wrong}: nccl-tests saw wrong results; rerun the test")
            if not (math.isfinite(time_us) and time_us > 0):
                raise _bad(source, lineno, f"time must be > 0 us, got {time_us}")
            if size > 0:
                rows.append(NcclRow(lineno, size, time_us * US, algbw, busbw))
    if not rows:
        raise ConfigError(
            "bad_nccl_output",
            f"{source}: no result rows of non-zero size; give the stdout of an nccl-tests binary "
            f"(e.g. all_reduce_perf -b 8 -e 1G -f 2)",
            path=source,
        )
    group_size: int | None = None
    if ranks:
        group0 = next((g for r, g in ranks if r == 0), ranks[0][1])
        group_size = sum(1 for _, g in ranks if g == group0)
    return NcclRun(source, tuple(rows), group_size)


# ------------------------------------------------------------------ fitting


@dataclass(frozen=True)
class LinearFit:
    """``t = intercept + slope * x`` fitted with relative-error weights."""

    intercept: float
    """seconds"""
    slope: float
    """seconds per byte"""
    points: int
    max_relative_error: float
    """max over the points of |t_fit - t| / t"""


def fit_latency_bandwidth(x_bytes: Sequence[float], t_s: Sequence[float]) -> LinearFit:
    """Weighted least squares ``t = A + x * s`` minimising ``sum(((A + x s - t) / t)^2)``.

    Solved as ``[1/t, x/t] @ [A, s] = 1`` (columns normalised) with numpy's SVD
    least squares.  Needs two distinct ``x``.
    """
    x = np.asarray(x_bytes, dtype=float)
    t = np.asarray(t_s, dtype=float)
    if len(set(x.tolist())) < 2:
        raise ConfigError("bad_nccl_fit", "a latency/bandwidth fit needs at least two distinct sizes")
    design = np.column_stack([1.0 / t, x / t])
    scale = np.linalg.norm(design, axis=0)
    solution, *_ = np.linalg.lstsq(design / scale, np.ones_like(t), rcond=None)
    intercept, slope = (solution / scale).tolist()
    predicted = intercept + slope * x
    return LinearFit(intercept, slope, len(t), float(np.max(np.abs(predicted - t) / t)))


@dataclass(frozen=True)
class CollectiveCalibration:
    """One collective fitted on one mesh axis, with its provenance."""

    collective: str
    ranks: int
    fit: CollectiveFit
    line: LinearFit
    source: str
    sizes: tuple[int, int]

    def describe(self) -> str:
        return (
            f"{self.source}: {self.ranks} ranks, {self.line.points} timings of "
            f"{self.sizes[0]}..{self.sizes[1]} B; t = {algorithm_steps(self.collective, self.ranks)} x "
            f"{self.fit.alpha * 1e6:.3g} us + bus bytes / {self.fit.bus_bandwidth / GB:.4g} GB/s, "
            f"max relative error {100 * self.line.max_relative_error:.1f} %"
        )


def calibrate_collective(run: NcclRun, collective: str, ranks: int) -> CollectiveCalibration:
    """Fit (alpha per step, bus bandwidth) of ``collective`` on ``ranks`` ranks from ``run``.

    Checks that the output is of that collective on that many ranks: the
    group size in its "# Using devices" lines, and busbw / algbw = ``f(n)``
    on every row whose algbw is printed with three or more digits.
    """
    if ranks < 2:
        raise ConfigError(
            "bad_nccl_output", f"{run.source}: a collective needs >= 2 ranks, the axis has {ranks}"
        )
    if run.ranks is not None and run.ranks != ranks:
        raise ConfigError(
            "rank_mismatch",
            f"{run.source}: the output lists {run.ranks} ranks in rank 0's group but the mesh axis has "
            f"{ranks}; run it on one group of that axis (docs/calibration.md)",
            path=run.source,
        )
    factor = bus_factor(collective, ranks)
    for row in run.rows:
        if row.algbw >= 1.0:
            tolerance = 0.006 * (1 + factor) + 0.002 * row.busbw
            if abs(row.busbw - row.algbw * factor) > tolerance:
                raise ConfigError(
                    "collective_mismatch",
                    f"{run.source}:{row.line}: busbw / algbw = {row.busbw / row.algbw:.3f} but {collective} "
                    f"on {ranks} ranks has {factor:.3f}; is this the output of "
                    f"{_binary(collective)} on one group of {ranks} ranks?",
                    path=run.source,
                    line=row.line,
                )
    x = [factor * row.size_bytes for row in run.rows]
    line = fit_latency_bandwidth(x, [row.time_s for row in run.rows])
    if line.slope <= 0:
        raise ConfigError(
            "bad_nccl_fit",
            f"{run.source}: time does not grow with size (fitted {line.slope:.3g} s/byte); "
            f"scan up to large sizes (-e 1G)",
            path=run.source,
        )
    if line.intercept <= 0:
        raise ConfigError(
            "bad_nccl_fit",
            f"{run.source}: the fitted latency is {line.intercept * 1e6:.3g} us (not positive); "
            f"scan from small sizes (-b 8) so the latency is measured",
            path=run.source,
        )
    fit = CollectiveFit(line.intercept / algorithm_steps(collective, ranks), 1.0 / line.slope)
    sizes = (min(r.size_bytes for r in run.rows), max(r.size_bytes for r in run.rows))
    return CollectiveCalibration(collective, ranks, fit, line, run.source, sizes)


def _binary(collective: str) -> str:
    return next(b for b, c in NCCL_TESTS.items() if c == collective)


# ------------------------------------------------------------------ compute tables


@dataclass(frozen=True)
class GemmTiming:
    """One timed GEMM: ``batch`` products ``[m, k] x [k, n]`` in ``seconds``."""

    m: int
    n: int
    k: int
    dtype: str
    seconds: float
    line: int
    batch: int = 1

    @property
    def flops(self) -> float:
        """``2 batch m n k``: one multiply and one add per inner-product term."""
        return 2.0 * self.batch * self.m * self.n * self.k


def _csv_rows(text: str, source: str, columns: Sequence[str], code: str) -> list[tuple[int, dict[str, str]]]:
    lines = [
        (i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip() and not ln.startswith("#")
    ]
    if not lines:
        raise ConfigError(code, f"{source}: empty table; the first line is the header {','.join(columns)}")
    header_line, header = lines[0]
    names = [h.strip().lower() for h in next(csv.reader([header]))]
    missing = [c for c in columns if c not in names]
    if missing:
        raise ConfigError(
            code,
            f"{source}:{header_line}: header lacks column(s) {missing}; it must name {','.join(columns)}",
            path=source,
            line=header_line,
        )
    out = []
    for lineno, ln in lines[1:]:
        values = next(csv.reader(io.StringIO(ln)))
        if len(values) != len(names):
            raise ConfigError(
                code,
                f"{source}:{lineno}: {len(values)} values but the header has {len(names)} columns",
                path=source,
                line=lineno,
            )
        out.append((lineno, {n: v.strip() for n, v in zip(names, values)}))
    if not out:
        raise ConfigError(code, f"{source}: the table has a header but no rows", path=source)
    return out


GEMM_TIME_COLUMNS = ("seconds", "tflops")
"""A GEMM table times each row by one of these columns: seconds, or achieved TFLOP/s
(``2 batch m n k / seconds / 1e12``, what cuBLAS / mamf-finder style benchmarks print)."""


def parse_gemm_table(text: str, source: str = "<gemm table>") -> list[GemmTiming]:
    """CSV ``m,n,k,dtype,seconds`` or ``m,n,k,dtype,tflops`` (optional ``batch`` column, default
    1): one timed ``batch x [m,k] x [k,n]`` GEMM per row; ``#`` lines are comments
    (``docs/calibration.md``)."""
    header = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
    names = {h.strip().lower() for h in header.split(",")}
    timed = [c for c in GEMM_TIME_COLUMNS if c in names]
    if len(timed) > 1:
        raise ConfigError(
            "bad_gemm_table", f"{source}: the header has both seconds and tflops; keep one", path=source
        )
    column = timed[0] if timed else "seconds"
    rows = []
    for lineno, r in _csv_rows(text, source, ("m", "n", "k", "dtype", column), "bad_gemm_table"):
        rows.append(_gemm_row(r, column, source, lineno))
    return rows


def _gemm_row(r: Mapping[str, str], column: str, source: str, lineno: int) -> GemmTiming:
    def bad(message: str) -> ConfigError:
        return ConfigError("bad_gemm_table", f"{source}:{lineno}: {message}", path=source, line=lineno)

    try:
        m, n, k, batch = int(r["m"]), int(r["n"]), int(r["k"]), int(r.get("batch") or 1)
        value = float(r[column])
    except ValueError:
        raise bad(f"batch, m, n, k must be integers and {column} a number") from None
    dtype = r["dtype"].lower()
    if dtype not in GEMM_DTYPES:
        raise bad(
            f"dtype {r['dtype']!r}: the device peak is the dense fp16/bf16 tensor-core peak, "
            f"so time float16 or bfloat16 GEMMs"
        )
    if min(m, n, k, batch) < 1 or not (math.isfinite(value) and value > 0):
        raise bad(f"batch, m, n, k must be >= 1 and {column} > 0")
    seconds = value if column == "seconds" else 2.0 * batch * m * n * k / (value * 1e12)
    return GemmTiming(m, n, k, dtype, seconds, lineno, batch)


@dataclass(frozen=True)
class GemmFit:
    """The GEMM model's ceiling (``DeviceSpec.matmul_efficiency``) fitted to a GEMM table."""

    ceiling: float
    """fraction of ``peak_flops`` a large GEMM reaches, in (0, 1]"""
    points: int
    compute_bound: int
    """rows the model times by their compute term (the rows that set the ceiling)"""
    max_relative_error: float
    """max over the rows of |t_model - t| / t, with the fitted ceiling"""


def fit_gemm_ceiling(gemms: Sequence[GemmTiming], device: DeviceSpec) -> GemmFit:
    """Fit ``matmul_efficiency`` of :func:`autopar.costs.gemm_time` to timed GEMMs on ``device``.

    Each row's fill (its output tiles over ``device.compute_units``) and memory roofline
    (``batch (m k + k n + m n) 2 bytes / (memory_bandwidth x memory_efficiency)``) are the
    model's.  The rows the model times by their compute term set the ceiling:

        ceiling = sum(2 batch m n k / fill) / sum(seconds) / peak_flops

    (the FLOP-weighted fraction of peak, as each kernel would run if it filled the device).
    A row is compute-bound at ceiling ``c`` when ``2 batch m n k / (peak_flops c fill)`` is
    at least its memory roofline; starting from ``c = 1`` (the rows compute-bound at any
    ceiling), the set and ``c`` are updated until ``c`` settles (the set only grows as ``c``
    falls).  Thin rows (memory-bound) are left out of the ceiling but counted in
    ``max_relative_error``.
    """
    from autopar.costs import GEMM_TILE, gemm_time, memory_time  # the cost model, only when fitting

    rows: list[tuple[float, float, float]] = []  # FLOPs / fill, seconds, largest compute-bound ceiling
    for g in gemms:
        tiles = g.batch * math.ceil(g.m / GEMM_TILE) * math.ceil(g.n / GEMM_TILE)
        fill = min(1.0, tiles / device.compute_units) if device.compute_units > 0 else 1.0
        roofline = memory_time(device, float(g.batch) * (g.m * g.k + g.k * g.n + g.m * g.n) * 2)
        rows.append((g.flops / fill, g.seconds, g.flops / fill / device.peak_flops / roofline))
    ceiling, used = 1.0, 0
    for _ in range(len(rows) + 1):
        chosen = [(f, t) for f, t, bound in rows if bound >= ceiling]
        if not chosen:
            break
        new = sum(f for f, _ in chosen) / sum(t for _, t in chosen) / device.peak_flops
        settled = len(chosen) == used and abs(new - ceiling) <= 1e-9 * ceiling
        ceiling, used = new, len(chosen)
        if settled:
            break
    if not used:
        raise ConfigError(
            "bad_gemm_table",
            "every GEMM of the table is under its memory roofline's ridge, so none measures the compute "
            "ceiling: time large GEMMs (e.g. 4096 x 4096 x 4096)",
        )
    if ceiling > 1:
        raise ConfigError(
            "gemm_above_peak",
            f"the GEMM table runs at {ceiling:.2f}x the device's peak {device.peak_flops / 1e12:.0f} "
            f"TFLOP/s; choose the preset (or base profile) of the GPU that was timed",
        )
    fitted = replace(device, matmul_efficiency=ceiling)
    error = max(abs(gemm_time(fitted, g.batch, g.m, g.n, g.k, 2) - g.seconds) / g.seconds for g in gemms)
    return GemmFit(ceiling, len(gemms), used, error)


def parse_copy_table(text: str, source: str = "<copy table>") -> list[tuple[float, float]]:
    """CSV ``bytes,seconds``: device-memory copies, ``bytes`` = bytes read + bytes written."""
    rows = []
    for lineno, r in _csv_rows(text, source, ("bytes", "seconds"), "bad_copy_table"):
        try:
            nbytes, seconds = float(r["bytes"]), float(r["seconds"])
        except ValueError:
            raise ConfigError(
                "bad_copy_table",
                f"{source}:{lineno}: bytes and seconds must be numbers",
                path=source,
                line=lineno,
            ) from None
        if not (nbytes > 0 and math.isfinite(seconds) and seconds > 0):
            raise ConfigError(
                "bad_copy_table",
                f"{source}:{lineno}: bytes and seconds must be > 0",
                path=source,
                line=lineno,
            )
        rows.append((nbytes, seconds))
    return rows


def memory_efficiency(copies: Sequence[tuple[float, float]], memory_bandwidth: float) -> float:
    """Bandwidth fitted to the copy table (``t = A + bytes / beta``) / ``memory_bandwidth``, in (0, 1]."""
    line = fit_latency_bandwidth([b for b, _ in copies], [s for _, s in copies])
    if line.slope <= 0:
        raise ConfigError("bad_copy_table", "copy time does not grow with bytes; time larger copies")
    eff = 1.0 / line.slope / memory_bandwidth
    if eff > 1:
        raise ConfigError(
            "copy_above_peak",
            f"the copies run at {eff:.2f}x the device's memory bandwidth "
            f"{memory_bandwidth / GB:.0f} GB/s: count bytes as read + written, and choose the preset of "
            f"the GPU that was timed",
        )
    return eff


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
) -> Calibration:
    """A profile: ``base`` with every measured number replaced (:mod:`autopar.calibrate` docstring).

    ``runs[axis][collective]`` is the nccl-tests output of ``collective`` on one
    group of mesh ``axis``.  Each measured axis becomes a per-axis link of the
    profile; the intra-node (inter-node) link becomes the measured axis of that
    kind with the most ranks (the lowest axis on a tie).  Links, efficiencies
    and sources that nothing measured stay the base's.
    """
    shape = tuple(int(s) for s in mesh_shape)
    if math.prod(shape) != nodes * devices_per_node:
        raise ConfigError(
            "bad_mesh",
            f"mesh shape {list(shape)} has {math.prod(shape)} devices but cluster "
            f"{nodes}x{devices_per_node} has {nodes * devices_per_node}",
        )
    if not (runs or gemms or copies):
        raise ConfigError(
            "no_measurements", "no nccl-tests output for any mesh axis, GEMM table or copy table given"
        )
    sources = dict(base.sources)
    axes: list[AxisCalibration] = []
    device, links = base.device, base.links
    if runs:
        axes, mesh_links = _calibrate_axes(nodes, devices_per_node, shape, runs, sources)
        device, link_costs = _node_links(base, axes, nodes, devices_per_node, shape, sources)
        links = LinkTable(link_costs["intra_node"], link_costs["inter_node"], tuple(mesh_links))
    if copies:  # first: the GEMM fit's memory roofline uses the memory efficiency
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
            f"autopar.costs.gemm_time reproduces every row within {100 * fit.max_relative_error:.1f} %"
        )
    device = replace(device, name=name or f"{base.name}-calibrated")
    measured = [
        what
        for what, given in (("nccl-tests output", runs), ("GEMM timings", gemms), ("copy timings", copies))
        if given
    ]
    where = f"on a {nodes}x{devices_per_node} cluster, mesh {list(shape)}, " if runs else ""
    profile = ClusterProfile(
        device,
        links,
        description=(
            f"Calibrated {where}from {' and '.join(measured)}; unmeasured numbers from profile {base.name}."
        ),
        sources=sources,
    )
    return Calibration(profile, tuple(axes))


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


def read_results_dir(path: str | Path) -> dict[int, dict[str, NcclRun]]:
    """``{axis: {collective: run}}`` from ``RESULTS/axis<i>/<nccl-tests binary>[.ext]``."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(
            "results_not_found",
            f"{str(root)!r} is not a directory of axis<i>/<binary>.txt nccl-tests outputs",
        )
    runs: dict[int, dict[str, NcclRun]] = {}
    for sub in sorted(root.iterdir()):
        m = re.fullmatch(r"axis(\d+)", sub.name)
        if not (m and sub.is_dir()):
            continue
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
        if found:
            runs[int(m.group(1))] = found
    if not runs:
        raise ConfigError(
            "no_measurements",
            f"{str(root)!r} has no axis<i>/<binary>.txt files (e.g. axis0/all_reduce_perf.txt); "
            f"see docs/calibration.md",
        )
    return runs


# ------------------------------------------------------------------ CLI


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "results",
        nargs="?",
        help="directory with axis<i>/<nccl-tests binary>.txt outputs (leave out to calibrate compute only)",
    )
    p.add_argument("--cluster", help="NODESxDEVICES the tests ran on, e.g. 2x4 (with RESULTS)")
    p.add_argument("--mesh-shape", help="the mesh whose axes were measured, e.g. 4,2 (with RESULTS)")
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
    if args.results and not (args.cluster and args.mesh_shape):
        raise ConfigError(
            "missing_argument", "nccl-tests results need --cluster NODESxDEVICES and --mesh-shape"
        )
    if not (args.results or args.gemm_table or args.copy_table):
        raise ConfigError(
            "no_measurements",
            "give nccl-tests RESULTS, a --gemm-table or a --copy-table (docs/calibration.md)",
        )
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
        read_results_dir(args.results) if args.results else {},
        gemms=gemms,
        gemm_source=args.gemm_table or "",
        copies=copies,
        copy_source=args.copy_table or "",
        name=args.name,
    )
    profile = calibration.profile
    out = sys.stdout
    out.write(
        f"profile {profile.name}: {nodes}x{per} cluster, mesh {list(shape)}\n"
        if args.results
        else f"profile {profile.name}: compute only (links from {base.name})\n"
    )
    for axis in calibration.axes:
        where = "crosses nodes" if axis.crosses_nodes else "inside a node"
        out.write(f"  axis {axis.axis} ({axis.size} ranks, {where})\n")
        for c in axis.collectives:
            out.write(
                f"    {c.collective:<15} alpha {c.fit.alpha * 1e6:8.2f} us/step   "
                f"bus bandwidth {c.fit.bus_bandwidth / GB:8.2f} GB/s   "
                f"({c.line.points} timings, max error {100 * c.line.max_relative_error:.1f} %)\n"
            )
    dev = profile.device
    out.write(
        f"  matmul efficiency (large-GEMM ceiling) {dev.matmul_efficiency:.3f}"
        f"{'' if gemms else ' (from ' + base.name + ')'}, memory efficiency {dev.memory_efficiency:.3f}"
        f"{'' if copies else ' (from ' + base.name + ')'}\n"
    )
    profile.save(args.out)
    out.write(f"profile written to {args.out}\n")
    return 0
