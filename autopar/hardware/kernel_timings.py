"""GEMM and copy timings read and fitted: a GEMM table's rows (:func:`parse_gemm_table`) and the
ceiling that makes :func:`autopar.hardware.kernels.gemm_time` reproduce them
(:func:`fit_gemm_ceiling`); a copy table's rows and the memory efficiency they show.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from autopar.errors import ConfigError
from autopar.hardware.devices import DeviceSpec
from autopar.hardware.nccl_tests import GB, fit_latency_bandwidth

__all__ = [
    "GemmFit",
    "GemmTiming",
    "fit_gemm_ceiling",
    "memory_efficiency",
    "parse_copy_table",
    "parse_gemm_table",
]

GEMM_DTYPES = {"float16", "fp16", "half", "bfloat16", "bf16"}
"""GEMM dtypes the device peak (dense fp16/bf16 tensor core) applies to."""


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
    """Fit ``matmul_efficiency`` of :func:`autopar.hardware.kernels.gemm_time` to timed GEMMs on ``device``.

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
    from autopar.hardware.kernels import (  # the cost model, only when fitting
        GEMM_TILE,
        gemm_time,
        memory_time,
    )

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
