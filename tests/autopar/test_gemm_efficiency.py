"""The GEMM and memory-bound compute model (autopar.hardware.kernels.gemm_time): relations, not numbers."""

import itertools
from dataclasses import replace

import pytest

from autopar.hardware.cluster import PRESETS
from autopar.hardware.kernels import gemm_efficiency, gemm_time, memory_time

SHAPES = [
    (1, m, n, k)
    for m in (1, 16, 128, 1000, 4096, 32768)
    for n in (1, 64, 768, 4096, 24576)
    for k in (1, 64, 1024, 8192)
] + [(384, 2048, 2048, 96), (384, 2048, 96, 2048), (48, 512, 512, 64)]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_efficiency_is_at_most_the_measured_ceiling(preset):
    dev = PRESETS[preset]
    for shape in SHAPES:
        eff = gemm_efficiency(dev, *shape)
        assert 0 < eff <= dev.matmul_efficiency + 1e-12 <= 1 + 1e-12, shape


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_square_gemm_efficiency_grows_with_size_and_saturates(preset):
    dev = PRESETS[preset]
    effs = [gemm_efficiency(dev, 1, n, n, n) for n in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(effs))
    assert effs[0] < 0.5 * effs[-1]
    assert effs[-1] == pytest.approx(dev.matmul_efficiency)  # a large square GEMM reaches the ceiling


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_thin_gemms_are_less_efficient_than_a_square_one(preset):
    dev = PRESETS[preset]
    square = gemm_efficiency(dev, 1, 4096, 4096, 4096)
    for thin in ((1, 16, 4096, 4096), (1, 4096, 16, 4096), (1, 4096, 4096, 16)):
        assert gemm_efficiency(dev, *thin) < square / 2, thin


def test_efficiency_grows_with_the_thin_dim():
    dev = PRESETS["a100-80g"]
    effs = [gemm_efficiency(dev, 1, m, 8192, 8192) for m in (1, 8, 64, 512, 4096)]
    assert all(a <= b for a, b in itertools.pairwise(effs))
    assert effs[0] < effs[1] < effs[2] and effs[0] < effs[-1] / 10


def test_batched_gemms_fill_the_device_like_one_big_gemm():
    dev = PRESETS["a100-80g"]
    # 32 GEMMs of 256x256x4096 make 128 tiles: more than one of them alone
    assert gemm_efficiency(dev, 32, 256, 256, 4096) > gemm_efficiency(dev, 1, 256, 256, 4096)


def test_splitting_an_underfilled_gemm_does_not_divide_its_time():
    dev = PRESETS["a100-80g"]
    whole = gemm_time(dev, 1, 1024, 1024, 8192, 2)  # 64 tiles < 108 SMs
    half = gemm_time(dev, 1, 512, 1024, 8192, 2)
    assert half > whole / 2 and half <= whole
    big = gemm_time(dev, 1, 16384, 8192, 8192, 2)
    assert gemm_time(dev, 1, 8192, 8192, 8192, 2) == pytest.approx(big / 2)


def test_without_compute_units_only_the_roofline_applies():
    dev = replace(PRESETS["a100-80g"], compute_units=0)
    assert gemm_efficiency(dev, 1, 1024, 1024, 8192) == pytest.approx(dev.matmul_efficiency)
    # thin: memory-bound whatever the SM count
    assert gemm_efficiency(dev, 1, 1, 8192, 8192) < dev.matmul_efficiency / 10


def test_memory_time_is_bytes_over_achieved_bandwidth():
    dev = PRESETS["a100-40g"]
    assert memory_time(dev, 2e9) == pytest.approx(2 * memory_time(dev, 1e9))
    assert memory_time(dev, 1e9) > 1e9 / dev.memory_bandwidth  # below the datasheet peak


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_cite_their_compute_sources(preset):
    from autopar.hardware.cluster import PROFILES

    sources = PROFILES[preset].sources
    for key in ("device.matmul_efficiency", "device.memory_efficiency", "device.compute_units"):
        assert sources.get(key), key
    assert PRESETS[preset].compute_units > 0
