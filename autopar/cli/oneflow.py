"""``autopar oneflow ...`` subcommands (run them in the OneFlow venv).

::

    autopar oneflow import JOB.pb --out graph.json
    autopar oneflow import-plan JOB.pb --out plan.json [--cluster 2x4 --preset a100-40g] [--no-evaluate]
    autopar oneflow fidelity JOB.pb PLAN.json [--json report.json] [--graph GRAPH.json [--recompute S,...]]

``import`` turns a OneFlow ``Job`` protobuf (``nn.Graph._full_job_proto``
serialized) into an ``autopar.graph/v1`` graph; ``import-plan`` reads the N-D
SBP OneFlow chose for that job as an ``autopar.plan/v1`` plan and, unless
``--no-evaluate``, scores it with autopar's evaluator; ``fidelity`` compares a
(compiled) job with a plan: ops that follow it, and per mesh axis the bytes the
job moves by its own N-D SBP next to the plan's predicted bytes.  OneFlow is imported only
when a command runs, so registering these commands never needs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from autopar.cli.args import wrote
from autopar.hardware.cluster import PRESETS, Cluster

__all__ = ["add_oneflow_arguments", "add_oneflow_commands", "run_oneflow_command"]


def _cmd_import(args: argparse.Namespace) -> int:
    from autopar.bridges.oneflow.importer import import_job

    t0 = time.perf_counter()
    graph = import_job(args.job, name=args.name, zero_stage=args.zero)
    wall = time.perf_counter() - t0
    graph.save(args.out)
    roles = Counter(op.role.value for op in graph.ops)
    dropped = {k: len(v) for k, v in graph.meta["oneflow"]["dropped"].items() if v}
    sys.stdout.write(
        f"{args.job}: graph {graph.name!r} (job {graph.meta['job_name']!r}): "
        f"{graph.meta['oneflow']['op_count']} OneFlow ops -> {len(graph.ops)} ops "
        f"({', '.join(f'{n} {r}' for r, n in sorted(roles.items()))}), {len(graph.tensors)} tensors, "
        f"{len(graph.variables)} variables; mesh {graph.meta['mesh_shape']}, "
        f"ZeRO-{graph.meta['zero_stage']}; "
        f"dropped {dropped}; {wall:.2f} s\n"
    )
    training = graph.meta["training"]
    blocks = training["recomputed_blocks"]
    sys.stdout.write(
        f"iteration: {training['micro_batches']} micro-batch(es) per step (the graph is one), "
        f"checkpointing {training['checkpointing']}"
        + (f", recomputed {len(blocks)} block(s): {', '.join(blocks)}" if blocks else "")
        + "\n"
    )
    wrote("graph", args.out)
    return 0


def _cmd_import_plan(args: argparse.Namespace) -> int:
    from autopar.bridges.oneflow.importer import import_job
    from autopar.bridges.oneflow.plans import import_plan

    graph = import_job(args.job, zero_stage=args.zero)
    cluster = Cluster.parse(args.cluster, args.preset) if args.cluster else None
    plan = import_plan(args.job, graph=graph, cluster=cluster, zero_stage=args.zero)
    if not args.no_evaluate:
        from autopar.cost.evaluate import attach_evaluation, evaluate

        attach_evaluation(plan, evaluate(graph, plan))
    plan.save(args.out)
    sys.stdout.write(plan.summary() + "\n")
    wrote("plan", args.out)
    if args.graph_out:
        graph.save(args.graph_out)
        wrote("graph", args.graph_out)
    return 0


def _cmd_fidelity(args: argparse.Namespace) -> int:
    import json

    from autopar.bridges.oneflow.fidelity import check_fidelity
    from autopar.cli.args import pipeline_plan_file
    from autopar.ir.graph import Graph
    from autopar.ir.plan import Plan

    if pipeline_plan_file(args.plan):
        return _pipeline_fidelity(args)
    plan_graph = Graph.load(args.graph) if args.graph else None
    recompute = [s for s in args.recompute.split(",") if s] if args.recompute is not None else None
    report = check_fidelity(args.job, Plan.load(args.plan), plan_graph=plan_graph, recompute=recompute)
    sys.stdout.write(report.summary() + "\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report.to_dict(), fh, indent=1)
    return 0


def _pipeline_fidelity(args: argparse.Namespace) -> int:
    """``fidelity`` of a pipeline plan: the bytes the compiled job moves between its stages'
    placements (:func:`autopar.bridges.oneflow.boundary_traffic.count_boundary_traffic`) against the
    plan's boundaries (:func:`autopar.pipeline.evaluate.boundary_bytes_per_device`), per micro-batch and
    per direction, matched by tensor shape; needs ``--graph`` (the graph the plan was solved on)."""
    import json

    from autopar.bridges.oneflow.boundary_traffic import count_boundary_traffic
    from autopar.cost.compute import boundary_bytes_per_device
    from autopar.errors import ConfigError
    from autopar.ir.graph import Graph
    from autopar.pipeline.evaluate import stage_link
    from autopar.pipeline.plan import PipelinePlan
    from autopar.pipeline.split import RECV_SUFFIX, split_graph

    if not args.graph:
        raise ConfigError(
            "missing_graph", "a pipeline plan's fidelity needs --graph GRAPH.json, the graph it was solved on"
        )
    graph = Graph.load(args.graph)
    with open(args.plan) as fh:
        staged = PipelinePlan.from_json(fh.read())
    slices = split_graph(graph, staged.counts, stage_link(staged.cluster, len(staged.counts)).crosses_nodes)
    predicted = []
    for sl in slices:
        plan = staged.stages[sl.index]
        for b in sl.receives:
            spec = graph.tensors[b.tensor]
            sbp = plan.output_sbp(f"{b.tensor}{RECV_SUFFIX}", "out")
            predicted.append(
                {
                    "tensor": b.tensor,
                    "shape": list(spec.shape),
                    "direction": "forward" if b.dst > b.src else "backward",
                    "per": b.per,
                    "tied_gradient": b.tied_gradient,
                    "received_per_device": boundary_bytes_per_device(
                        spec.numel, spec.dtype, sbp, plan.mesh.shape
                    ),
                }
            )
    counted = [e.to_dict() for e in count_boundary_traffic(args.job) if e.shape != [1]]
    lines = ["stage boundaries: predicted (autopar) vs counted (the compiled job), bytes per device"]
    scalars = [p for p in predicted if not p["shape"]]
    for p in predicted:
        if not p["shape"]:
            continue
        same = [
            c for c in counted
            if (c["shape"], c["direction"], c["phase"]) == (p["shape"], p["direction"], "per_micro_batch")
        ]  # fmt: skip
        got = ", ".join(f"{c['received_per_device']:.0f}" for c in same) or "none"
        lines.append(
            f"  {p['direction']:<8} {p['tensor']} {p['shape']} ({p['per']}): predicted "
            f"{p['received_per_device']:.0f}, counted per micro-batch: {got}"
        )
    if scalars:
        lines.append(f"  and {len(scalars)} scalars once per step (gradient clipping's norms)")
    sys.stdout.write("\n".join(lines) + "\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"predicted": predicted, "counted": counted}, fh, indent=1)
    return 0


_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "import": _cmd_import,
    "import-plan": _cmd_import_plan,
    "fidelity": _cmd_fidelity,
}


def add_oneflow_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``import`` and ``import-plan`` under the ``autopar oneflow`` parser."""
    sub = parser.add_subparsers(dest="oneflow_command", required=True, metavar="SUBCOMMAND")

    p = sub.add_parser("import", help="OneFlow Job protobuf -> autopar.graph/v1 JSON")
    p.add_argument("job", help="serialized Job (nn.Graph._full_job_proto.SerializeToString())")
    p.add_argument("--out", required=True, help="graph JSON to write")
    p.add_argument(
        "--name",
        default=None,
        help="graph name (default: the job's name, or the file's stem when the job has the generic "
        "name of autopar's training wrapper, TrainGraph_0)",
    )
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=None, help="ZeRO stage to record")

    p = sub.add_parser("import-plan", help="the N-D SBP OneFlow chose for a job -> autopar.plan/v1 JSON")
    p.add_argument("job")
    p.add_argument("--out", required=True, help="plan JSON to write")
    p.add_argument("--cluster", default=None, help="NODESxDEVICES to cost on (default: one node)")
    p.add_argument("--preset", default="a100-40g", choices=sorted(PRESETS))
    p.add_argument(
        "--zero", type=int, choices=[0, 1, 2, 3], default=None, help="ZeRO stage (default: the job's)"
    )
    p.add_argument("--graph-out", default=None, help="also write the imported graph here")
    p.add_argument("--no-evaluate", action="store_true", help="do not attach autopar's evaluation")

    p = sub.add_parser(
        "fidelity", help="a (compiled) OneFlow job vs a plan: ops that follow it, bytes per mesh axis"
    )
    p.add_argument("job", help="the job (nn.Graph._compiled_job_proto serialized, or the built job)")
    p.add_argument(
        "plan",
        help="the plan JSON the job was compiled with (autopar.plan/v1; or autopar.pipeline/v1, with "
        "--graph: the bytes between stages, predicted vs counted)",
    )
    p.add_argument("--json", default=None, help="also write the full report here")
    p.add_argument(
        "--graph",
        default=None,
        help="the graph the plan was solved on: adds the bytes by phase of the iteration "
        "(per micro-batch, recompute, once per step), predicted vs counted",
    )
    p.add_argument(
        "--recompute",
        default=None,
        metavar="SCOPE,...",
        help="layer scopes to predict as recomputed instead of the plan's (e.g. model.h.0)",
    )


def run_oneflow_command(args: argparse.Namespace) -> int:
    return _HANDLERS[args.oneflow_command](args)


def add_oneflow_commands(subparsers: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``oneflow import`` and ``oneflow import-plan`` to ``autopar``'s subparsers.

    Returns the handler of the ``oneflow`` command.
    """
    parser = subparsers.add_parser("oneflow", help="OneFlow bridge: import jobs and OneFlow's own plans")
    add_oneflow_arguments(parser)
    return {"oneflow": run_oneflow_command}
