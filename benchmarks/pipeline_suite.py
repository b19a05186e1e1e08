"""Pipeline suite: the largest GPTs, autopar with stages against Megatron-LM's best PTD-P.

    .venv/bin/python -m benchmarks.pipeline_suite [--time-limit 120] [--rows 39b,13b,175b]

Rows (seq 2048, vocabulary 51200, ``a100-80g``, 80 GiB per device, every block recomputed):

* ``39b``: 48 layers x 8192 (64 heads) on 64x8, global batch 1536 as 24 micro-batches of 64
  sequences: Narayanan et al. 2021 Table 1's 39.1B row (tensor 8 x pipeline 2, micro-batch 2
  per data-parallel rank, measured 138 TFLOP/s per GPU: a 14.45 s iteration by its eq. 3);
* ``13b``: GPT-3 13B (40 x 5120, 40 heads; Brown et al. 2020) on 16x8, global batch 512 as 8
  micro-batches of 64;
* ``175b``: GPT-3 175B (96 x 12288, 96 heads) on 128x8, global batch 1536 as 24 of 64;
* ``40l``: issue 33's 40 layers x 6144 (48 heads) on 32x8, 8 micro-batches of 128.

Per row:

* ``autopar``: ``autopar plan --stages auto`` with no mesh shape, ZeRO-2, the default runtime
  (``oneflow-0.9``: what OneFlow runs), ``--time-limit`` (default 120 s), in its own process,
  wall time that command's; and the same under ``--runtime megatron-lm --zero 1`` (a runtime
  that reduces and gathers once per step, as Megatron-LM does): how autopar's search does
  where the runtime is Megatron's.
* ``megatron``: Megatron-LM at its best PTD-P configuration (:mod:`autopar.baselines.configs`:
  tensor 1-8 inside a node, pipeline across nodes dividing the layers, data-parallel for
  the rest dividing the micro-batch; DDP or the distributed optimizer; the ``megatron-lm``
  runtime), the fastest that fits 80 GiB.

Iteration ms is modelled (the preset's kernel-measured compute, not a GPU run); model
FLOP/s per GPU is ``72 B s l h^2 (1 + s/6h + V/12lh) / (iteration x GPUs)`` (Narayanan et
al. 2021 eq. 3 without the recomputed forward).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SEQ = 2048
VOCAB = 51200
MICRO_BATCH = 64


@dataclass(frozen=True)
class Row:
    name: str
    layers: int
    hidden: int
    heads: int
    cluster: str
    micro_batches: int
    measured_s: float | None = None
    batch: int = MICRO_BATCH
    """Sequences per micro-batch (over the whole mesh)."""
    """Megatron-LM's measured iteration at its published configuration, when there is one."""

    def model_flops(self) -> float:
        h, lay, b = self.hidden, self.layers, self.batch * self.micro_batches
        return 72 * b * SEQ * lay * h * h * (1 + SEQ / (6 * h) + VOCAB / (12 * lay * h))

    def tflops(self, iteration_s: float) -> float:
        nodes, per = (int(x) for x in self.cluster.split("x"))
        return self.model_flops() / (iteration_s * nodes * per) / 1e12


def _measured_39b() -> float:
    """Narayanan et al. 2021 Table 1, 39.1B: 138 TFLOP/s per GPU on 512 GPUs, batch 1536, eq. 3."""
    h, lay, b = 8192, 48, 1536
    flops = 96 * b * SEQ * lay * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * lay * h))
    return flops / (138e12 * 512)


ROWS = {
    "39b": Row("39.1B", 48, 8192, 64, "64x8", 24, _measured_39b()),
    "13b": Row("GPT-3 13B", 40, 5120, 40, "16x8", 8),
    "175b": Row("GPT-3 175B", 96, 12288, 96, "128x8", 24),
    "40l": Row("issue 33's 18.4B", 40, 6144, 48, "32x8", 8, batch=128),
}


def _graph(bin_dir: Path, row: Row, work: Path) -> Path:
    graph = work / f"{row.name.replace(' ', '_')}.json"
    if not graph.exists():
        subprocess.run(
            [
                str(bin_dir / "autopar"), "model", "gpt-1.3b", "--layers", str(row.layers),
                "--hidden", str(row.hidden), "--heads", str(row.heads), "--ffn", str(4 * row.hidden),
                "--vocab", str(VOCAB), "--seq", str(SEQ), "--batch", str(row.batch), "--out", str(graph),
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
    return graph


def _autopar(bin_dir: Path, graph: Path, row: Row, limit: float, out: Path, extra: list[str]) -> dict:
    cmd = [
        str(bin_dir / "autopar"), "plan", str(graph), "--cluster", row.cluster, "--preset", "a100-80g",
        "--memory", "80GiB", "--micro-batches", str(row.micro_batches), "--checkpointing", "full",
        "--stages", "auto", "--time-limit", str(limit), "--no-progress", "--out", str(out), *extra,
    ]  # fmt: skip
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        return {"error": (run.stderr or run.stdout).strip().splitlines()[-1:], "wall_s": wall}
    plan = json.loads(out.read_text())
    stages = len(plan.get("stages", [])) or 1
    first = plan["stages"][0] if stages > 1 else plan
    return {
        "iteration_s": plan["predicted"]["iteration_time_s"],
        "stages": stages,
        "mesh": first["mesh"]["shape"],
        "gap": (plan.get("solver") or {}).get("gap"),
        "wall_s": wall,
    }


def _megatron(graph_path: Path, row: Row) -> dict:
    from autopar.baselines.search import search_baseline
    from autopar.hardware.cluster import Cluster
    from autopar.ir.graph import Graph
    from autopar.ir.training import TrainingConfig

    graph = Graph.load(str(graph_path))
    cluster = Cluster.parse(row.cluster, "a100-80g")
    budget = cluster.device.memory_bytes
    training = TrainingConfig(row.micro_batches, "full")
    chosen, priced = search_baseline(
        "megatron", graph, cluster, training, budget, zero_stage=2, runtime="oneflow-0.9"
    )
    assert chosen.plan is not None
    return {
        "iteration_s": chosen.plan.achieved_iteration_time_s,
        "config": chosen.config.describe(),
        "fits": chosen.fits(budget),
        "tried": len(priced),
    }


def run_row(key: str, limit: float, work: Path) -> dict:
    row = ROWS[key]
    bin_dir = Path(sys.executable).parent
    graph = _graph(bin_dir, row, work)
    return {
        "row": key,
        "autopar": _autopar(bin_dir, graph, row, limit, work / f"{key}.json", []),
        "autopar_mlm": _autopar(
            bin_dir, graph, row, limit, work / f"{key}-mlm.json", ["--runtime", "megatron-lm", "--zero", "1"]
        ),
        "megatron": _megatron(graph, row),
    }


def row_text(result: dict) -> str:
    row = ROWS[result["row"]]
    meg = result["megatron"]

    def cell(r: dict) -> str:
        if "error" in r:
            return f"no plan ({r['error']})"
        gap = "" if r.get("gap") is None else f", gap {100 * r['gap']:.0f} %"
        return (
            f"{r['iteration_s'] * 1e3:.0f} ({row.tflops(r['iteration_s']):.0f} TFLOP/s; "
            f"{r['stages']} x {r['mesh']}{gap}; {r['wall_s']:.0f} s) "
            f"{r['iteration_s'] / meg['iteration_s']:.2f}x"
        )

    note = "" if meg["fits"] else ", over budget"
    measured = "" if row.measured_s is None else f"{row.measured_s * 1e3:.0f}"
    return (
        f"| {row.name} | {row.cluster} | {row.micro_batches} | {cell(result['autopar'])} "
        f"| {cell(result['autopar_mlm'])} | {meg['iteration_s'] * 1e3:.0f} "
        f"({row.tflops(meg['iteration_s']):.0f} TFLOP/s{note}) | {meg['config']} (best of {meg['tried']}) "
        f"| {measured} |"
    )


HEADER = (
    "| model | cluster | K | autopar, oneflow-0.9, ZeRO-2: iteration ms (model TFLOP/s per GPU; stages x "
    "stage mesh, gap; wall) vs megatron | autopar, megatron-lm runtime, ZeRO-1 | megatron best PTD-P ms "
    "| its configuration | Megatron-LM measured ms |\n|---|---|---:|---|---|---|---|---:|"
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (default: all)")
    args = ap.parse_args(argv)
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.rows.split(","):
            print(row_text(run_row(key, args.time_limit, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
