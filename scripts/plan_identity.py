"""Print what a refactoring must leave unchanged: model graphs and deterministic plans.

    python scripts/plan_identity.py graphs                  # content hash of every model graph
    python scripts/plan_identity.py plans [--cases a,b] [--time-limit 5]

``graphs`` prints one line per model of :data:`autopar.models.MODEL_NAMES` (and a few
overrides): its ops and :meth:`~autopar.ir.graph.Graph.content_hash`.  ``plans`` plans the
cases of ``benchmarks/solver.py`` (and a few small ones: a mesh search, a squeezed mesh,
ZeRO 3) with ``SolverOptions(deterministic=True)``, each in its own process, and prints
the objective (``repr``, exact), the plan's content hash (sha256 of the mesh, the ZeRO
stage and every op's signature) and the memory per device.  Run it with the old tree's
interpreter and the new one's and ``diff`` the outputs: a refactoring leaves every line
the same (the wall time is printed to stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ of this tree

GIB = 1024**3

GRAPHS: list[tuple[str, dict[str, Any]]] = [
    ("mt5-base", {}),
    ("t5-base", {}),
    ("gpt2-medium", {}),
    ("gpt-1.3b", {}),
    ("gpt-1.3b", {"layers": 48}),
    ("bert-large", {}),
    ("tiny-mt5", {}),
    ("tiny-t5", {}),
    ("tiny-gpt", {}),
    ("tiny-bert", {}),
    ("tiny-gpt", {"dropout": 0.0}),
    ("tiny-bert", {"dropout": 0.0}),
    ("tiny-mt5", {"dropout": 0.0}),
]

SMALL: dict[str, tuple[str, str, tuple[int, ...] | None, dict[str, Any], float | None, int]] = {
    # name: (model, cluster, mesh or None: search, overrides, budget GiB, zero stage)
    "tiny-gpt-2x2": ("tiny-gpt", "1x4", (2, 2), {}, None, 2),
    "tiny-bert-search": ("tiny-bert", "1x4", None, {}, None, 2),
    "tiny-mt5-2x1x2": ("tiny-mt5", "1x4", (2, 1, 2), {}, None, 2),
    "tiny-mt5-zero3": ("tiny-mt5", "2x4", (4, 2), {}, 40.0, 3),
    "tiny-t5-2x2x2": ("tiny-t5", "2x4", (2, 2, 2), {}, None, 1),
    "mt5-base-4x2x1": ("mt5-base", "2x4", (4, 2, 1), {}, 40.0, 2),
}


def plan_hash(plan: Any) -> str:
    """sha256 of what a plan decides: mesh, ZeRO stage, every op's signature."""
    body = {
        "mesh": list(plan.mesh.shape),
        "zero": plan.zero_stage,
        "ops": {name: str(sig) for name, sig in sorted(plan.signatures.items())},
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def run_one(name: str, limit: float) -> str:
    from autopar.errors import AutoparError
    from autopar.hardware.cluster import Cluster
    from autopar.models import build
    from autopar_solver.options import SolverOptions
    from autopar_solver.planner import PlanRequest, plan
    from benchmarks.solver import CASES

    options = SolverOptions(time_limit_s=limit, workers=2, deterministic=True)
    if name in SMALL:
        model, cluster_text, mesh, overrides, budget_gib, zero = SMALL[name]
        fraction = None
    else:
        case = CASES[name]
        model, cluster_text, mesh, overrides = case.model, case.cluster, case.mesh, case.overrides
        budget_gib, zero, fraction = case.budget_gib, case.zero, case.memory_fraction
    graph = build(model, **overrides)
    cluster = Cluster.parse(cluster_text, "a100-40g")
    budget = None if budget_gib is None else int(budget_gib * GIB)
    try:
        if fraction is not None:
            free = plan(PlanRequest(graph, cluster, mesh, None, 2, options))
            budget = int(fraction * free.memory_per_device_bytes)
        p = plan(PlanRequest(graph, cluster, mesh, budget, zero, options))
    except AutoparError as exc:
        return f"{name}: error {exc.code}: {str(exc)[:160]}"
    solver = p.solver or {}
    return (
        f"{name}: objective={solver.get('objective')!r} bound={solver.get('bound')!r} "
        f"status={solver.get('status')} plan={plan_hash(p)} mesh={list(p.mesh.shape)} "
        f"memory={p.memory_per_device_bytes!r}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["graphs", "plans"])
    ap.add_argument("--cases", default=None)
    ap.add_argument("--time-limit", type=float, default=5.0, help="deterministic units per solve")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.what == "graphs":
        from autopar.models import build

        for model, overrides in GRAPHS:
            g = build(model, **overrides)
            print(f"{model} {overrides}: ops={len(g.ops)} hash={g.content_hash()}")
        return
    if args.one:
        print(run_one(args.one, args.time_limit))
        return
    from benchmarks.solver import CASES

    names = args.cases.split(",") if args.cases else [*CASES, *SMALL]
    for name in names:
        t0 = time.perf_counter()
        cmd = [sys.executable, "scripts/plan_identity.py", "plans", "--one", name]
        out = subprocess.run([*cmd, "--time-limit", str(args.time_limit)], capture_output=True, text=True)
        lines = out.stdout.strip().splitlines()
        print(lines[-1] if lines else f"{name}: failed: {out.stderr.strip().splitlines()[-1:]}", flush=True)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
