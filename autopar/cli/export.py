"""``autopar export megatron PLAN``: the Megatron-LM arguments that run a plan, or why none do.

The arguments print on one line of stdout, so that ``pretrain_gpt.py $(autopar export
megatron plan.json) ...`` runs them; what Megatron-LM derives (the data-parallel size from
the GPUs it is launched on) and what the graph does not say print as ``autopar: note:`` lines
on stderr.  ``--json`` prints one object.  A plan Megatron-LM cannot run is one
``autopar: error: [not_megatron_expressible] ...`` line naming why, exit status 2
(:mod:`autopar.baselines.megatron.export`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autopar.cli.args import (
    Command,
    graph_arg_help,
    graph_from_arg,
    model_names,
    pipeline_plan_file,
    plan_from_arg,
)
from autopar.errors import ConfigError
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.pipeline.plan import PipelinePlan

__all__ = ["EXPORT_COMMAND", "EXPORT_TARGETS", "add_export_arguments", "cmd_export"]

EXPORT_TARGETS = ("megatron",)
"""The systems ``autopar export`` writes arguments for."""


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", choices=EXPORT_TARGETS, metavar="TARGET", help="one of: %(choices)s")
    p.add_argument("plan", help="autopar.plan/v1 or autopar.pipeline/v1 JSON file")
    p.add_argument(
        "--graph",
        default=None,
        help=f"the plan's graph ({graph_arg_help()}; default: the bundled model the plan names, "
        "checked by its content hash)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object: arguments, sizes, notes")


def _load_plan(spec: str) -> Plan | PipelinePlan:
    if pipeline_plan_file(spec):
        return PipelinePlan.from_json(Path(spec).read_bytes())
    return plan_from_arg(spec)


def _graph_of(plan: Plan | PipelinePlan, spec: str | None) -> Graph:
    """The graph the user names, else the bundled model of the plan's graph name when it is
    that model (the same content hash)."""
    if spec is not None:
        return graph_from_arg(spec)
    name = plan.graph_name
    if name not in model_names():
        raise ConfigError(
            "missing_graph",
            f"the plan is for graph {name!r}, which is not a bundled model: give its graph file with "
            "--graph FILE",
        )
    graph = graph_from_arg(name)
    if plan.graph_hash and plan.graph_hash != graph.content_hash():
        raise ConfigError(
            "missing_graph",
            f"the plan's graph is named {name!r} but is not the bundled model of that name (content "
            f"hash {plan.graph_hash[:12]}): give its graph file with --graph FILE",
        )
    return graph


def cmd_export(args: argparse.Namespace) -> int:
    from autopar.baselines.megatron.export import megatron_arguments

    plan = _load_plan(args.plan)
    exported = megatron_arguments(_graph_of(plan, args.graph), plan)
    if args.json:
        sys.stdout.write(json.dumps(exported.to_dict()) + "\n")
        return 0
    sys.stdout.write(exported.command_line() + "\n")
    sys.stderr.writelines(f"autopar: note: {note}\n" for note in exported.notes)
    return 0


EXPORT_COMMAND = Command(
    "export",
    "print the arguments another system runs a plan with (megatron: Megatron-LM), or why it cannot",
    add_export_arguments,
    cmd_export,
    description="Print the command-line arguments that run PLAN in another system: megatron: "
    "Megatron-LM's (pretrain_gpt.py) tensor, pipeline and data parallelism, sequence parallelism, "
    "distributed optimizer, recomputation and batch sizes.  A plan the system cannot run exits 2 "
    "with one line naming why ([not_megatron_expressible]).",
)
