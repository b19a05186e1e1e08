"""The time of one kernel on one device: a GEMM's roofline with its fill term
(:func:`gemm_time`) and a memory-bound kernel's stream (:func:`memory_time`), each from the
device's peaks and the kernel-level efficiencies its preset measured.
"""

from __future__ import annotations

import functools
import math

from autopar.hardware.devices import DeviceSpec

__all__ = ["gemm_efficiency", "gemm_time", "memory_time"]


GEMM_TILE = 128
"""Rows (and columns) of the output tile one thread block of a GEMM computes, elements.

NVIDIA, "Matrix Multiplication Background User's Guide" (DU-09799-001, 2023), section 2.3
"Typical Tile Dimensions in cuBLAS and Performance": cuBLAS tiles are 256x128, 128x256,
128x128 down to 64x64; 128x128 is the middle of that range."""


@functools.lru_cache(maxsize=1 << 16)
def gemm_time(dev: DeviceSpec, batch: int, m: int, n: int, k: int, itemsize: int) -> float:
    """Seconds of ``batch`` GEMMs ``[m, k] x [k, n]`` on one device: a roofline with a fill term.

    ``t = max(2 batch m n k / (peak_flops x matmul_efficiency x fill),
    batch (m k + k n + m n) itemsize / (memory_bandwidth x memory_efficiency))``

    * the compute term: ``matmul_efficiency`` is what a large, well-shaped GEMM reaches (the
      preset's kernel measurement, ``autopar/hardware/profiles``);
    * ``fill = min(1, tiles / compute_units)`` with ``tiles = batch ceil(m / T) ceil(n / T)``,
      ``T`` = :data:`GEMM_TILE`: a GEMM of fewer output tiles than the device has SMs leaves
      the others idle (NVIDIA "Matrix Multiplication Background", sections 2.1 and 3.2, wave
      quantization: one thread block per tile, one tile per SM at a time).  Only the first,
      partial wave is charged: past it cuBLAS's heuristics pick among tile shapes and
      split-K, which a one-tile quantization would overstate.  ``compute_units = 0``: 1;
    * the memory term: reading both operands and writing the result once (NVIDIA "GPU
      Performance Background User's Guide", section 4 "Understanding Performance":
      arithmetic intensity ``2 m n k / ((m k + k n + m n) bytes)`` against the device's
      ops:byte ratio); it binds for thin GEMMs (one of ``m``, ``n``, ``k`` small).

    Units: elements for ``m, n, k``, bytes for ``itemsize``, FLOP/s and bytes/s in ``dev``.
    Cached per (device, shape, itemsize): a cost table asks for the same shapes per layer.
    """
    flops = 2.0 * batch * m * n * k
    fill = 1.0
    if dev.compute_units > 0:
        tiles = batch * math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
        fill = min(1.0, tiles / dev.compute_units)
    compute = flops / (dev.peak_flops * dev.matmul_efficiency * fill)
    moved = float(batch) * (m * k + k * n + m * n) * itemsize
    return max(compute, memory_time(dev, moved))


def gemm_efficiency(dev: DeviceSpec, batch: int, m: int, n: int, k: int, itemsize: int = 2) -> float:
    """Achieved fraction of ``peak_flops`` of :func:`gemm_time`'s GEMMs: ``2 batch m n k /
    (t x peak_flops)``, in (0, ``matmul_efficiency``]; unitless."""
    return 2.0 * batch * m * n * k / (gemm_time(dev, batch, m, n, k, itemsize) * dev.peak_flops)


def memory_time(dev: DeviceSpec, moved_bytes: float) -> float:
    """Seconds to stream ``moved_bytes`` (read + written) through device memory:
    ``bytes / (memory_bandwidth x memory_efficiency)``, the roofline of a memory-bound kernel
    with the preset's measured fraction of the HBM bandwidth (``autopar/hardware/profiles``)."""
    return moved_bytes / (dev.memory_bandwidth * dev.memory_efficiency)
