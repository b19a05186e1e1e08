"""Synthetic nccl-tests output for the calibration tests (no GPU here).

:func:`render` prints what an nccl-tests binary prints, in its format (NVIDIA/nccl-tests
``src/common.cu``: the ``# nThread ...`` header, ``# Using devices`` rank lines, the
three column-header lines, result rows ``"%12li  %12li  %8s  %6s  %6i"`` + twice
``"  %7s  %6.2f  %6.2f  %5li"``, the ``# Out of bounds values`` and ``# Avg bus bandwidth``
footer), for times drawn from ``t = steps(n) * alpha + bus_bytes / beta`` times a
seeded multiplicative noise.  The first line says it is synthetic.

``python -m tests.autopar.nccl_output`` rewrites the committed fixtures under
``tests/autopar/data/calibration`` (a test checks they are up to date).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from autopar.hardware.nccl_tests import algorithm_steps, bus_factor

FIXTURES = Path(__file__).parent / "data" / "calibration"

BINARY = {
    "all-reduce": "all_reduce_perf",
    "all-gather": "all_gather_perf",
    "reduce-scatter": "reduce_scatter_perf",
    "all-to-all": "alltoall_perf",
    "send-recv": "sendrecv_perf",
}
REDOP = {
    "all-reduce": "sum",
    "reduce-scatter": "sum",
    "send-recv": "sum",
    "all-gather": "none",
    "all-to-all": "none",
}
WORD = 4  # float


@dataclass(frozen=True)
class Link:
    alpha: float
    """seconds per algorithm step"""
    bus_bandwidth: float
    """bytes/s"""


def _printf(fmt: str, *args: object) -> str:
    """C printf, to copy nccl-tests' own format strings verbatim."""
    return fmt % args


def _time_str(us: float) -> str:
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def render(
    collective: str,
    link: Link,
    *,
    world: int = 8,
    devices_per_node: int = 4,
    split_mask: int | None = None,
    min_bytes: int = 8,
    max_bytes: int = 1 << 30,
    noise: float = 0.015,
    seed: int = 0,
    device_name: str = "NVIDIA A100-SXM4-40GB",
) -> str:
    """Output of ``mpirun -np WORLD -x NCCL_TESTS_SPLIT_MASK=MASK <binary> -b MIN -e MAX -f 2``.

    With ``split_mask`` the world splits into groups of equal ``rank & mask``
    (nccl-tests' NCCL_TESTS_SPLIT_MASK); the group of rank 0 is what is timed.
    """
    rng = random.Random(seed)
    mask = split_mask if split_mask is not None else 0
    groups = [r & mask for r in range(world)]
    n = groups.count(groups[0])
    f = bus_factor(collective, n)
    lines = [
        f"# synthetic: rendered by tests/autopar/nccl_output.py ({collective}, {n} ranks, "
        f"alpha {link.alpha * 1e6:g} us/step, bus bandwidth {link.bus_bandwidth / 1e9:g} GB/s, "
        f"noise {100 * noise:g} %), not measured",
        f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: 2(factor) "
        f"warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    bus_ids = [0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD]
    for r in range(world):
        host = f"node-{r // devices_per_node + 1:02d}"
        dev = r % devices_per_node
        lines.append(
            f"#  Rank {r:2d} Group {groups[r]:2d} Pid {41200 + r:6d} on {host:>10s} device {dev:2d} "
            f"[0x{bus_ids[dev % len(bus_ids)]:02x}] {device_name}"
        )
    lines += [
        "#",
        _printf(
            "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          ",
            *[""] * 5,
        ),
        _printf(
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s",
            *("size", "count", "type", "redop", "root"),
            *("time", "algbw", "busbw", "#wrong") * 2,
        ),
        _printf(
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s",
            *("(B)", "(elements)", "", "", ""),
            *("(us)", "(GB/s)", "(GB/s)", "") * 2,
        ),
    ]
    busbw_sum, busbw_count = 0.0, 0
    size = min_bytes
    while size <= max_bytes:
        count = size // WORD
        if collective in ("all-gather", "reduce-scatter", "all-to-all"):
            count = count // n  # per-rank count; the size column is the whole buffer
            nbytes = count * n * WORD
        else:
            nbytes = count * WORD
        row = f"{nbytes:12d}  {count:12d}  {'float':>8s}  {REDOP[collective]:>6s}  {-1:6d}"
        for _ in ("out-of-place", "in-place"):
            if nbytes == 0:
                t = 1.5e-6 * (1 + noise * rng.uniform(-1, 1))  # NCCL returns at once on a 0-count call
            else:
                ideal = algorithm_steps(collective, n) * link.alpha + f * nbytes / link.bus_bandwidth
                t = ideal * (1 + noise * rng.uniform(-1, 1))
            algbw = nbytes / t / 1e9
            busbw = algbw * f
            row += f"  {_time_str(t * 1e6)}  {algbw:6.2f}  {busbw:6.2f}  {0:5d}"
            busbw_sum += busbw
            busbw_count += 1
        lines.append(row)
        size *= 2
    lines += [
        "# Out of bounds values : 0 OK",
        f"# Avg bus bandwidth    : {busbw_sum / busbw_count:g} ",
        "#",
        "",
    ]
    return "\n".join(lines) + "\n"


# The committed fixture: a 2x4 A100 cluster measured for mesh [4, 2].  Axis 0 groups
# {0,2,4,6} (two GPUs on each node: NCCL_TESTS_SPLIT_MASK=0x1), axis 1 groups {0,1}
# (one node: NCCL_TESTS_SPLIT_MASK=0x6).  No all-to-all: it keeps the link's default.
FIXTURE_LINKS: dict[int, tuple[int, dict[str, Link]]] = {
    0: (
        0x1,
        {
            "all-reduce": Link(9e-6, 18.5e9),
            "all-gather": Link(8e-6, 19.5e9),
            "reduce-scatter": Link(8e-6, 19.0e9),
            "send-recv": Link(14e-6, 21.0e9),
        },
    ),
    1: (
        0x6,
        {
            "all-reduce": Link(4e-6, 120e9),
            "all-gather": Link(3.5e-6, 115e9),
            "reduce-scatter": Link(3.5e-6, 112e9),
            "send-recv": Link(6e-6, 95e9),
        },
    ),
}

# The committed runs over whole nodes: 8-GPU A100 nodes with eight 100 Gb/s RoCE cards whose
# fabric slows as nodes are added (about 100 GB/s all-reduce bus bandwidth on 2 nodes, 58 on 4,
# 40 on 6: the figures of NVIDIA/nccl-tests#169), and a send/recv across 2 nodes at 12 GB/s
# (0.96 of a card's 12.5 GB/s line rate, NCCL's maintainers' figure for a 100G card).
NODE_FIXTURE = "roce-8x100g"
NODE_DEVICES = 8
NODE_CARD_GBPS = 100.0
NODE_LINKS: dict[int, dict[str, Link]] = {
    2: {"all-reduce": Link(6e-6, 100e9), "send-recv": Link(12e-6, 12e9)},
    4: {"all-reduce": Link(6e-6, 58e9)},
    6: {"all-reduce": Link(6e-6, 40e9)},
}

GEMM_FIXTURE = """\
# synthetic: rendered by tests/autopar/nccl_output.py at 60 % of 312 TFLOP/s, not measured
m,n,k,dtype,seconds
{rows}"""
GEMM_TFLOPS_FIXTURE = """\
# synthetic: rendered by tests/autopar/nccl_output.py from autopar.hardware.kernels.gemm_time on a100-40g
# with matmul_efficiency 0.7, not measured
batch,m,n,k,dtype,tflops
{rows}"""
GEMM_TFLOPS_CEILING = 0.7
"""The large-GEMM ceiling the ``gemm-tflops.csv`` fixture is rendered with."""
GEMM_TFLOPS_SHAPES = (
    (1, 4096, 4096, 4096),
    (1, 8192, 8192, 8192),
    (1, 16384, 4096, 1024),
    (1, 2048, 12288, 4096),
    (1, 1024, 1024, 1024),
    (1, 512, 512, 512),
    (1, 16, 4096, 4096),
    (96, 2048, 2048, 128),
    (96, 2048, 128, 2048),
)
"""batch, m, n, k: large, under-filled (1024^3, 512^3), thin (m = 16) and attention-like GEMMs."""
COPY_FIXTURE = """\
# synthetic: rendered by tests/autopar/nccl_output.py at 1.2 TB/s + 5 us, not measured
bytes,seconds
{rows}"""


def fixture_files() -> dict[str, str]:
    """Relative path -> text of every committed calibration fixture."""
    files: dict[str, str] = {}
    for axis, (mask, links) in FIXTURE_LINKS.items():
        for i, (collective, link) in enumerate(links.items()):
            text = render(collective, link, split_mask=mask, seed=100 * axis + i)
            files[f"2x4-mesh4x2/axis{axis}/{BINARY[collective]}.txt"] = text
    for nodes, links in NODE_LINKS.items():
        for i, (collective, link) in enumerate(links.items()):
            text = render(
                collective,
                link,
                world=nodes * NODE_DEVICES,
                devices_per_node=NODE_DEVICES,
                seed=1000 + 10 * nodes + i,
                device_name="NVIDIA A100-SXM4-80GB",
            )
            files[f"{NODE_FIXTURE}/nodes{nodes}/{BINARY[collective]}.txt"] = text
    gemms = [(4096, 4096, 4096), (8192, 1024, 4096), (2048, 16384, 4096), (16384, 4096, 1024)]
    files["gemm.csv"] = GEMM_FIXTURE.format(
        rows="".join(f"{m},{n},{k},bfloat16,{2 * m * n * k / (0.6 * 312e12):.6e}\n" for m, n, k in gemms)
    )
    files["gemm-tflops.csv"] = GEMM_TFLOPS_FIXTURE.format(rows="".join(_gemm_tflops_rows()))
    files["copy.csv"] = COPY_FIXTURE.format(
        rows="".join(f"{b},{5e-6 + b / 1.2e12:.6e}\n" for b in (1 << 20, 1 << 24, 1 << 28, 1 << 30))
    )
    return files


def _gemm_tflops_rows() -> list[str]:
    from dataclasses import replace

    from autopar.hardware.cluster import PRESETS
    from autopar.hardware.kernels import gemm_time

    dev = replace(PRESETS["a100-40g"], matmul_efficiency=GEMM_TFLOPS_CEILING)
    return [
        f"{b},{m},{n},{k},float16,{2 * b * m * n * k / gemm_time(dev, b, m, n, k, 2) / 1e12:.4f}\n"
        for b, m, n, k in GEMM_TFLOPS_SHAPES
    ]


def write_fixtures(root: Path = FIXTURES) -> None:
    for rel, text in fixture_files().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


if __name__ == "__main__":
    write_fixtures()
