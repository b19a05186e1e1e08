"""Scale suite: GPT-3 sizes on 4-32 nodes of 8 A100-80GB, autopar against Megatron-LM at
its best configuration and ZeRO data parallelism, per optimizer step.

    .venv/bin/python -m benchmarks.scale_suite [--time-limit 90] [--rows 2.7b@4x8,13b@32x8]

Models (Brown et al. 2020, Table 2.1; seq 2048, vocabulary 51200 as Megatron-LM pads GPT-2's
50257): 2.7B = 32 layers x 2560 (32 heads), 6.7B = 32 x 4096 (32), 13B = 40 x 5120 (40).
Global batch 512 sequences: each micro-batch is a graph of 64 sequences (over the whole
mesh), so K = 8 micro-batches per optimizer step.

Per row:

* ``autopar``: ``autopar plan`` with no mesh shape (the mesh search), ZeRO-2, checkpointing
  ``auto``, 80 GiB per device, ``--time-limit`` (default 90 s), in its own process; wall time
  is that command's.
* ``megatron``: Megatron-LM at its best configuration (:mod:`autopar.baselines.configs`:
  tensor-parallel 1-8 inside a node, data-parallel across, DDP or the distributed
  optimizer, full recomputation, the ``megatron-lm`` runtime), the fastest that fits.
* ``data-parallel``: ZeRO-2 over all devices, the 1-D mesh.

Iteration ms is modelled (the preset's figures, not a measurement on GPUs); model FLOP/s
per GPU is ``72 B s l h^2 (1 + s/6h + V/12lh) / (iteration x GPUs)`` (Narayanan et al.
2021, eq. 3 without recomputation's extra forward: the model's FLOPs, not the hardware's).
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

GLOBAL_BATCH = 512
MICRO_BATCH = 64
SEQ = 2048
VOCAB = 51200


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int


MODELS = {
    "2.7b": Model("gpt3-2.7b", 32, 2560, 32),
    "6.7b": Model("gpt3-6.7b", 32, 4096, 32),
    "13b": Model("gpt3-13b", 40, 5120, 40),
}
CLUSTERS = ("4x8", "8x8", "16x8", "32x8")


def model_flops(m: Model, batch: int = GLOBAL_BATCH) -> float:
    """FLOPs of one optimizer step's model math (no recomputation): ``72 B s l h^2 (1 + s/6h
    + V/12lh)``, Narayanan et al. 2021 eq. 3 less the recomputed forward."""
    h, s, lay = m.hidden, SEQ, m.layers
    return 72 * batch * s * lay * h * h * (1 + s / (6 * h) + VOCAB / (12 * lay * h))


def _autopar(bin_dir: Path, graph: Path, cluster: str, limit: float, out: Path) -> tuple[dict, float]:
    cmd = [
        str(bin_dir / "autopar"), "plan", str(graph), "--cluster", cluster, "--preset", "a100-80g",
        "--memory", "80GiB", "--zero", "2", "--micro-batches", str(GLOBAL_BATCH // MICRO_BATCH),
        "--checkpointing", "auto", "--time-limit", str(limit), "--no-progress", "--out", str(out),
    ]  # fmt: skip
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        return {"error": (run.stderr or run.stdout).strip().splitlines()[-1:]}, wall
    return json.loads(out.read_text()), wall


def _baselines(graph_path: Path, cluster_text: str) -> dict[str, dict]:
    from autopar.baselines.search import search_baseline
    from autopar.hardware.cluster import Cluster
    from autopar.ir.graph import Graph
    from autopar.ir.training import TrainingConfig

    graph = Graph.load(str(graph_path))
    cluster = Cluster.parse(cluster_text, "a100-80g")
    budget = cluster.device.memory_bytes
    training = TrainingConfig(GLOBAL_BATCH // MICRO_BATCH, "auto")  # each system its own checkpointing
    out = {}
    for kind in ("megatron", "data-parallel"):
        # megatron: every configuration of Megatron-LM (pipelines too), each at the least
        # recomputation that fits
        chosen, _ = search_baseline(
            kind, graph, cluster, training, budget, zero_stage=2, runtime="oneflow-0.9"
        )
        assert chosen.plan is not None
        out[kind] = {
            "iteration_ms": chosen.plan.achieved_iteration_time_s * 1e3,
            "config": chosen.config.describe(),
            "fits": chosen.fits(budget),
            "memory_gib": chosen.plan.memory_per_device_bytes / 2**30,
        }
    return out


def run_row(model_key: str, cluster: str, limit: float, work: Path) -> dict:
    m = MODELS[model_key]
    bin_dir = Path(sys.executable).parent
    graph = work / f"{m.name}.json"
    if not graph.exists():
        subprocess.run(
            [
                str(bin_dir / "autopar"),
                "model",
                "gpt-1.3b",
                "--layers",
                str(m.layers),
                "--hidden",
                str(m.hidden),
                "--heads",
                str(m.heads),
                "--ffn",
                str(4 * m.hidden),
                "--vocab",
                str(VOCAB),
                "--seq",
                str(SEQ),
                "--batch",
                str(MICRO_BATCH),
                "--out",
                str(graph),
            ],
            check=True,
            capture_output=True,
        )
    plan, wall = _autopar(bin_dir, graph, cluster, limit, work / f"{m.name}-{cluster}.json")
    row = {"model": model_key, "cluster": cluster, "autopar_wall_s": wall, **_baselines(graph, cluster)}
    if "error" in plan:
        row["autopar"] = {"error": plan["error"]}
    else:
        pred = plan["predicted"]
        row["autopar"] = {
            "iteration_ms": pred.get("iteration_time_s", pred["step_time_s"]) * 1e3,
            "mesh": plan["mesh"]["shape"],
            "gap": (plan.get("solver") or {}).get("gap"),
            "memory_gib": plan["memory"]["per_device_bytes"] / 2**30,
        }
    return row


def _tflops(m: Model, cluster: str, iteration_ms: float) -> float:
    nodes, per = (int(x) for x in cluster.split("x"))
    return model_flops(m) / (iteration_ms / 1e3 * nodes * per) / 1e12


def row_text(row: dict) -> str:
    m = MODELS[row["model"]]
    a, meg, dp = row["autopar"], row["megatron"], row["data-parallel"]

    def cell(r: dict) -> str:
        if "error" in r:
            return f"no plan ({r['error']})"
        note = "" if r.get("fits", True) else ", over budget"
        return f"{r['iteration_ms']:.0f} ({_tflops(m, row['cluster'], r['iteration_ms']):.0f} TFLOP/s{note})"

    gap = "" if "error" in a or a.get("gap") is None else f"{100 * a['gap']:.1f} %"
    ratio = "" if "error" in a else f"{a['iteration_ms'] / meg['iteration_ms']:.2f}x"
    wall = f"{row['autopar_wall_s']:.0f} s"
    return (
        f"| {m.name} | {row['cluster']} | {cell(a)} | {a.get('mesh', '')} | {gap} | {wall} "
        f"| {cell(meg)} | {meg['config']} | {ratio} | {cell(dp)} |"
    )


HEADER = (
    "| model | cluster | autopar iteration ms (model TFLOP/s per GPU) | mesh | gap | wall "
    "| megatron best | its configuration | autopar / megatron | data-parallel (ZeRO-2) |\n"
    "|---|---|---|---|---:|---:|---|---|---:|---|"
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=90.0)
    ap.add_argument("--rows", default=None, help="comma-separated MODEL@CLUSTER (default: all 12)")
    args = ap.parse_args(argv)
    rows = (
        [tuple(r.split("@")) for r in args.rows.split(",")]
        if args.rows
        else [(mk, c) for mk in MODELS for c in CLUSTERS]
    )
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model_key, cluster in rows:
            print(row_text(run_row(model_key, cluster, args.time_limit, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
