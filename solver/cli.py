"""``autopar plan``: solve from the command line with progress and the plan's summary;
``--compare`` adds the baselines (each evaluated once, cached by content).

:data:`PLAN_COMMAND` is the ``plan`` entry point of the ``autopar.commands`` group
(``pyproject.toml``).  This module imports with the core alone; OR-Tools and the
solver load inside :func:`run_plan_command`, after ``autopar`` checked that
``autopar[solver]`` is installed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from autopar.baselines.pricing import baseline_evaluated
from autopar.cli.args import (
    Command,
    add_memory_arg,
    add_mesh_args,
    add_time_limit_arg,
    add_training_args,
    graph_arg_help,
    wrote,
)
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import parse_mesh_shape
from autopar.infra.progress import Progress
from autopar.ir.batch import batch_shape
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan, format_bytes
from autopar.ir.training import TrainingConfig
from autopar.pipeline.plan import PipelinePlan

__all__ = [
    "PLAN_COMMAND",
    "ProgressLine",
    "add_plan_arguments",
    "baseline_evaluated",
    "mesh_search_text",
    "run_plan_command",
    "summary_table",
]

BASELINES = ("data-parallel", "inferred", "megatron")


def _describe(p: Progress) -> str:
    parts = []
    if p.shape is not None:
        parts.append(f"mesh {list(p.shape)}")
    if p.percent is not None:
        parts.append(f"{p.done}/{p.total} ({p.percent:.0f} %)")
    if p.objective is not None:
        parts.append(f"objective {p.objective * 1e3:.3f} ms")
    if p.bound is not None:
        parts.append(f"bound {p.bound * 1e3:.3f} ms")
    if p.time_left_s is not None:
        parts.append(f"{p.time_left_s:.1f} s left")
    return "  ".join(parts)


class ProgressLine:
    """Progress on ``stream``: a ``rich`` status line with phase, percent and time left on a
    terminal, plain lines (one per phase change or per second) elsewhere.  Elapsed time comes
    from the planner's one clock and is never shown going backwards."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.shown = 0.0
        self.last_line = ""
        self.last_key: tuple[Any, ...] = ()
        self.last_plain = -1.0
        self.status: Any = None
        if self.tty:
            from rich.console import Console

            self.status = Console(file=stream).status("starting")
            self.status.start()

    def __call__(self, p: Progress) -> None:
        self.shown = max(self.shown, p.elapsed_s)
        line = f"[{self.shown:6.1f} s] {p.phase:<18} {_describe(p)}".rstrip()
        if self.status is not None:
            if p.phase == "done":
                self.close()
                self.stream.write(line + "\n")
            else:
                self.status.update(line)
            return
        key = (p.phase, p.shape)
        if key != self.last_key or self.shown - self.last_plain >= 1.0 or p.phase == "done":
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last_key, self.last_plain = key, self.shown

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def _fastest_first(row: tuple[str, Plan | PipelinePlan]) -> tuple[bool, float]:
    t = row[1].iteration_time_s
    return (t != t, t if t == t else 0.0)  # a plan without a time (NaN) last


def summary_table(rows: Sequence[tuple[str, Plan | PipelinePlan]]) -> str:
    """Plain-text table, fastest first: iteration time (K, checkpointing), memory per device,
    proven gap, ratio to the last row given (``--compare``: megatron)."""
    base = rows[-1][1].iteration_time_s if rows else 1.0
    last = rows[-1][0] if rows else ""
    rows = sorted(rows, key=_fastest_first)
    lines = [
        f"{'plan':<22}{'iteration ms':>13}{'K':>4}{'ckpt':>6}{'vs ' + last:>16}"
        f"{'memory/dev':>13}{'proven gap':>12}"
    ]
    for name, p in rows:
        gap = p.solver.get("gap") if p.solver else None
        lines.append(
            f"{name:<22}{p.iteration_time_s * 1e3:>13.2f}"
            f"{p.training.micro_batches:>4}{p.training.checkpointing:>6}"
            f"{p.iteration_time_s / base:>15.3f}x"
            f"{format_bytes(p.memory_per_device_bytes):>13}{'' if gap is None else f'{100 * gap:.2f}%':>12}"
        )
    return "\n".join(lines)


def mesh_search_text(entries: list[Any]) -> str:
    """The ``mesh search:`` lines: each shape's iteration time (and one micro-batch's when
    K > 1), memory, proven gap and wall time,
    the shapes proved worse than the chosen plan with their lower bound, or why a shape has
    no plan."""
    lines = ["mesh search (iteration: K micro-batches plus once per step):"]
    unreached = [r for r in entries if _unreached(r)]
    for r in entries:
        if _unreached(r):
            continue
        t, gap, bound = r.get("iteration_time_s"), r.get("gap"), r.get("lower_bound_s")
        if t:
            micro = r.get("micro_batch_time_s")
            each = f" ({micro * 1e3:.2f} ms per micro-batch)" if micro and abs(micro - t) > 1e-12 else ""
            what = (
                f"iteration {t * 1e3:.2f} ms{each}, {format_bytes(r.get('memory_per_device_bytes'))}, "
                f"proven gap {100 * (gap or 0):.2f} %, {r.get('wall_s', 0):.1f} s"
                + (
                    " (solved on after its first share: its gap missed the target)"
                    if r.get("continued")
                    else ""
                )
            )
        elif r.get("outcome") == "proved worse" and bound is not None:
            what = f"proved worse: no iteration under {bound * 1e3:.2f} ms (lower bound), not solved"
        else:
            what = str(r.get("error"))
            if bound is not None:
                what += f" (lower bound {bound * 1e3:.2f} ms)"
        lines.append(f"  {r['shape']!s:<10} {what}")
    if unreached:
        shapes = ", ".join(str(r["shape"]) for r in unreached)
        lines.append(f"  not reached before the time limit ({len(unreached)} shapes, no bound): {shapes}")
    return "\n".join(lines) + "\n"


def _unreached(row: Any) -> bool:
    """A shape the search's time never reached: no plan, no bound, and a time-limit error."""
    return (
        row.get("outcome") == "no plan"
        and row.get("lower_bound_s") is None
        and "ran out before mesh" in str(row.get("error") or "")
    )


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "autopar" / "baselines"


def compared_rows(
    result: Plan | PipelinePlan,
    graph: Graph,
    cluster: Cluster,
    budget: int | None,
    args: argparse.Namespace,
    training: TrainingConfig,
    report: Callable[[str], None] | None = None,
) -> list[tuple[str, Plan | PipelinePlan]]:
    """``autopar`` and each baseline at its own best configuration
    (:mod:`autopar.baselines.search`; ``--megatron-config`` fixes the keys the user names),
    each plan carrying its configuration and the others tried in
    ``diagnostics["baseline_configuration"]``.  After the plan: outside its time limit."""
    from autopar.baselines.search import configured_plan, search_baseline

    rows: list[tuple[str, Plan | PipelinePlan]] = [("autopar", result)]
    for kind in BASELINES:
        if report is not None:
            report(kind)
        if kind == "single-device":  # one configuration: every op replicated
            if isinstance(result, PipelinePlan):
                continue  # every op replicated on every stage's mesh: no one runs that
            rows.append(
                (
                    kind,
                    baseline_evaluated(
                        kind, graph, result.mesh, args.zero, _cache_dir(), args.runtime, training
                    ),
                )
            )
            continue
        named = getattr(args, "megatron_config", None) if kind == "megatron" else None
        chosen, priced = search_baseline(
            kind,
            graph,
            cluster,
            training,
            budget,
            zero_stage=args.zero,
            runtime=args.runtime,
            named=named,
            cache=_cache_dir(),
        )
        rows.append((kind, configured_plan(chosen, priced, budget, bool(named))))
    return rows


def plan_zero_stage(result: Plan | PipelinePlan) -> int:
    """The ZeRO stage ``result`` runs at (a pipeline's: its first stage's, every stage's alike)."""
    return (result.stages[0] if isinstance(result, PipelinePlan) else result).zero_stage


def compared_record(rows: Sequence[tuple[str, Plan | PipelinePlan]]) -> list[dict[str, Any]]:
    """``diagnostics["compare"]`` of the autopar plan: each baseline's configuration and figures
    (what the API, the report and the page show beside the plan)."""
    out: list[dict[str, Any]] = []
    for name, p in rows[1:]:
        conf = dict(p.diagnostics.get("baseline_configuration") or {})
        conf.pop("tried", None)
        first = p.stages[0] if isinstance(p, PipelinePlan) else p
        out.append(
            {
                "kind": name,
                **conf,
                "mesh_shape": list(first.mesh.shape),
                "zero_stage": first.zero_stage,
                "runtime": first.runtime,
                "iteration_time_s": p.iteration_time_s,
                "memory_per_device_bytes": p.memory_per_device_bytes,
            }
        )
    return out


def configurations_text(rows: Sequence[tuple[str, Plan | PipelinePlan]]) -> str:
    """One line per baseline: the configuration it was priced at and what else was tried."""
    lines = ["baseline configurations (each system at its users' best configuration, or the one named):"]
    for name, p in rows[1:]:
        conf = p.diagnostics.get("baseline_configuration")
        if not conf:
            where = p.mesh_text() if isinstance(p, PipelinePlan) else f"mesh {list(p.mesh.shape)}"
            lines.append(f"  {name:<15}{where} (as autopar's plan)")
            continue
        how = "named" if conf.get("named_by_user") else f"best of {len(conf['tried'])}"
        fits = "" if conf.get("fits_budget", True) else "; none fits the budget: least memory shown"
        lines.append(f"  {name:<15}{conf['describe']}, runtime {conf['runtime']} ({how}{fits})")
    return "\n".join(lines)


def run_plan_command(args: argparse.Namespace) -> int:
    from autopar.cli.args import cluster_from_args, graph_from_arg, parse_bytes, plan_from_arg
    from autopar.infra.progress import Deadline
    from autopar.infra.store import DirectoryStore
    from autopar_solver.options import SolverOptions
    from autopar_solver.planner import PlanRequest, plan
    from autopar_solver.planner.stage_search import parse_stages, plan_stages
    from autopar_solver.planner.zero_search import ZERO_AUTO, plan_zero_stages
    from autopar_solver.request_file import apply_request_file, request_solver_options

    apply_request_file(args)  # --request FILE: its values where no option was given
    options = SolverOptions(
        time_limit_s=args.time_limit,
        seed=args.seed,
        relative_gap=args.gap,
        runtime=args.runtime,
        micro_batches=args.micro_batches,  # the iteration to minimise (autopar.cost.iteration)
        checkpointing=args.checkpointing,
        stages=parse_stages(args.stages),
        **({"workers": args.workers} if args.workers else {}),
        **request_solver_options(args),
    )
    deadline = Deadline(options.time_limit_s)  # the limit covers loading the graph too
    progress = None if args.no_progress else ProgressLine(sys.stderr)
    try:
        graph = graph_from_arg(args.graph)  # plan() validates it
        cluster = cluster_from_args(args)
        budget = parse_bytes(args.memory) if args.memory else cluster.device.memory_bytes
        shape = parse_mesh_shape(args.mesh_shape) if args.mesh_shape else None
        stages = options.stages
        if stages is None and cluster.nodes == 1:
            stages = 1  # auto on one node: one stage (a pipeline pays its bubble to save memory only)
        store = DirectoryStore(args.memo) if args.memo else None
        hint = plan_from_arg(args.hint) if args.hint else None

        def solve(zero: int, within: Deadline) -> Plan | PipelinePlan:
            if stages == 1:
                request = PlanRequest(graph, cluster, shape, budget, zero, options)
                return plan(request, store=store, progress=progress, hint=hint, deadline=within)
            # pipeline stages (autopar_solver.planner.stage_search); --mesh-shape is a stage's
            request = PlanRequest(graph, cluster, None, budget, zero, options)
            return plan_stages(
                request, stages, within, store=store, progress=progress, stage_mesh_shape=shape
            )

        if args.zero == "auto":  # autopar_solver.planner.zero_search
            result = plan_zero_stages(ZERO_AUTO, solve, deadline)
        else:
            result = solve(args.zero, deadline)
        args.zero = plan_zero_stage(result)  # the baselines of --compare run at the plan's stage
    finally:
        if progress:
            progress.close()
    result.save(args.out)
    sys.stdout.write(result.summary(batch_shape(graph)) + "\n")
    if args.compare:
        report = (
            (lambda kind: progress(Progress(f"baseline:{kind}", elapsed_s=deadline.elapsed())))
            if progress
            else None
        )
        rows = compared_rows(result, graph, cluster, budget, args, options.training, report)
        result.diagnostics["compare"] = compared_record(rows)
        result.save(args.out)  # the plan carries what it was compared with
        sys.stdout.write(summary_table(rows) + "\n")
        sys.stdout.write(configurations_text(rows) + "\n")
    sys.stdout.write(searches_text(result, options.stages == 1 and cluster.nodes > 1, cluster.nodes))
    wrote("plan", args.out)
    return 0


def searches_text(result: Plan | PipelinePlan, one_stage_asked_on_nodes: bool, nodes: int) -> str:
    """What each search tried (ZeRO stages, mesh shapes, numbers of stages, cuts), or the hint
    that ``--stages 1`` on several nodes left pipelines untried."""
    from autopar_solver.planner.pipeline_search import cut_search_text
    from autopar_solver.planner.stage_search import stage_search_text
    from autopar_solver.planner.zero_search import zero_search_text

    d = result.diagnostics
    out = []
    if d.get("zero_search"):
        out.append(zero_search_text(list(d["zero_search"])))
    if d.get("mesh_search"):
        out.append(mesh_search_text(list(d["mesh_search"])))
    if d.get("stage_search"):
        out.append(stage_search_text(list(d["stage_search"])))
    elif one_stage_asked_on_nodes:
        out.append(
            f"hint: one stage over {nodes} nodes, as --stages 1 asked; --stages auto (the default) "
            "also plans pipelines of stages across the nodes and keeps the fastest (docs/pipeline.md)\n"
        )
    if d.get("pipeline_search"):
        out.append(cut_search_text(list(d["pipeline_search"])))
    return "".join(out)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    from autopar_solver.request_file import add_request_argument

    p.add_argument("graph", nargs="?", default=None, help=graph_arg_help() + " (or --request's graph)")
    add_mesh_args(p, mesh_default="the fastest of every 1-D and 2-D shape", zero_auto=True)
    add_memory_arg(p)
    add_training_args(p, checkpointing="auto")
    add_time_limit_arg(p, ", and loading the graph; --compare comes on top")
    p.add_argument("--workers", type=int, default=None, help="CP-SAT threads (default: min(8, CPUs))")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default: %(default)s)")
    p.add_argument(
        "--gap", type=float, default=0.01, help="relative optimality gap to stop at (default: %(default)s)"
    )
    p.add_argument("--hint", default=None, help="a previous plan to warm-start from")
    p.add_argument(
        "--memo",
        default=None,
        metavar="DIR",
        help="keep cost-table entries and solve results in this folder between runs: a later run "
        "reuses the entries and answers the same problem from the stored plan, re-checked "
        "(remove the folder to clear it; default: nothing kept)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also evaluate the baselines, each at its own best configuration (each once, cached by content)",
    )
    p.add_argument(
        "--megatron-config",
        default=None,
        metavar="tp=T,pp=P,dp=D,vpp=V,sp=on|off,recompute=none|selective[:M+M]|full[:N],optimizer=ddp|distributed|fsdp",
        help="with --compare: price megatron at the configuration you run (any subset of these keys; "
        "the ones left out are searched), not at its best",
    )
    p.add_argument(
        "--stages",
        default="auto",
        metavar="N|auto",
        help="pipeline stages: N stages of contiguous blocks, each on world/N devices with its own "
        "plan (--mesh-shape is then one stage's mesh), or auto: on several nodes the best of one "
        "stage and every number of stages that gives each stage a block, on one node one stage "
        "(default: %(default)s)",
    )
    p.add_argument("--out", required=True, help="plan JSON to write (checked before solving)")
    add_request_argument(p)  # last: it marks the options above when given, to override the file


PLAN_COMMAND = Command(
    "plan",
    "solve for the fastest plan within the memory budget",
    add_plan_arguments,
    run_plan_command,
    extra="solver",
)
