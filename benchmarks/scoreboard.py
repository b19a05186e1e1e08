"""Scoreboard: autopar with its defaults against Megatron-LM at its best configuration, both
priced as Megatron-LM runs them (runtime ``megatron-lm``; ZeRO-1, the distributed optimizer, or ZeRO-3, FSDP).

    .venv/bin/python -m benchmarks.scoreboard [--time-limit 120] [--rows 6.7b,mt5] [--json out.json]

Per row:

* ``autopar``: ``autopar plan`` with its defaults (no mesh shape, ``--checkpointing auto``,
  ``--stages auto``), ``--runtime megatron-lm --zero auto`` (ZeRO-1, the distributed optimizer,
  and ZeRO-3, as Megatron-FSDP shards, each solved in turn: Megatron-LM's search has both), the
  row's memory, ``--time-limit`` (default 120 s), in its own process (wall time is that
  command's).  The gap is the proven one: for a pipeline it includes the bubble; under
  ``--stages auto`` it is over every number of stages (``stage_search_gap``), under ``--zero
  auto`` over both ZeRO stages (``zero_search_gap``).
* ``Megatron-LM runs it``: whether ``autopar export megatron`` expresses autopar's plan in
  Megatron-LM's arguments (a plan that splits weights over the data-parallel axis, as FSDP
  does for some layers only, runs on OneFlow, not on Megatron-LM), else its first reason.
* ``megatron``: :func:`autopar.baselines.search.search_baseline`: every tp x pp x dp layout
  Megatron-LM runs, with its options (sequence parallelism, interleaving, the distributed
  optimizer, recomputation none / selective modules / full / full:N), the fastest that fits.
* ``where``: each system's compute, recomputation, exposed communication (what its runtime
  does not hide), pipeline bubble (ms per optimizer step, of the slowest stage for a
  pipeline) and memory per device: the difference between the two rows comes from these.

Rows are split as the guide asks: ``dev`` rows were examined while this wave's rules were
written (the sequence-parallel walk, the recompute policies); ``eval`` rows were not looked
at before their first run here.  Every figure is modelled (the preset's kernel-measured
compute, NCCL-shaped collectives), not measured on GPUs.
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
from typing import Any

VOCAB = 51200
SEQ = 2048


@dataclass(frozen=True)
class Row:
    key: str
    name: str
    split: str
    """``dev`` or ``eval`` (module docstring)."""
    cluster: str
    preset: str
    micro_batches: int
    model: str = "gpt-1.3b"
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    batch: int | None = 64
    """Sequences per micro-batch over the whole mesh."""
    published: str = ""
    """Megatron-LM's own measurement of this job, when there is one (a check, never fitted)."""

    @property
    def memory(self) -> str:
        return "40GiB" if self.preset == "a100-40g" else "80GiB"


ROWS = {
    r.key: r
    for r in (
        Row("6.7b", "GPT-3 6.7B", "dev", "4x8", "a100-40g", 8, layers=32, hidden=4096, heads=32),
        Row("22b", "22B GPT (48 x 6144)", "dev", "1x8", "a100-80g", 4, layers=48, hidden=6144, heads=48,
            batch=4),
        Row("2.7b", "GPT-3 2.7B", "eval", "4x8", "a100-40g", 8, layers=32, hidden=2560, heads=32),
        Row("13b", "GPT-3 13B", "eval", "16x8", "a100-80g", 8, layers=40, hidden=5120, heads=40),
        Row("18.4b", "18.4B GPT (40 x 6144)", "eval", "32x8", "a100-80g", 8, layers=40, hidden=6144, heads=48,
            batch=128),
        Row("39.1b", "39.1B GPT (48 x 8192)", "eval", "64x8", "a100-80g", 24, layers=48, hidden=8192,
            heads=64, published="Megatron-LM measured 14,453 ms at tp=8, pp=2 (Narayanan et al. 2021, "
            "Table 1: 138 TFLOP/s per GPU, batch 1536, eq. 3)"),
        Row("175b", "GPT-3 175B", "eval", "128x8", "a100-80g", 24, layers=96, hidden=12288, heads=96),
        Row("mt5", "MT5-base (the seed job)", "eval", "2x4", "a100-40g", 1, model="mt5-base", batch=None),
    )
}  # fmt: skip


def _graph(bin_dir: Path, row: Row, work: Path) -> Path:
    graph = work / f"{row.key}.json"
    if graph.exists():
        return graph
    cmd = [str(bin_dir / "autopar"), "model", row.model, "--out", str(graph)]
    if row.layers:
        assert row.hidden and row.heads
        cmd += ["--layers", str(row.layers), "--hidden", str(row.hidden), "--heads", str(row.heads)]
        cmd += ["--ffn", str(4 * row.hidden), "--vocab", str(VOCAB), "--seq", str(SEQ)]
    if row.batch:
        cmd += ["--batch", str(row.batch)]
    subprocess.run(cmd, check=True, capture_output=True)
    return graph


def _autopar(bin_dir: Path, graph: Path, row: Row, limit: float, out: Path) -> dict[str, Any]:
    cmd = [
        str(bin_dir / "autopar"), "plan", str(graph), "--cluster", row.cluster, "--preset", row.preset,
        "--memory", row.memory, "--runtime", "megatron-lm", "--zero", "auto",
        "--micro-batches", str(row.micro_batches), "--time-limit", str(limit), "--no-progress",
        "--out", str(out),
    ]  # fmt: skip
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        return {"error": (run.stderr or run.stdout).strip().splitlines()[-1:], "wall_s": wall}
    data = json.loads(out.read_text())
    solver = data.get("solver") or {}
    gap = solver.get("zero_search_gap", solver.get("stage_search_gap", solver.get("gap")))
    return {"plan": str(out), "gap": gap, "wall_s": wall}


def _megatron(graph: Any, row: Row) -> dict[str, Any]:
    from autopar.baselines.search import search_baseline
    from autopar.hardware.cluster import Cluster
    from autopar.ir.training import TrainingConfig

    cluster = Cluster.parse(row.cluster, row.preset)
    budget = cluster.device.memory_bytes
    t0 = time.perf_counter()
    chosen, priced = search_baseline(
        "megatron", graph, cluster, TrainingConfig(row.micro_batches, "auto"), budget,
        zero_stage=1, runtime="megatron-lm",
    )  # fmt: skip
    assert chosen.plan is not None
    return {
        "plan": chosen.plan,
        "config": chosen.config.describe(),
        "fits": chosen.fits(budget),
        "tried": len(priced),
        "wall_s": time.perf_counter() - t0,
    }


def where(graph: Any, plan: Any) -> dict[str, float]:
    """Milliseconds per optimizer step of recomputation, exposed communication and bubble (of
    the slowest stage for a pipeline), the achieved iteration, and GiB per device."""
    from autopar.cost.evaluate import evaluate
    from autopar.pipeline.evaluate import evaluate_pipeline
    from autopar.pipeline.plan import PipelinePlan

    if isinstance(plan, PipelinePlan):
        pev = evaluate_pipeline(graph, plan)
        slowest = max(pev.stages, key=lambda s: s.micro_batch_time_s)
        ev, bubble = slowest.evaluation, pev.bubble_fraction * pev.iteration_time_s
        achieved, memory = pev.achieved_iteration_time_s, pev.memory_per_device_bytes
    else:
        ev, bubble = evaluate(graph, plan), 0.0
        achieved, memory = ev.achieved_iteration_time_s, ev.memory.total
    k = ev.training.micro_batches
    comm = sum(e.time_s * (k * e.per_micro_batch + e.per_step) for e in ev.edges)
    out = {
        "iteration_ms": achieved * 1e3,
        "recompute_ms": ev.recompute_time_s * 1e3,
        "exposed_comm_ms": max(0.0, comm - ev.hidden_comm_time_s) * 1e3,
        "bubble_ms": bubble * 1e3,
        "memory_gib": memory / 2**30,
    }
    # the rest: compute (of the slowest stage) and what the schedule does not overlap
    out["compute_ms"] = out["iteration_ms"] - out["recompute_ms"] - out["exposed_comm_ms"] - out["bubble_ms"]
    return out


def _load_plan(path: Path) -> Any:
    from autopar.ir.plan import Plan
    from autopar.pipeline.plan import PipelinePlan

    text = path.read_text()
    return PipelinePlan.from_json(text) if '"autopar.pipeline/v1"' in text else Plan.from_json(text)


def run_row(key: str, limit: float, work: Path) -> dict[str, Any]:
    from autopar.ir.graph import Graph

    row = ROWS[key]
    bin_dir = Path(sys.executable).parent
    graph_path = _graph(bin_dir, row, work)
    graph = Graph.load(str(graph_path))
    mine = _autopar(bin_dir, graph_path, row, limit, work / f"{key}-plan.json")
    theirs = _megatron(graph, row)
    out: dict[str, Any] = {"row": key, "split": row.split}
    out["megatron"] = {k: v for k, v in theirs.items() if k != "plan"} | where(graph, theirs["plan"])
    if "error" in mine:
        out["autopar"] = mine
        return out
    plan = _load_plan(Path(mine["plan"]))
    stages = getattr(plan, "stages", None)
    first = stages[0] if stages else plan
    shape = "x".join(str(n) for n in first.mesh.shape)
    layout = f"{len(stages)} stages x [{shape}]" if stages else f"[{shape}]"
    if getattr(plan, "virtual_stages", 1) > 1:
        layout += f", v={plan.virtual_stages}"
    layout += f", ZeRO-{first.zero_stage}"
    out["autopar"] = {
        "gap": mine["gap"],
        "wall_s": mine["wall_s"],
        "layout": layout,
        "megatron_runs_it": _megatron_runs(graph, plan),
    } | where(graph, plan)
    return out


def _megatron_runs(graph: Any, plan: Any) -> str:
    """``yes`` when ``autopar export megatron`` expresses the plan in Megatron-LM's arguments,
    else why not (its first reason)."""
    from autopar.baselines.megatron.export import megatron_arguments
    from autopar.errors import AutoparError

    try:
        megatron_arguments(graph, plan)
    except AutoparError as exc:
        reasons = exc.details.get("reasons") or [exc.message]
        return f"no: {reasons[0]}"
    return "yes"


def row_text(r: dict[str, Any]) -> str:
    row = ROWS[r["row"]]
    meg = r["megatron"]
    head = f"| {row.name} | {row.split} | {row.cluster} {row.preset} | {row.micro_batches} "
    if "error" in r["autopar"]:
        return head + f"| no plan: {r['autopar']['error']} | {meg['iteration_ms']:.0f} | | | |"
    a = r["autopar"]
    gap = "n/a" if a["gap"] is None else f"{100 * a['gap']:.1f} %"
    speed = meg["iteration_ms"] / a["iteration_ms"]

    def parts(x: dict[str, Any]) -> str:
        return (
            f"compute {x['compute_ms']:.0f}, rc {x['recompute_ms']:.0f}, comm {x['exposed_comm_ms']:.0f}, "
            f"bubble {x['bubble_ms']:.0f}, "
            f"{x['memory_gib']:.1f} GiB"
        )

    fits = "" if meg["fits"] else ", none fits"
    if row.published:
        fits += f"; {row.published}"
    return (
        head + f"| {a['iteration_ms']:.0f} ({a['layout']}; gap {gap}; {a['wall_s']:.0f} s; "
        f"Megatron-LM runs it: {a['megatron_runs_it']}) "
        f"| {meg['iteration_ms']:.0f} ({meg['config']}; best of {meg['tried']}{fits}) | **{speed:.2f}x** "
        f"| {parts(a)} | {parts(meg)} |"
    )


HEADER = (
    "| model | set | cluster | K | autopar ms (layout; proven gap; wall) "
    "| Megatron-LM best ms (configuration) "
    "| speed-up | autopar: compute, recompute, exposed comm, bubble ms; memory | Megatron-LM: the same |\n"
    "|---|---|---|---:|---|---|---:|---|---|"
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (default: all)")
    ap.add_argument("--json", default=None, help="also write every row's figures here")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the graphs and plans in this folder")
    args = ap.parse_args(argv)
    print(HEADER, flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for key in args.rows.split(","):
            result = run_row(key, args.time_limit, work)
            results.append(result)
            print(row_text(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
