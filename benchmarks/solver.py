"""End-to-end planning benchmark: wall time, gap, phases and peak RSS per case.

    .venv/bin/python -m benchmarks.solver [--cases mt5-base-4x2,...] [--time-limit 30]
    .venv/bin/python -m benchmarks.solver --promise [--time-limit 5]
    .venv/bin/python -m benchmarks.solver --warm [--time-limit 10]
    .venv/bin/python -m benchmarks.solver --scale [--time-limit 30]
    .venv/bin/python -m benchmarks.solver --imported /tmp/of-mt5 [--cases oneflow-mt5-imported]

Each case runs in its own process (so its peak RSS is its own): the model graph is
built and written to a JSON file first, then the clock starts, and the graph is
loaded, the cost tables built from an empty memo, solved and verified by
:func:`autopar_solver.planner.plan` under the time limit, which bounds all of it.
``wall`` is that clock when the plan (or the error) came back; ``tables`` and
``solve`` are the planner's own phase times; ``gap`` is the proven relative gap.
The memory-bound cases first plan without a budget, then with 60 % (95 %) of that
plan's peak as the budget, and report the second run.

``--promise`` runs the time-limit cases instead (a 100k-op graph, a 64x64
cluster, a ``[1,1,1,8]`` mesh, mt5-base on ``4,2,1`` and ``2,2,2``): the wall
must stay within the limit + 2 s, with a verified plan or a ``time_limit`` error.

``--warm`` runs the warm cases: in one process, a first untimed run fills the memo
(cost tables and the solve memo, :mod:`autopar_solver.solve_memo`), then the clock
starts for the timed run: the same request again; a 30 GiB budget after 40 GiB (the
first plan fits it: answered by the memo's entry without a budget); ZeRO 3 after ZeRO 2
(another problem on the same graph: the optimizer ops' tables and the whole solve are new).

``--scale`` runs the three-axis cases (mt5-base on ``[2,2,2]`` of 2x4, ``[4,2,4]`` and
``[2,2,8]`` of 4x8), the mesh search of mt5-base on 2x4 and 4x8 (every factorisation with
up to 3 axes; a second line lists the shapes solved (iteration time and bound), those proved
worse by their bound and those without a plan) and the 100k-op graph on 4x8 ``a100-80g``
(meant for ``--time-limit 60``, ``--cases gpt-100k-ops-4x8-80g``).  The cost tables across
1 vs 2 RQ workers are ``python -m benchmarks.table_workers``.

``--imported DIR`` adds the case ``oneflow-mt5-imported``: the graph of a real
OneFlow MT5 job, built and imported by ``benchmarks/oneflow_mt5.py --out DIR``
(``DIR/graph.json``), planned on mesh ``[4, 2]`` of 2x4.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class Case:
    model: str
    cluster: str
    mesh: tuple[int, ...] | None
    overrides: dict[str, Any] = field(default_factory=dict)
    memory_fraction: float | None = None
    """Budget as this fraction of the unconstrained plan's peak (None: ``budget_gib``)."""
    budget_gib: float | None = 40.0
    """Per-device budget (the preset's 40 GiB); None: no budget."""
    graph_file: str | None = None
    """A graph JSON to load instead of building ``model`` (an imported OneFlow job)."""
    zero: int = 2
    """ZeRO stage of the timed run."""
    warm_from_zero: int | None = None
    """Warm case: first plan the same graph and mesh with this ZeRO stage, untimed, in the
    same process and memo (cost tables and solve memo); then time the run."""
    warm_from_budget_gib: float | None = 40.0
    """The first run's budget in a warm case (None: no budget)."""
    preset: str = "a100-40g"
    """The cluster's device preset."""


CASES: dict[str, Case] = {
    "mt5-base-4x2": Case("mt5-base", "2x4", (4, 2)),
    "mt5-base-2x4": Case("mt5-base", "2x4", (2, 4)),
    "t5-base": Case("t5-base", "2x4", (4, 2)),
    "gpt2-medium": Case("gpt2-medium", "2x4", (4, 2)),
    "bert-large": Case("bert-large", "2x4", (4, 2)),
    "gpt-1.3b-48l": Case("gpt-1.3b", "2x4", (4, 2), {"layers": 48}),
    # 40 GiB is proven infeasible for it (its memory floor is 40.45 GiB): no budget
    "gpt-50k-ops": Case("gpt2-medium", "2x4", (4, 2), {"layers": 290}, budget_gib=None),
    "gpt-50k-ops-40g": Case("gpt2-medium", "2x4", (4, 2), {"layers": 290}),
    "mt5-base-mem60": Case("mt5-base", "2x4", (4, 2), memory_fraction=0.6),
    # the least memory any plan needs is 2.91 GiB, 68 % of the unconstrained plan's 4.29 GiB
    "mt5-base-mem70": Case("mt5-base", "2x4", (4, 2), memory_fraction=0.70),
    "mt5-base-mem95": Case("mt5-base", "2x4", (4, 2), memory_fraction=0.95),
}
WARM: dict[str, Case] = {
    # the same request again: every cost-table entry and the solve are in the memo
    "mt5-base-4x2-warm": Case("mt5-base", "2x4", (4, 2), warm_from_zero=2),
    "mt5-base-2x4-warm": Case("mt5-base", "2x4", (2, 4), warm_from_zero=2),
    # another budget that the first plan fits: answered by the entry without a budget
    "mt5-base-4x2-30GiB-after-40GiB": Case("mt5-base", "2x4", (4, 2), budget_gib=30.0, warm_from_zero=2),
    # another problem on the same graph: the op tables of the optimizer ops and the solve are new
    "mt5-base-4x2-zero3-after-zero2": Case("mt5-base", "2x4", (4, 2), zero=3, warm_from_zero=2),
}
IMPORTED = "oneflow-mt5-imported"
"""Case name of ``--imported``: the job of ``benchmarks/oneflow_mt5.py``, mesh [4, 2] on 2x4."""
PROMISE: dict[str, Case] = {
    "gpt-100k-ops": Case("gpt2-medium", "2x4", (4, 2), {"layers": 580}),
    "mt5-base-64x64": Case("mt5-base", "64x64", (64, 64)),
    "mt5-base-1,1,1,8": Case("mt5-base", "1x8", (1, 1, 1, 8)),
    "mt5-base-4,2,1": Case("mt5-base", "2x4", (4, 2, 1)),
    "mt5-base-2,2,2": Case("mt5-base", "2x4", (2, 2, 2)),
}
SCALE: dict[str, Case] = {
    # three-axis meshes (issue 25): cold, 30 s
    "mt5-base-2,2,2": Case("mt5-base", "2x4", (2, 2, 2)),
    "mt5-base-4,2,4": Case("mt5-base", "4x8", (4, 2, 4)),
    "mt5-base-2,2,8": Case("mt5-base", "4x8", (2, 2, 8)),
    # the mesh search over every factorisation (up to 3 axes), pruned by proven bounds
    "mt5-base-search-2x4": Case("mt5-base", "2x4", None),
    "mt5-base-search-4x8": Case("mt5-base", "4x8", None),
    # the 100k-op graph where a plan fits (on 2x4 at 40 GiB its memory floor is 80.4 GiB); run at 60 s
    "gpt-100k-ops-4x8-80g": Case(
        "gpt2-medium", "4x8", (4, 8), {"layers": 580}, budget_gib=80.0, preset="a100-80g"
    ),
}


def run_case(case: Case, time_limit: float, workers: int) -> dict[str, Any]:
    from autopar.errors import AutoparError
    from autopar.hardware.cluster import Cluster
    from autopar.infra.progress import Deadline
    from autopar.infra.store import MemoryStore
    from autopar.ir.graph import Graph
    from autopar.models import build
    from autopar_solver.options import SolverOptions
    from autopar_solver.planner import PlanRequest, plan

    # the search (OR-Tools, numba), which the planner imports when it first solves: loaded
    # before the clock, as a service worker has it
    importlib.import_module("autopar_solver.solve")

    t_build = time.perf_counter()
    graph = Graph.load(case.graph_file) if case.graph_file else build(case.model, **case.overrides)
    build_s = time.perf_counter() - t_build
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.json")
        graph.save(path)
        cluster = Cluster.parse(case.cluster, case.preset)
        options = SolverOptions(time_limit_s=time_limit, workers=workers)
        budget = None if case.budget_gib is None else int(case.budget_gib * GIB)
        row: dict[str, Any] = {"ops": len(graph.ops), "graph_build_s": build_s}
        store = MemoryStore() if case.warm_from_zero is not None else None
        if case.warm_from_zero is not None:
            first = None if case.warm_from_budget_gib is None else int(case.warm_from_budget_gib * GIB)
            plan(PlanRequest(graph, cluster, case.mesh, first, case.warm_from_zero, options), store=store)
        if case.memory_fraction is not None:
            free = plan(PlanRequest(graph, cluster, case.mesh, None, 2, options))
            budget = int(case.memory_fraction * free.memory_per_device_bytes)
            row["unconstrained_peak_gib"] = free.memory_per_device_bytes / GIB
            row["budget_gib"] = budget / GIB
        deadline = Deadline(time_limit)
        try:
            g = Graph.load(path)  # plan() validates it
            row["load_s"] = deadline.elapsed()
            p = plan(
                PlanRequest(g, cluster, case.mesh, budget, case.zero, options), store=store, deadline=deadline
            )
        except AutoparError as exc:
            row.update(wall_s=deadline.elapsed(), error=str(exc)[:300])
        else:
            s = p.solver or {}
            st = s.get("stats", {})
            memo = st.get("memo") or {}
            row.update(
                wall_s=deadline.elapsed(),
                memo="recalled"
                if memo.get("plan") == "recalled"
                else ("solved" if memo.get("key") else None),
                gap=s.get("gap"),
                status=s.get("status"),
                tables_s=st.get("time_cost_tables_s"),
                solve_phases_s=st.get("phases_s"),
                memory_rounds=s.get("memory_rows"),
                iteration_ms=p.iteration_time_s * 1e3,
                memory_gib=p.memory_per_device_bytes / GIB,
                mesh_shape=list(p.mesh.shape),
                mesh_search=st.get("mesh_search"),
            )
    # the planner's process and its cost-table workers (the largest of them)
    row["peak_rss_gib"] = (
        max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        / 1024**2
    )
    return row


def _case_names(text: str, known: dict[str, Case]) -> list[str]:
    """``--cases``: a comma list of case names, some of which hold commas (``mt5-base-4,2,1``)."""
    names, part = [], ""
    for token in text.split(","):
        part = f"{part},{token}" if part else token
        if part in known:
            names.append(part)
            part = ""
    if part:
        raise SystemExit(f"benchmarks.solver: unknown case {part!r}; known: {', '.join(known)}")
    return names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=None, help="comma list (default: all of the chosen set)")
    ap.add_argument("--promise", action="store_true", help="the time-limit cases")
    ap.add_argument("--warm", action="store_true", help="the warm cases (memo filled by a first run)")
    ap.add_argument("--scale", action="store_true", help="the three-axis and 4x8 cases")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds (default 30; 5 with --promise)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--imported",
        type=Path,
        default=None,
        help="also plan the imported OneFlow MT5 job in this benchmarks/oneflow_mt5.py output folder",
    )
    ap.add_argument("--run-case", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    table = dict(PROMISE if args.promise else WARM if args.warm else SCALE if args.scale else CASES)
    if args.imported is not None:
        graph_file = str(args.imported / "graph.json")
        if args.warm:
            table[IMPORTED + "-warm"] = Case(
                "(imported)", "2x4", (4, 2), graph_file=graph_file, warm_from_zero=2
            )
        else:
            table[IMPORTED] = Case("(imported)", "2x4", (4, 2), graph_file=graph_file)
    limit = args.time_limit or (5.0 if args.promise else 30.0)
    if args.run_case:
        print(
            json.dumps(
                run_case({**CASES, **PROMISE, **WARM, **SCALE, **table}[args.run_case], limit, args.workers)
            )
        )
        return
    names = (
        _case_names(args.cases, {**CASES, **PROMISE, **WARM, **SCALE, **table}) if args.cases else list(table)
    )
    width = max(18, *(len(n) + 1 for n in names))
    print(f"time limit {limit:g} s, {args.workers} workers; load average {os.getloadavg()[0]:.1f}")
    print(
        f"{'case':<{width}}{'ops':>7}{'mesh':>11}{'wall s':>8}{'<=lim+2':>8}{'load s':>7}"
        f"{'tables s':>9}{'solve s':>8}"
        f"{'gap':>8}{'iter ms':>9}{'mem GiB':>8}{'RSS GiB':>8}  status"
    )
    for name in names:
        case = {**CASES, **PROMISE, **WARM, **SCALE, **table}[name]
        cmd = [sys.executable, "-m", "benchmarks.solver", "--run-case", name]
        cmd += ["--time-limit", str(limit), "--workers", str(args.workers)]
        if args.imported is not None:
            cmd += ["--imported", str(args.imported)]
        if args.warm:
            cmd += ["--warm"]
        if args.scale:
            cmd += ["--scale"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        try:
            row = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            print(f"{name:<{width}} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
            continue
        mesh = ",".join(map(str, case.mesh)) if case.mesh else "search"
        phases = row.get("solve_phases_s") or {}
        gap = row.get("gap")
        print(
            f"{name:<{width}}{row['ops']:>7}{mesh:>11}{row['wall_s']:>8.1f}"
            f"{'yes' if row['wall_s'] <= limit + 2 else 'NO':>8}"
            f"{row.get('load_s') or 0:>7.1f}{row.get('tables_s') or 0:>9.1f}{sum(phases.values()):>8.1f}"
            f"{'' if gap is None else f'{100 * gap:.2f}%':>8}{row.get('iteration_ms') or 0:>9.1f}"
            f"{row.get('memory_gib') or 0:>8.2f}{row['peak_rss_gib']:>8.2f}  "
            + (row.get("status") or row.get("error", ""))
            + (f" (solve memo: {row['memo']})" if row.get("memo") else "")
            + (f" (budget {row['budget_gib']:.2f} GiB)" if "budget_gib" in row else "")
        )
        if row.get("mesh_search"):
            print(_search_line(row["mesh_shape"], row["mesh_search"]))
        sys.stdout.flush()


def _search_line(chosen: list[int], stats: dict[str, Any]) -> str:
    """The mesh search's shapes: chosen; solved (plan's iteration time and bound, ms); proved
    worse (bound); no plan (bound, where one was proven before the time ran out)."""

    def ms(b: float | None) -> str:
        return "-" if b is None else f"{b * 1e3:.1f}"

    solved = ", ".join(
        f"{s['shape']} {ms(s.get('iteration_time_s'))} ms (bound {ms(s['bound_s'])})" for s in stats["solved"]
    )
    pruned = ", ".join(f"{s['shape']} (bound {ms(s['bound_s'])})" for s in stats["proved_worse"])
    no_plan = ", ".join(
        f"{s['shape']} (bound {ms(s['bound_s'])})"
        for s in stats.get("no_plan_bounds", [{"shape": p, "bound_s": None} for p in stats["no_plan"]])
    )
    return (
        f"    chosen {chosen}; solved: {solved or 'none'}; proved worse: {pruned or 'none'}; "
        f"no plan: {no_plan or 'none'}; bound phase {stats['bound_phase_s']:.1f} s"
    )


if __name__ == "__main__":
    main()
