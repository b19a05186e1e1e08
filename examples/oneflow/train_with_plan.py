"""Train a OneFlow model with an autopar plan: the launcher flow, end to end, on CPU.

::

    python train_with_plan.py --model tiny-mt5 --mesh 2,2 --server http://planner:8000 --steps 3
    python train_with_plan.py --model tiny-mt5 --mesh 2,2 --planner solver --steps 3 --out /tmp/run

1. **export** (this process, one CPU rank): build the training job once, write
   ``job.pb``, import it as ``graph.json``, and run ``--steps`` reference steps
   on that one rank (the losses every plan must reproduce);
2. **plan**: with ``--server URL``, request it from the planning service over HTTP
   (:class:`autopar.client.PlanClient`: submit ``graph.json``, wait for the job, read
   the plan record; ``--api-key`` or ``AUTOPAR_API_KEY`` when the service has keys);
   without, ``autopar plan graph.json`` (``--planner solver``) or ``autopar baseline
   KIND`` with the main autopar environment's Python (the solver's ortools cannot live
   beside OneFlow); or ``--plan FILE``;
3. **launch** ``python -m oneflow.distributed.launch --nproc_per_node N
   train_with_plan.py run ...``: every rank lays out the parameters and adds the
   activation hints of the plan (:func:`autopar.bridges.oneflow.apply_plan`), builds the
   job, checks it against the plan (:func:`autopar.bridges.oneflow.check_fidelity`),
   and trains ``--steps`` steps;
4. print the fidelity report and the losses next to the one-rank losses.

``train_with_plan.py plan ...`` stops after step 2 (export and plan, no launch).

The iteration follows the plan: ``--micro-batches K`` and ``--checkpointing
{off,auto,full}`` set what the plan is solved for (``autopar plan --micro-batches
--checkpointing``); the run then takes ``K`` and the recomputed blocks from the plan JSON
(``micro_batches``, ``checkpointing``, ``recomputed_blocks``): ``compile_with_plan`` (or,
with ``--no-pin``, :func:`autopar.bridges.oneflow.iteration.configure_iteration`) sets the
gradient accumulation steps and activation checkpointing on those blocks' modules.  Each
step feeds ``K`` copies of the reference batch, one per micro-batch, and reports the mean
of their losses.

``result.json`` in ``--out`` holds the numbers.  Needs the OneFlow venv
(``scripts/oneflow-env.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import oneflow as flow

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo

from autopar.bridges.oneflow import apply_plan, check_fidelity, export_job, import_job, make_train_graph
from autopar.bridges.oneflow.apply import plan_input_sbps, to_flow_sbp
from autopar.bridges.oneflow.compile import compile_with_plan
from autopar.bridges.oneflow.iteration import (
    checkpoint_modules,
    configure_iteration,
    job_micro_batches,
    job_recomputed_scopes,
    plan_recomputed_scopes,
)
from autopar.bridges.oneflow.planning import request_plan
from autopar.cli.args import parse_bytes
from autopar.client import PlanClient
from autopar.ir.plan import Plan

LEARNING_RATE = 1e-3


def _loss_value(loss: flow.Tensor, placement: flow.placement) -> float:
    """The loss of one step (the mean of its micro-batches' losses under accumulation)."""
    ndim = len(loss.sbp)
    return float(loss.to_global(placement, [flow.sbp.broadcast] * ndim).to_local().numpy().mean())


def export_and_reference(args: argparse.Namespace, out: Path) -> list[float]:
    """Build the job on one rank, export and import it, and train the reference steps."""
    placement = flow.placement("cpu", ranks=[0])
    module, arrays = zoo.build(args.model, seed=0, batch=args.batch, identity_reads=True)
    module = module.to_global(placement, flow.sbp.broadcast)
    inputs = [flow.tensor(a).to_global(placement, flow.sbp.broadcast) for a in arrays]
    graph = make_train_graph(module, flow.optim.AdamW(module.parameters(), lr=LEARNING_RATE))
    t0 = time.perf_counter()
    (out / "job.pb").write_bytes(export_job(graph, *inputs))
    build_s = time.perf_counter() - t0
    imported = import_job(out / "job.pb")
    imported.save(str(out / "graph.json"))
    print(f"[export] {imported} built in {build_s:.2f} s -> {out / 'job.pb'}, {out / 'graph.json'}")
    graph.finish_complie_and_init_runtime()
    return [_loss_value(graph(*inputs), placement) for _ in range(args.steps)]


def run_rank(args: argparse.Namespace) -> None:
    """One rank of the multi-rank run (started by oneflow.distributed.launch)."""
    out = Path(args.out)
    plan = Plan.load(args.plan)
    shape = tuple(plan.mesh.shape)
    placement = flow.placement("cpu", ranks=np.arange(int(np.prod(shape))).reshape(shape).tolist())
    broadcast = [flow.sbp.broadcast] * len(shape)
    module, arrays = zoo.build(args.model, seed=0, batch=args.batch, identity_reads=True)
    k = plan.training.micro_batches  # the inputs hold K micro-batches: K copies of the batch
    inputs = [
        flow.tensor(np.concatenate([a] * k))
        .to_global(placement, broadcast)
        .to_global(placement, to_flow_sbp(sbp))
        for a, sbp in zip(arrays, plan_input_sbps(plan))
    ]
    report = apply_plan(
        module,
        plan,
        placement,
        example_inputs=inputs if args.hints != "none" else None,
        backward_hints=args.hints == "all",
    )
    optimizer = flow.optim.AdamW(module.parameters(), lr=LEARNING_RATE)
    if args.pin:
        graph, compiled = compile_with_plan(lambda: make_train_graph(module, optimizer), plan, *inputs)
        fidelity = compiled.fidelity
        pinned, rejected = compiled.pinned_ops, compiled.rejected
    else:
        graph = make_train_graph(module, optimizer)
        blocks = checkpoint_modules(module, plan_recomputed_scopes(plan, module))
        configure_iteration(graph, k, blocks.values())  # the plan's K and recomputed blocks
        graph.build_graph(*inputs)
        graph.finish_complie_and_init_runtime()
        fidelity = check_fidelity(graph, plan)
        pinned, rejected = 0, []
    losses = [_loss_value(graph(*inputs), placement) for _ in range(args.steps)]
    if flow.env.get_rank() == 0:
        (out / "job_run.pb").write_bytes(graph._full_job_proto.SerializeToString())
        result = {
            "mesh": list(shape),
            "plan_source": plan.source,
            "training": plan.training.to_dict(),
            "job_micro_batches": job_micro_batches(graph._full_job_proto),
            "job_recomputed": job_recomputed_scopes(graph._full_job_proto),
            "losses": losses,
            "fidelity": fidelity.to_dict(),
            "pinned_ops": pinned,
            "rejected": rejected,
            "parameters": report.parameters,
            "unplanned_parameters": report.unplanned,
            "boundaries": report.boundaries,
            "hints": report.hints,
        }
        (out / "rank0.json").write_text(json.dumps(result, indent=1))
        print(f"[run] {pinned} ops pinned (OneFlow refused the planned signatures of {rejected})")
        print(f"[run] compiled job: {fidelity.summary()}")
        read_back = f"K = {result['job_micro_batches']}, recomputed blocks {result['job_recomputed']}"
        print(f"[run] {read_back} (read back from the compiled job)")
        print(f"[run] {len(report.hints)} activation hints; losses {losses}")


def plan_from_service(args: argparse.Namespace, graph_path: Path, shape: list[int], cluster: str) -> Plan:
    """The plan of ``graph_path`` from the planning service at ``args.server``: submit, wait
    for the job (server-sent events, else long-polling), read the plan record."""
    client = PlanClient(args.server, api_key=args.api_key)
    options: dict[str, object] = {"time_limit_s": args.time_limit, "micro_batches": args.micro_batches}
    if args.checkpointing is not None:
        options["checkpointing"] = args.checkpointing
    record = client.plan(
        graph_path.read_bytes(),
        cluster=cluster,
        preset=args.preset,
        mesh_shape=shape,
        memory_budget_bytes=parse_bytes(args.memory) if args.memory else None,
        zero_stage=args.zero,
        options=options,
        on_progress=lambda job: print(f"[plan] job {job.get('status')}", flush=True),
    )
    iteration_ms = record["iteration_time_s"] * 1e3
    print(f"[plan] {args.server}/v1/plans/{record['key']}: iteration {iteration_ms:.2f} ms")
    return Plan.from_dict(record["plan"])


def make_plan(args: argparse.Namespace, out: Path, shape: list[int], ranks: int) -> str:
    """Plan the exported job (from the service with ``--server``, else with autopar in a
    subprocess); the path of the plan JSON."""
    plan_path = str(out / "plan.json")
    cluster = args.cluster or f"1x{ranks}"
    t0 = time.perf_counter()
    if args.server:
        plan = plan_from_service(args, out / "graph.json", shape, cluster)
        plan.save(plan_path)
        print(f"[plan] {plan.source}: planned in {time.perf_counter() - t0:.1f} s\n{plan.summary()}")
        return plan_path
    memory = args.memory
    if args.memory_fraction is not None:
        replicated = request_plan(
            str(out / "graph.json"),
            str(out / "plan_single_device.json"),
            mesh_shape=shape,
            cluster=cluster,
            zero_stage=args.zero,
            planner="single-device",
            preset=args.preset,
        )
        memory = f"{int(args.memory_fraction * replicated.memory_per_device_bytes)}B"
        print(f"[plan] budget {memory}: {args.memory_fraction} x the replicated plan's memory")
    plan = request_plan(
        str(out / "graph.json"),
        plan_path,
        mesh_shape=shape,
        cluster=cluster,
        zero_stage=args.zero,
        planner=args.planner,
        preset=args.preset,
        memory=memory,
        time_limit_s=args.time_limit,
        micro_batches=args.micro_batches,
        checkpointing=args.checkpointing,
    )
    print(f"[plan] {plan.source}: planned in {time.perf_counter() - t0:.1f} s\n{plan.summary()}")
    return plan_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "phase",
        nargs="?",
        default="all",
        choices=["all", "plan", "run"],
        help="all: export, plan, launch; plan: export and plan only (no launch); run: one rank",
    )
    parser.add_argument(
        "--model",
        default="tiny-mt5",
        choices=zoo.KNOWN,
        metavar="MODEL",
        help=f"model, named as the CLI's: {', '.join(zoo.NAMES)} (default: %(default)s)",
    )
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--mesh", default="2,2", help="mesh shape, e.g. 2,2 (ranks = product)")
    parser.add_argument("--cluster", default=None, help="NODESxDEVICES to plan for (default 1xRANKS)")
    parser.add_argument("--planner", default="solver", help="solver, megatron, inferred, data-parallel")
    parser.add_argument("--plan", default=None, help="use this plan JSON instead of planning")
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="request the plan from this planning service (autopar serve) instead of running autopar",
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("AUTOPAR_API_KEY"), help="the service's key (AUTOPAR_API_KEY)"
    )
    parser.add_argument("--preset", default="a100-40g", help="device preset to plan for")
    parser.add_argument("--zero", type=int, default=0, help="ZeRO stage to plan for")
    parser.add_argument("--memory", default=None, help="per-device budget for the solver, e.g. 6MiB")
    parser.add_argument(
        "--memory-fraction",
        type=float,
        default=None,
        help="budget = this fraction of the memory of the replicated (single-device) plan",
    )
    parser.add_argument("--time-limit", type=float, default=20.0, help="solver time limit, s")
    parser.add_argument(
        "--micro-batches", type=int, default=1, help="micro-batches per optimizer step to plan for (K)"
    )
    parser.add_argument(
        "--checkpointing",
        choices=["off", "auto", "full"],
        default=None,
        help="activation checkpointing to plan for (default: the planner's own)",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--hints",
        choices=["all", "forward", "none"],
        default="forward",
        help="activation layout hints at module boundaries (all: also gradients, via hooks)",
    )
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="only parameter layouts and hints, no pinning"
    )
    parser.add_argument("--out", default="/tmp/autopar-train-with-plan")
    args = parser.parse_args()
    if args.phase == "run":
        run_rank(args)
        return

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = [int(s) for s in args.mesh.split(",")]
    ranks = int(np.prod(shape))
    reference = export_and_reference(args, out)
    print(f"[export] one-rank losses {reference}")

    plan_path = args.plan or make_plan(args, out, shape, ranks)
    if args.phase == "plan":
        print(f"[plan] {plan_path}")
        return
    command = [
        sys.executable,
        "-m",
        "oneflow.distributed.launch",
        "--nproc_per_node",
        str(ranks),
        "--master_port",
        os.environ.get("AUTOPAR_ONEFLOW_PORT", "29500"),
        str(Path(__file__).resolve()),
        "run",
        "--model",
        args.model,
        "--plan",
        plan_path,
        "--steps",
        str(args.steps),
        "--out",
        str(out),
    ]
    command += ["--hints", args.hints]
    if not args.pin:
        command.append("--no-pin")
    if args.batch:
        command += ["--batch", str(args.batch)]
    t0 = time.perf_counter()
    subprocess.run(command, check=True, env=dict(os.environ))
    launched = json.loads((out / "rank0.json").read_text())
    result = {
        **launched,
        "reference_losses": reference,
        "launch_s": time.perf_counter() - t0,
        "plan": plan_path,
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(launched["losses"], reference)]
    print(f"[result] losses on {ranks} ranks {launched['losses']}")
    print(f"[result] losses on 1 rank  {reference}  (max relative difference {max(rel):.2e})")
    print(f"[result] {out / 'result.json'}")


if __name__ == "__main__":
    main()
