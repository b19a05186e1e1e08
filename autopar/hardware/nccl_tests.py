"""nccl-tests output read and fitted: the rows of ``all_reduce_perf`` and its siblings
(:func:`parse_nccl_tests`), their bus-bandwidth factors, and one collective's latency and
bandwidth fitted by least squares (:func:`calibrate_collective`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopar.errors import ConfigError
from autopar.hardware.links import COLLECTIVE_NAMES, CollectiveFit

__all__ = [
    "NCCL_TESTS",
    "CollectiveCalibration",
    "LinearFit",
    "NcclRow",
    "NcclRun",
    "algorithm_steps",
    "bus_factor",
    "calibrate_collective",
    "fit_latency_bandwidth",
    "parse_nccl_tests",
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
    """Latency steps of the ring algorithm on ``n`` ranks (the multiplier of alpha in
    :mod:`autopar.hardware.collectives`)."""
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
    hosts: int | None = None
    """Distinct hosts (``on HOST``) of the ranks in rank 0's group; None when the output has none."""


_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\b(?:\s+\d+\s+on\s+(\S+))?")
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
    ranks: list[tuple[int, int | None, str | None]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _RANK_LINE.match(line)
            if m:
                ranks.append(
                    (int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None, m.group(3))
                )
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
    hosts: int | None = None
    if ranks:
        group0 = next((g for r, g, _ in ranks if r == 0), ranks[0][1])
        members = [host for _, g, host in ranks if g == group0]
        group_size = len(members)
        if all(host is not None for host in members):
            hosts = len(set(members))
    return NcclRun(source, tuple(rows), group_size, hosts)


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
