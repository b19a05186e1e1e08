"""``autopar`` command line: the composition root.

::

    autopar model NAME --out graph.json            build a training-step graph
    autopar costs GRAPH --cluster 2x4 --mesh-shape 4,2   build cost tables, print stats
    autopar baseline KIND GRAPH --cluster 2x4 --mesh-shape 4,2 --out plan.json
    autopar evaluate GRAPH PLAN [--json]            recompute a plan's time and memory
    autopar oneflow import | import-plan            (OneFlow 0.9 when run)
    autopar export megatron PLAN                    Megatron-LM's arguments for a plan, or why none
    autopar plan GRAPH --cluster 2x4 --memory 40GiB --zero 2 --out plan.json   (autopar[solver])
    autopar serve | worker | submit                 (serve, worker: autopar[service])

``GRAPH`` is a graph JSON file or a bundled model name.  The core's commands
(``model`` ... ``oneflow``) are defined here and need only the core's
dependencies; the other packages contribute theirs through the
``autopar.commands`` entry-point group in ``pyproject.toml`` (``plan`` from
``autopar_solver.cli``, ``serve``/``worker``/``submit`` from ``autopar_service.cli``), as Flask
and pytest plugins do, so the core never imports them.  A command whose extra is
not installed stays listed and answers ``[missing_extra] ... pip install
'autopar[extra]'``.  Every user error is one ``autopar: error: [code] ...`` line
on stderr with exit status 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from autopar.cli.args import (
    BASELINE_KINDS,
    Command,
    add_mesh_args,
    add_training_args,
    check_writable,
    closest_name,
    graph_arg_help,
    graph_from_arg,
    mesh_from_args,
    model_names,
    pipeline_plan_file,
    plan_from_arg,
    require_extra,
    training_from_args,
    wrote,
)
from autopar.cli.calibrate import add_calibrate_arguments, cmd_calibrate
from autopar.cost.iteration import baseline_training
from autopar.errors import MAX_LINE, AutoparError, ConfigError, PlanError
from autopar.hardware.cluster import Cluster, load_cluster_profile
from autopar.hardware.mesh import Mesh
from autopar.ir.batch import batch_shape
from autopar.ir.graph import Graph
from autopar.ir.plan import check_plan_graph, format_bytes, throughput_line
from autopar.ir.training import TrainingConfig
from autopar.version import __version__

__all__ = ["ENTRY_POINT_GROUP", "build_parser", "main"]

ENTRY_POINT_GROUP = "autopar.commands"
OUTPUT_OPTIONS = ("out", "graph_out")
"""Namespace attributes naming files a command writes; checked before the command runs."""

log = logging.getLogger("autopar")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's error line: ``autopar: error: [bad_args] ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2))
            close = closest_name(choice.group(1), options)
            if close:
                message += f"; did you mean {close!r}?"
        message += parallelism_hint(message)
        self.exit(2, f"autopar: error: [bad_args] {message} (see `{self.prog} --help`)\n")


_PARALLELISM_WORDS = ("tp", "dp", "pp", "vpp", "sp", "mp", "tensor", "pipeline", "parallel", "data-parallel")
"""Option names (or their words) that ask for parallelism in another system's terms."""


def parallelism_hint(message: str) -> str:
    """For argparse's ``unrecognized arguments: --tp 4``: where autopar takes parallelism
    (a mesh, pipeline stages, Megatron-LM's own configuration); else nothing."""
    unknown = re.findall(r"(?:^|\s)--?([A-Za-z][\w-]*)", message.partition("unrecognized arguments:")[2])
    words = {w for name in unknown for w in [name.lower(), *re.split(r"[-_]", name.lower())]}
    if not words & set(_PARALLELISM_WORDS):
        return ""
    return (
        "; autopar takes parallelism as a mesh: --mesh-shape D,T (the last axis tensor-parallel: "
        "--mesh-shape 2,4 is tp 4 on 8 devices), pipeline stages as --stages N, and Megatron-LM's "
        "own as --megatron-config tp=T,pp=P,... (baseline megatron, plan --compare)"
    )


def _load_graph(path: str):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    g = graph_from_arg(path)
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
    graph.name = args.graph_name or model_name(args.name, overrides)
    graph.validate()
    graph.save(args.out)
    info = describe(graph)
    sys.stdout.write(
        f"{graph.name}: {len(graph.ops)} ops, {len(graph.tensors)} tensors, "
        f"{len(graph.variables)} variables, {info.get('parameters', 0):,} parameters; "
        f"built in {built:.2f} s\n"
    )
    wrote("graph", args.out)
    return 0


OVERRIDE_TAGS = {
    "layers": "l",
    "hidden": "h",
    "heads": "a",
    "ffn": "f",
    "vocab": "v",
    "batch": "b",
    "seq": "s",
    "decoder_seq": "ds",
}
"""How ``autopar model`` names a graph built with overrides: ``gpt-1.3b-l48-h6144``."""


def model_name(base: str, overrides: dict[str, Any]) -> str:
    """The name of bundled model ``base`` built with ``overrides``: the bundled name when there
    are none, else it with each override as a tag and its value (:data:`OVERRIDE_TAGS`)."""
    return base + "".join(f"-{OVERRIDE_TAGS[k]}{v}" for k, v in overrides.items())


def cmd_costs(args: argparse.Namespace) -> int:
    from autopar.cost.build_tables import build_cost_tables

    graph = _load_graph(args.graph)
    mesh = mesh_from_args(args)
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
    from autopar.baselines.plans import baseline_plan
    from autopar.cost.evaluate import attach_evaluation, evaluate

    graph = _load_graph(args.graph)
    mesh = mesh_from_args(args)
    if getattr(args, "megatron_config", None) or (args.kind == "megatron" and not args.mesh_shape):
        # Megatron-LM as its users run it: its best configuration, or the one named
        return _named_megatron(args, graph, mesh.cluster)
    plan = baseline_plan(args.kind, graph, mesh, args.zero, runtime=args.runtime)
    # the iteration the real system runs: K as asked, checkpointing as it uses it by default
    plan.training = training_from_args(args, baseline_training(args.kind, TrainingConfig()))
    # a tensor boxed to one layout for several consumers is boxed once, as the system runs it
    attach_evaluation(plan, evaluate(graph, plan))
    plan.save(args.out)
    sys.stdout.write(plan.summary(batch_shape(graph)) + "\n")
    wrote("plan", args.out)
    return 0


def _named_megatron(args: argparse.Namespace, graph: Graph, cluster: Cluster) -> int:
    """``autopar baseline megatron [--megatron-config ...]``: Megatron-LM at the configuration
    the user names, the keys left out (all of them without ``--megatron-config``) searched for
    the fastest that fits the device's memory (:func:`autopar.baselines.search.search_baseline`),
    as ``autopar plan --compare`` and the report price it."""
    from autopar.baselines.search import configured_plan, search_baseline

    if args.kind != "megatron":
        raise ConfigError("bad_baseline_config", f"--megatron-config is for megatron only, not {args.kind!r}")
    training = training_from_args(args, TrainingConfig())
    budget = cluster.device.memory_bytes
    chosen, priced = search_baseline(
        "megatron",
        graph,
        cluster,
        training,
        budget,
        zero_stage=args.zero,
        runtime=args.runtime,
        named=args.megatron_config,
    )
    named = bool(args.megatron_config)
    plan = configured_plan(chosen, priced, budget, named)
    plan.save(args.out)
    sys.stdout.write(plan.summary(batch_shape(graph)) + "\n")
    how = f"named {args.megatron_config!r}" if named else "its best"
    sys.stdout.write(
        f"configuration  {chosen.config.describe()}, runtime {chosen.config.runtime} "
        f"({how}; {len(priced)} priced, the fastest within {budget / 2**30:.0f} GiB)\n"
    )
    wrote("plan", args.out)
    return 0


MAX_ERRORS_SHOWN = 20
"""``autopar evaluate`` prints this many of a plan's errors, then how many it left out."""


def _evaluation_text(name: str, plan: Any, ev: Any, graph: Graph) -> str:
    """What ``autopar evaluate`` prints without ``--json``."""
    mem = ev.memory
    k = ev.training.micro_batches
    batch = batch_shape(graph)
    lines = [
        f"{name}: {'valid' if ev.valid else 'INVALID'} ({plan.source})",
        f"  iteration  {ev.iteration_time_s * 1e3:10.2f} ms modelled (one optimizer step: "
        f"{k} x {ev.micro_batch_time_s * 1e3:.2f} ms micro-batch + {ev.once_per_step_time_s * 1e3:.2f} ms "
        f"once per step; checkpointing {ev.training.checkpointing})",
        *([throughput_line(batch, k, ev.iteration_time_s)] if batch is not None else []),
        (
            f"  at K = 1   {ev.step_time_s * 1e3:10.2f} ms  (one micro-batch with the once-per-step work, "
            if k > 1  # at K = 1 the iteration itself: only its parts
            else "  of which   "
        )
        + f"compute {ev.compute_time_s * 1e3:.2f} ms, comm {ev.comm_time_s * 1e3:.2f} ms"
        + (")" if k > 1 else " (without recomputation)"),
        "  comm/axis  "
        + ", ".join(
            f"axis {a}: {t * 1e3:.2f} ms / {ev.comm_bytes_per_axis[a] / 2**20:.1f} MiB"
            for a, t in ev.comm_time_s_per_axis.items()
        ),
        f"  memory     {format_bytes(mem.total):>13} per device (params {format_bytes(mem.params)}, "
        f"grads {format_bytes(mem.grads)}, optimizer {format_bytes(mem.optimizer)}, "
        f"activations {format_bytes(mem.activations)})",
    ]
    lines += [f"  error: {e}" for e in ev.errors[:MAX_ERRORS_SHOWN]]
    left_out = len(ev.errors) - MAX_ERRORS_SHOWN
    if left_out > 0:
        lines.append(f"  ... {left_out} more error(s) left out ({len(ev.errors)} in all)")
    return "\n".join(lines) + "\n"


def cmd_evaluate(args: argparse.Namespace) -> int:
    from autopar.cost.evaluate import evaluate

    graph = _load_graph(args.graph)
    if pipeline_plan_file(args.plan):
        return _evaluate_pipeline(args, graph)
    plan = plan_from_arg(args.plan)
    check_plan_graph(graph, plan, "autopar plan GRAPH ...")
    if args.cluster_profile:  # re-price the plan's mesh on the profile
        old = plan.mesh.cluster
        cluster = load_cluster_profile(args.cluster_profile).cluster(old.nodes, old.devices_per_node)
        plan.mesh = Mesh(cluster, plan.mesh.shape)
    plan.training = training_from_args(args, plan.training)  # any plan at another K
    ev = evaluate(graph, plan)
    if args.json:
        sys.stdout.write(json.dumps(ev.to_dict()) + "\n")
    else:
        sys.stdout.write(_evaluation_text(args.plan, plan, ev, graph))
    return 0 if ev.valid else 1


def _evaluate_pipeline(args: argparse.Namespace, graph: Any) -> int:
    """``autopar evaluate`` of an ``autopar.pipeline/v1`` plan: every stage re-checked on its
    stage's graph, the 1F1B iteration and each stage's memory with its micro-batches in flight."""
    import dataclasses

    from autopar.pipeline.evaluate import evaluate_pipeline, priced
    from autopar.pipeline.plan import PipelinePlan

    staged = PipelinePlan.from_json(Path(args.plan).read_text())
    if staged.graph_hash != graph.content_hash():
        raise PlanError(
            "plan_graph_mismatch",
            f"plan {args.plan!r} is for graph {staged.graph_hash[:12]}, not this one; plan this graph "
            "with autopar plan GRAPH ...",
        )
    training = training_from_args(args, staged.training)  # any plan at another K
    staged.training = training
    for p in staged.stages:
        p.training = dataclasses.replace(training, recomputed=p.training.recomputed)
    ev = evaluate_pipeline(graph, staged)
    if args.json:
        sys.stdout.write(json.dumps({"errors": ev.errors, **ev.predicted()}) + "\n")
    else:
        status = "valid" if ev.valid else "INVALID"
        summary = priced(staged, ev).summary(batch_shape(graph))
        sys.stdout.write(f"{args.plan}: {status} ({staged.source})\n{summary}\n")
        sys.stdout.writelines(f"  error: {e}\n" for e in ev.errors[:MAX_ERRORS_SHOWN])
    return 0 if ev.valid else 1


# ------------------------------------------------------------------ the core's commands


def _model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=model_names(), metavar="NAME", help="one of: %(choices)s")
    p.add_argument("--out", required=True, help="graph JSON to write")
    p.add_argument(
        "--name",
        dest="graph_name",
        default=None,
        help="the graph's name, as plans and reports show it (default: the model's, with each "
        "override as a tag: gpt-1.3b-l48-h6144)",
    )
    for key in ("layers", "hidden", "heads", "ffn", "vocab", "batch", "seq", "decoder-seq"):
        p.add_argument(
            f"--{key}", type=int, dest=key.replace("-", "_"), help="override (default: the model's)"
        )


def _costs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help=graph_arg_help())
    add_mesh_args(p)
    p.add_argument("--workers", type=int, default=None, help="processes (default: one per CPU)")


def _baseline_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=BASELINE_KINDS, metavar="KIND", help="one of: %(choices)s")
    p.add_argument("graph", help=graph_arg_help())
    add_mesh_args(p)
    add_training_args(p, defaults_from=("1", "full for inferred (LiBai's actrue), else off"))
    p.add_argument(
        "--megatron-config",
        default=None,
        metavar="tp=T,pp=P,dp=D,vpp=V,sp=on|off,recompute=none|selective[:M+M]|full[:N],optimizer=ddp|distributed|fsdp",
        help="megatron only: the configuration you run, priced as Megatron-LM runs it (its mesh "
        "[dp, tp], ZeRO stage and the megatron-lm runtime replace --mesh-shape, --zero, --runtime); "
        "keys left out are searched for the fastest that fits the device's memory.  Without it and "
        "without --mesh-shape, megatron is Megatron-LM at its best configuration (as --compare "
        "prices it); with --mesh-shape, Megatron's layout on that mesh under --runtime",
    )
    p.add_argument("--out", required=True, help="plan JSON to write")


def _evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help=graph_arg_help())
    p.add_argument("plan", help="autopar.plan/v1 JSON file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--cluster-profile", metavar="FILE", help="price on this cluster profile, not the plan's")
    add_training_args(p, defaults_from="the plan's")


def _oneflow_command() -> Command:
    from autopar.cli.oneflow import add_oneflow_arguments, run_oneflow_command

    return Command(
        "oneflow",
        "OneFlow bridge: import jobs and OneFlow's own plans (run it beside OneFlow 0.9)",
        add_oneflow_arguments,
        run_oneflow_command,
    )


def core_commands() -> list[Command]:
    """The commands of the core (numpy and pydantic only)."""
    from autopar.cli.export import EXPORT_COMMAND

    return [
        Command("model", "build a training-step graph of a bundled model", _model_arguments, cmd_model),
        Command(
            "costs", "build the cost tables of a graph and print statistics", _costs_arguments, cmd_costs
        ),
        Command(
            "baseline",
            "write a reference plan (megatron, inferred, data-parallel, single-device)",
            _baseline_arguments,
            cmd_baseline,
        ),
        Command(
            "evaluate",
            "recompute a plan's step time, memory and communication",
            _evaluate_arguments,
            cmd_evaluate,
        ),
        Command(
            "calibrate",
            "fit a cluster profile from nccl-tests output and GEMM timings",
            add_calibrate_arguments,
            cmd_calibrate,
        ),
        _oneflow_command(),
        EXPORT_COMMAND,
    ]


def contributed_commands() -> list[Command]:
    """The commands other packages register under the ``autopar.commands`` entry points."""
    commands = []
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        command = ep.load()
        if not isinstance(command, Command) or command.name != ep.name:
            raise TypeError(f"entry point {ep.name} = {ep.value} must name an autopar Command {ep.name!r}")
        commands.append(command)
    return commands


# ------------------------------------------------------------------ parser


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    """The ``autopar`` parser and its commands by name."""
    parser = ArgumentParser(
        prog="autopar",
        description="Auto-parallel planning for training graphs: N-D SBP plans under a memory budget.",
        epilog=f"GRAPH arguments take a graph JSON file or a bundled model: {', '.join(model_names())}. "
        "Run `autopar COMMAND --help` for a command's options and defaults.",
    )
    parser.add_argument("--version", action="version", version=f"autopar {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands: dict[str, Command] = {}
    for command in [*core_commands(), *contributed_commands()]:
        if command.name in commands:
            raise ValueError(f"two packages register the command {command.name!r}")
        help_text = command.help + (f" (needs autopar[{command.extra}])" if command.extra else "")
        p = sub.add_parser(
            command.name,
            help=help_text,
            description=command.description or help_text,
            epilog=command.epilog,
        )
        command.add_arguments(p)
        commands[command.name] = command
    return parser, commands


def _interrupted() -> int:
    # end a progress line left on the terminal, then one line
    sys.stderr.write(("\n" if sys.stderr.isatty() else "") + "autopar: interrupted\n")
    return 130


ERROR_PREFIX = "autopar: error: "
SHORTENED_HINT = " (autopar -v: all of it)"


def error_lines(exc: AutoparError, verbose: bool) -> str:
    """The error as the user sees it: one line of at most :data:`MAX_LINE` characters, ``autopar:
    error: [code] message`` (a longer or multi-line message shortened, saying how to see it all);
    with ``--verbose`` the whole message and its details (JSON) on the lines after."""
    room = MAX_LINE - len(ERROR_PREFIX)
    line = exc.line(room)
    if line != str(exc) and not verbose:
        line = exc.line(room - len(SHORTENED_HINT)) + SHORTENED_HINT
    text = ERROR_PREFIX + line + "\n"
    if verbose and (line != str(exc) or exc.details):
        text += f"autopar: the whole message: {exc}\n"
        text += "autopar: details: " + json.dumps(exc.to_dict(), default=str, indent=1) + "\n"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    verbose = False
    try:
        parser, commands = build_parser()
        args = parser.parse_args(argv)
        verbose = bool(args.verbose)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
        command = commands[args.command]
        if command.extra:
            require_extra(command.name, command.extra)
        for option in OUTPUT_OPTIONS:
            path = getattr(args, option, None)
            if path:
                check_writable(path, "--" + option.replace("_", "-"))
        return command.run(args)
    except AutoparError as exc:
        sys.stderr.write(error_lines(exc, verbose))
        return 2
    except KeyboardInterrupt:
        return _interrupted()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
