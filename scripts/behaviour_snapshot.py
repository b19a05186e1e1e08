"""Write what the code computes on the bundled models into a folder, to diff two checkouts.

    python scripts/behaviour_snapshot.py OUT [--quick]

A move of code (a module renamed, a file split) must leave every plan, cost table, cache
key and report page byte-identical: run this before and after, then ``diff -r`` the two
folders.  It writes, on tiny-gpt, tiny-mt5, tiny-bert and mt5-base:

* the graph JSON of each bundled model (``autopar model``);
* every baseline plan (megatron, data-parallel, inferred, single-device) at K = 1 and
  K = 8, and megatron's best configuration on 4x8 (``autopar baseline``), each evaluated
  (``autopar evaluate --json``);
* the cost tables on a 2-D mesh under each runtime: every op's signatures and costs and
  every edge's matrix, with their content keys;
* deterministic solves (CP-SAT's deterministic limit, one worker) and their plans, wall
  times and other clock readings removed;
* the plan-cache key of each request, and report pages (``autopar report``) of a plan and
  a pipeline plan.

Content keys fold in a digest of the source files (``model_digest``, the plan cache's
code versions), which any move of code changes by design: the snapshot writes them with
that digest held fixed, so the rest of the key is compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
AUTOPAR = [sys.executable, "-m", "autopar.cli"]
VOLATILE = {
    "command_wall_s", "created_at", "deterministic_time", "elapsed_s", "greedy_s", "heuristic_s", "left_s",
    "phases_s", "time_cost_tables_s", "time_edges_s", "time_ops_s", "time_s", "wall_s",
}  # fmt: skip
"""Clock readings: the keys a solve or a table build reports its own time under."""


def run(out: Path, name: str, *args: str) -> Path:
    """``autopar ARGS``; its stdout into ``out/name.txt`` (its ``--out`` file is the caller's)."""
    env = dict(os.environ, AUTOPAR_NO_PROGRESS="1")
    done = subprocess.run([*AUTOPAR, *args], capture_output=True, text=True, env=env, cwd=out)
    stdout = done.stdout
    if stdout.lstrip().startswith("{"):
        stdout = json.dumps(scrub(json.loads(stdout)), indent=1, sort_keys=True)
    stdout = re.sub(r"(built|in) [0-9.]+ s\b", r"\1 _ s", stdout)
    (out / f"{name}.txt").write_text(f"exit {done.returncode}\n{stdout}\n--- stderr\n{done.stderr}")
    return out / f"{name}.txt"


def scrub(value: Any) -> Any:
    """``value`` without the clock readings a solve reports."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def cli_section(out: Path, models: list[str]) -> None:
    for model in models:
        run(out, f"model-{model}", "model", model, "--out", f"{model}.json")
        for kind in ("megatron", "data-parallel", "inferred", "single-device"):
            for k in (1, 8):
                plan = f"{model}-{kind}-k{k}.plan.json"
                run(
                    out, f"baseline-{model}-{kind}-k{k}", "baseline", kind, f"{model}.json",
                    "--cluster", "2x4", "--mesh-shape", "4,2", "--micro-batches", str(k), "--out", plan,
                )  # fmt: skip
                if (out / plan).exists():
                    run(out, f"evaluate-{model}-{kind}-k{k}", "evaluate", f"{model}.json", plan, "--json")
        run(out, f"costs-{model}", "costs", f"{model}.json", "--mesh-shape", "4,2", "--workers", "1")
    run(
        out, "baseline-mt5-megatron-best-4x8", "baseline", "megatron", "mt5-base.json", "--cluster", "4x8",
        "--micro-batches", "8", "--out", "mt5-base-megatron-best.plan.json",
    )  # fmt: skip
    run(
        out, "baseline-tiny-gpt-megatron-pp2", "baseline", "megatron", "tiny-gpt.json", "--cluster", "2x4",
        "--megatron-config", "tp=2,dp=2,pp=2", "--micro-batches", "4", "--out", "tiny-gpt-pp2.plan.json",
    )  # fmt: skip
    run(
        out, "report-mt5", "report", "mt5-base.json", "mt5-base-megatron-k8.plan.json",
        "--compare", "inferred", "data-parallel", "--out", "report-mt5.html",
    )  # fmt: skip
    run(
        out, "report-tiny-gpt-pp2", "report", "tiny-gpt.json", "tiny-gpt-pp2.plan.json",
        "--compare", "megatron", "--out", "report-tiny-gpt-pp2.html",
    )  # fmt: skip


def tables_section(out: Path, models: list[str]) -> None:
    """Every cost-table entry, model digest held fixed."""
    from autopar.cost import model_version
    from autopar.cost.build_tables import build_cost_tables
    from autopar.hardware.cluster import Cluster
    from autopar.hardware.mesh import Mesh
    from autopar.ir.graph import Graph

    model_version._DIGEST_CACHE[:] = ["fixed-digest"]
    for model in models:
        graph = Graph.from_json((out / f"{model}.json").read_text())
        for runtime in ("oneflow-0.9", "ideal", "megatron-lm"):
            for zero in (0, 2):
                mesh = Mesh(Cluster.parse("2x4", "a100-40g"), (4, 2))
                tables = build_cost_tables(graph, mesh, zero, workers=1, runtime=runtime)
                lines = []
                for name, table in sorted(tables.ops.items()):
                    sigs = [str(s) for s in table.signatures]
                    lines.append(json.dumps([name, tables.op_keys.get(name), sigs, _digest(table)]))
                for edge in tables.edges:
                    lines.append(json.dumps(["edge", _edge_text(edge), _digest(edge)]))
                (out / f"tables-{model}-{runtime}-z{zero}.jsonl").write_text("\n".join(lines) + "\n")


def _digest(obj: Any) -> str:
    """SHA-256 of an object's arrays and fields, in a stable order."""
    h = hashlib.sha256()
    for key, value in sorted(vars(obj).items()):
        if hasattr(value, "tobytes"):
            h.update(key.encode() + str(value.dtype).encode() + str(value.shape).encode() + value.tobytes())
        elif isinstance(value, (int, float, str, bool, tuple, type(None))) and key != "signatures":
            h.update(f"{key}={value!r}".encode())
    return h.hexdigest()[:24]


def _edge_text(edge: Any) -> str:
    return " ".join(
        f"{k}={v}" for k, v in sorted(vars(edge).items()) if not hasattr(v, "tobytes") and k != "key_cache"
    )


def solve_section(out: Path) -> None:
    """Deterministic solves and the cache key of each request."""
    from autopar.hardware.cluster import Cluster
    from autopar.ir.graph import Graph
    from autopar_cache.plans import plan_key
    from autopar_solver.options import SolverOptions
    from autopar_solver.planner import PlanRequest, plan

    fixed_versions = {"autopar": "0.1.0", "source": "fixed", "ortools": "fixed"}
    cases = [
        ("tiny-gpt", (2, 2), 1, "off", 1),
        ("tiny-gpt", (2, 2), 4, "auto", 1),
        ("tiny-mt5", (2, 2), 1, "off", 1),
        ("tiny-gpt", (2, 2), 4, "full", 2),
    ]
    for model, shape, k, ckpt, stages in cases:
        graph = Graph.from_json((out / f"{model}.json").read_text())
        cluster = Cluster.parse("1x4", "a100-40g")
        options = SolverOptions(
            time_limit_s=4, workers=1, deterministic=True, micro_batches=k, checkpointing=ckpt, stages=stages
        )
        request = PlanRequest(graph, cluster, shape, 8 * 2**30, 2, options)
        name = f"solve-{model}-{'x'.join(map(str, shape))}-k{k}-{ckpt}-s{stages}"
        (out / f"{name}.key").write_text(plan_key(request.to_key_dict(), fixed_versions) + "\n")
        result = plan(request)
        (out / f"{name}.plan.json").write_text(json.dumps(scrub(result.to_dict()), indent=1, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--quick", action="store_true", help="tiny models only")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    models = ["tiny-gpt", "tiny-mt5", "tiny-bert"] + ([] if args.quick else ["mt5-base"])
    cli_section(args.out, models)
    tables_section(args.out, models)
    solve_section(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
