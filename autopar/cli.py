"""``autopar`` command line.

::

    autopar model NAME --out graph.json            build a training-step graph
    autopar costs GRAPH --cluster 2x4 --mesh-shape 4,2   build cost tables, print stats
    autopar baseline KIND GRAPH --cluster 2x4 --mesh-shape 4,2 --out plan.json
    autopar evaluate GRAPH PLAN [--json]            recompute a plan's time and memory
    autopar plan GRAPH --cluster 2x4 --memory 40GiB --zero 2 --out plan.json   (needs autopar[solver])
    autopar serve | worker | submit                 (needs autopar[service])
    autopar oneflow import | import-plan            (needs OneFlow 0.9)
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from autopar.cluster import PRESETS, Cluster, Mesh, parse_mesh_shape
from autopar.errors import AutoparError, ConfigError

__all__ = ["main", "parse_bytes"]

log = logging.getLogger("autopar")

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_bytes(text: str) -> int:
    """``"40GiB"`` -> 42949672960; accepts B, KB/MB/GB (1000^n) and KiB/MiB/GiB (1024^n)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError("bad_memory", f"memory size {text!r} is not like 40GiB, 38.5GB or 1073741824")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise ConfigError("bad_memory", f"memory size must be > 0, got {text!r}")
    return int(value)


def _add_mesh_args(p: argparse.ArgumentParser, mesh_required: bool = False) -> None:
    p.add_argument("--cluster", default="2x4", help="NODESxDEVICES, e.g. 2x4 (default)")
    p.add_argument("--preset", default="a100-40g", choices=sorted(PRESETS), help="device preset")
    p.add_argument(
        "--mesh-shape",
        required=mesh_required,
        help="logical mesh, e.g. 4,2 (last axis tensor-parallel); default: searched / 2-D",
    )
    p.add_argument("--zero", type=int, default=2, choices=[0, 1, 2, 3], help="ZeRO stage (default 2)")


def _mesh_from_args(args: argparse.Namespace, default_2d: bool = True) -> Mesh:
    cluster = Cluster.parse(args.cluster, args.preset)
    if args.mesh_shape:
        shape = parse_mesh_shape(args.mesh_shape)
    elif default_2d and cluster.nodes > 1:
        shape = (cluster.nodes * cluster.devices_per_node // 2, 2)
    else:
        shape = (cluster.world_size,)
    return Mesh(cluster, shape)


def _load_graph(path: str):  # type: ignore[no-untyped-def]
    from autopar.graph import Graph

    t0 = time.perf_counter()
    g = Graph.load(path).validate()
    log.info("loaded %s in %.2f s", g, time.perf_counter() - t0)
    return g


# ------------------------------------------------------------------ commands


def cmd_model(args: argparse.Namespace) -> int:
    from autopar.models import build, describe

    overrides: dict[str, Any] = {}
    for key in ("layers", "hidden", "heads", "ffn", "vocab", "batch", "seq", "decoder_seq"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    t0 = time.perf_counter()
    graph = build(args.name, **overrides)
    built = time.perf_counter() - t0
    graph.validate()
    graph.save(args.out)
    info = describe(graph)
    sys.stdout.write(
        f"{args.name}: {len(graph.ops)} ops, {len(graph.tensors)} tensors, "
        f"{len(graph.variables)} variables, {info.get('parameters', 0):,} parameters; "
        f"built in {built:.2f} s -> {args.out}\n"
    )
    return 0


def cmd_costs(args: argparse.Namespace) -> int:
    from autopar.cost_tables import build_cost_tables

    graph = _load_graph(args.graph)
    mesh = _mesh_from_args(args)
    t0 = time.perf_counter()
    tables = build_cost_tables(graph, mesh, args.zero, workers=args.workers)
    cold = time.perf_counter() - t0
    sys.stdout.write(
        json.dumps(
            {**tables.stats, "fallback_ops": len(tables.stats["fallback_ops"]), "wall_s": cold}, indent=1
        )
        + "\n"
    )
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    from autopar.baselines import baseline_plan
    from autopar.evaluate import attach_evaluation, evaluate

    graph = _load_graph(args.graph)
    mesh = _mesh_from_args(args)
    plan = baseline_plan(args.kind, graph, mesh, args.zero)
    attach_evaluation(plan, evaluate(graph, plan))
    plan.save(args.out)
    sys.stdout.write(plan.summary() + "\n")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from autopar.evaluate import evaluate
    from autopar.plan import Plan

    graph = _load_graph(args.graph)
    plan = Plan.load(args.plan)
    ev = evaluate(graph, plan)
    if args.json:
        sys.stdout.write(json.dumps(ev.to_dict()) + "\n")
    else:
        gib = 1024**3
        sys.stdout.write(
            f"{args.plan}: {'valid' if ev.valid else 'INVALID'} ({plan.source})\n"
            f"  step time  {ev.step_time_s * 1e3:10.2f} ms  (compute {ev.compute_time_s * 1e3:.2f} ms, "
            f"comm {ev.comm_time_s * 1e3:.2f} ms)\n"
            f"  comm/axis  "
            + ", ".join(
                f"axis {a}: {t * 1e3:.2f} ms / {ev.comm_bytes_per_axis[a] / 2**20:.1f} MiB"
                for a, t in ev.comm_time_s_per_axis.items()
            )
            + "\n"
            f"  memory     {ev.memory.total / gib:10.2f} GiB per device "
            f"(params {ev.memory.params / gib:.2f}, "
            f"grads {ev.memory.grads / gib:.2f}, optimizer {ev.memory.optimizer / gib:.2f}, "
            f"activations {ev.memory.activations / gib:.2f})\n"
        )
        for e in ev.errors[:20]:
            sys.stdout.write(f"  error: {e}\n")
    return 0 if ev.valid else 1


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        from solver.cli import run_plan_command
    except ImportError as exc:  # ortools not installed
        raise ConfigError(
            "solver_missing",
            f"the solver needs autopar[solver] (ortools): {exc}; pip install 'autopar[solver]'",
        ) from None
    return run_plan_command(args)


# ------------------------------------------------------------------ parser


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = argparse.ArgumentParser(prog="autopar", description="Auto-parallel planning for training graphs")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}

    p = sub.add_parser("model", help="build a training-step graph")
    p.add_argument("name")
    p.add_argument("--out", required=True)
    for key in ("layers", "hidden", "heads", "ffn", "vocab", "batch", "seq", "decoder-seq"):
        p.add_argument(f"--{key}", type=int, dest=key.replace("-", "_"))
    handlers["model"] = cmd_model

    p = sub.add_parser("costs", help="build the cost tables of a graph and print statistics")
    p.add_argument("graph")
    _add_mesh_args(p)
    p.add_argument("--workers", type=int, default=None)
    handlers["costs"] = cmd_costs

    p = sub.add_parser("baseline", help="write a reference plan")
    p.add_argument("kind", choices=["megatron", "inferred", "data-parallel", "single-device"])
    p.add_argument("graph")
    _add_mesh_args(p)
    p.add_argument("--out", required=True)
    handlers["baseline"] = cmd_baseline

    p = sub.add_parser("evaluate", help="recompute a plan's step time, memory and communication")
    p.add_argument("graph")
    p.add_argument("plan")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    handlers["evaluate"] = cmd_evaluate

    p = sub.add_parser("plan", help="solve for the fastest plan within the memory budget")
    p.add_argument("graph")
    _add_mesh_args(p)
    p.add_argument("--memory", default=None, help="per-device budget, e.g. 40GiB (default: the preset's)")
    p.add_argument("--time-limit", type=float, default=30.0)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gap", type=float, default=0.01, help="relative optimality gap to stop at")
    p.add_argument("--hint", default=None, help="a previous plan to warm-start from")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--compare", action="store_true", help="also evaluate the baselines (cached by content)")
    p.add_argument("--out", required=True)
    handlers["plan"] = cmd_plan

    try:
        from autopar.oneflow.cli import add_oneflow_commands
    except ImportError:
        pass
    else:
        handlers.update(add_oneflow_commands(sub))
    try:
        from autopar.cli_service import add_service_commands
    except ImportError:
        pass
    else:
        handlers.update(add_service_commands(sub))
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        return handlers[args.command](args)
    except AutoparError as exc:
        sys.stderr.write(f"autopar: error: {exc}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
