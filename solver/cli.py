"""``autopar plan``: solve from the command line with a progress line and a summary table.

:data:`PLAN_COMMAND` is the ``plan`` entry point of the ``autopar.commands`` group
(``pyproject.toml``).  This module imports with the core alone; OR-Tools and the
solver load inside :func:`run_plan_command`, after ``autopar`` checked that
``autopar[solver]`` is installed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, TextIO

from autopar.cli_args import Command, add_memory_arg, add_mesh_args, graph_arg_help
from autopar.cluster import parse_mesh_shape
from autopar.plan import Plan

if TYPE_CHECKING:
    from solver.planner import Progress

__all__ = ["PLAN_COMMAND", "add_plan_arguments", "run_plan_command", "summary_table"]

GIB = 1024**3


class ProgressLine:
    """One self-overwriting status line on a terminal (or plain lines elsewhere)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0

    def __call__(self, p: Progress) -> None:
        now = time.perf_counter()
        if self.tty and now - self.last < 0.1 and p.phase != "done":
            return
        self.last = now
        parts = [f"[{p.elapsed_s:6.1f} s] {p.phase:<22}"]
        if "done" in p.detail and "total" in p.detail:
            parts.append(f"{p.detail['done']}/{p.detail['total']}")
        if p.objective is not None:
            parts.append(f"objective {p.objective * 1e3:.3f} ms")
        if p.bound is not None:
            parts.append(f"bound {p.bound * 1e3:.3f} ms")
        text = "  ".join(parts)
        if self.tty:
            self.stream.write("\r" + text.ljust(100))
            if p.phase == "done":
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def summary_table(rows: list[tuple[str, Plan]]) -> str:
    """Plain-text table: step time, memory per device, gap, ratio to the first row."""
    base = rows[-1][1].step_time_s if rows else 1.0
    lines = [f"{'plan':<22}{'step ms':>11}{'vs megatron':>13}{'mem GiB':>10}{'gap':>8}"]
    for name, p in rows:
        gap = p.solver.get("gap") if p.solver else None
        lines.append(
            f"{name:<22}{p.step_time_s * 1e3:>11.2f}{p.step_time_s / base:>12.3f}x"
            f"{p.memory_per_device_bytes / GIB:>10.2f}{'' if gap is None else f'{100 * gap:.2f}%':>8}"
        )
    return "\n".join(lines)


def run_plan_command(args: argparse.Namespace) -> int:
    from autopar.baselines import baseline_plan, megatron_parameter_layout
    from autopar.cli_args import cluster_from_args, graph_from_arg, parse_bytes, plan_from_arg
    from autopar.cluster import Mesh
    from autopar.evaluate import attach_evaluation, evaluate
    from solver.options import SolverOptions
    from solver.planner import PlanRequest, plan

    graph = graph_from_arg(args.graph)
    cluster = cluster_from_args(args)
    budget = parse_bytes(args.memory) if args.memory else cluster.device.memory_bytes
    options = SolverOptions(
        time_limit_s=args.time_limit,
        seed=args.seed,
        relative_gap=args.gap,
        runtime=args.runtime,
        **({"workers": args.workers} if args.workers else {}),
    )
    shape = parse_mesh_shape(args.mesh_shape) if args.mesh_shape else None
    request = PlanRequest(graph, cluster, shape, budget, args.zero, options)
    hint = plan_from_arg(args.hint) if args.hint else None
    progress = None if args.no_progress else ProgressLine(sys.stderr)
    result = plan(request, progress=progress, hint=hint)
    result.save(args.out)
    sys.stdout.write(result.summary() + "\n")
    rows: list[tuple[str, Plan]] = [("autopar", result)]
    mesh = result.mesh
    layout = megatron_parameter_layout(graph, mesh)
    if any(str(s) != str(next(iter(layout.values()))) for s in layout.values()) or mesh.ndim == 1:
        for kind in ("data-parallel", "inferred", "megatron"):
            b = baseline_plan(kind, graph, Mesh(cluster, mesh.shape), args.zero, runtime=args.runtime)
            attach_evaluation(b, evaluate(graph, b))
            rows.append((kind, b))
    sys.stdout.write(summary_table(rows) + "\n")
    if result.diagnostics.get("mesh_search"):
        sys.stdout.write("mesh search:\n")
        for r in result.diagnostics["mesh_search"]:
            t = r["step_time_s"]
            sys.stdout.write(
                f"  {r['shape']!s:<10} "
                + (
                    f"{t * 1e3:.2f} ms, {r['memory_per_device_bytes'] / GIB:.2f} GiB"
                    if t
                    else str(r["error"])
                )
                + "\n"
            )
    sys.stdout.write(f"plan written to {args.out}\n")
    return 0


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help=graph_arg_help())
    add_mesh_args(p, mesh_default="the fastest of every 1-D and 2-D shape")
    add_memory_arg(p)
    p.add_argument(
        "--time-limit",
        type=float,
        default=30.0,
        help="seconds of search per mesh shape (reductions, heuristic, CP-SAT; shapes are searched "
        "in parallel); building the cost tables and the baselines comes on top (default: %(default)s)",
    )
    p.add_argument("--workers", type=int, default=None, help="CP-SAT threads (default: min(8, CPUs))")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default: %(default)s)")
    p.add_argument(
        "--gap", type=float, default=0.01, help="relative optimality gap to stop at (default: %(default)s)"
    )
    p.add_argument("--hint", default=None, help="a previous plan to warm-start from")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument("--out", required=True, help="plan JSON to write (checked before solving)")


PLAN_COMMAND = Command(
    "plan",
    "solve for the fastest plan within the memory budget",
    add_plan_arguments,
    run_plan_command,
    extra="solver",
)
