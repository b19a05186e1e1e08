"""mt5-base on 8 CPU ranks as a [4, 2] mesh: OneFlow's SBP inference and auto-parallel vs autopar.

Run in the OneFlow venv (``scripts/oneflow-env.sh``)::

    python benchmarks/oneflow_mt5.py --out /tmp/oneflow-mt5 [--layers 12] [--batch 16] [--fused-cross-kv]

``--fused-cross-kv`` builds each cross-attention's key and value as one head-first
``key_value`` linear, LiBai's layout (``examples/oneflow/mt5.py``); the default keeps
HF's separate ``k`` and ``v``.

1. ``build`` (8 ranks, started here with ``oneflow.distributed.launch``): build the
   mt5-base training job (ZeRO-2, AdamW) twice with ``build_graph`` and time it:
   (a) OneFlow's SBP inference with LiBai's parameter layout (column-parallel
   q/k/v/wi_0/wi_1/lm_head ``(B, S(0))``, row-parallel o/wo ``(B, S(1))``,
   vocab-parallel embedding ``(B, S(0))``, norms and position bias ``B``, data
   ``(S(0), B)``); (b) OneFlow's auto-parallel (``enable_auto_parallel``; as LiBai
   runs it, the parameter layout above is kept and everything else searched;
   ``--ap-ignore-user-sbp`` searches parameters too).  Each variant is one
   8-rank launch; parameters are allocated, not initialised, and nothing runs.
   The job is built with SGD: OneFlow allocates Adam's states at build time,
   which 8 CPU ranks cannot afford for mt5-base; autopar models AdamW states
   (mixed-precision, 16 bytes per parameter) for every plan alike.
2. ``plan``: import job (a) as autopar's graph; (c) the ``megatron`` baseline and
   (d) autopar's plan come from ``autopar baseline`` / ``autopar plan`` run with
   the main environment's Python (ortools cannot live beside OneFlow), timed.
3. ``evaluate``: autopar's evaluator on the four plans (the OneFlow ones read with
   ``import_plan`` from the jobs): modelled step time, memory per device,
   communication per mesh axis.  Writes ``result.json`` and ``table.md`` in ``--out``.

The cluster modelled is 2 nodes x 4 A100-40G (``--cluster 2x4``): mesh axis 0
(size 4) crosses nodes, axis 1 (size 2) stays inside a node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples" / "oneflow"))

COLUMN = (
    "q.weight",
    "k.weight",
    "v.weight",
    "key_value.weight",  # --fused-cross-kv: LiBai's cross-attention key_value
    "wi_0.weight",
    "wi_1.weight",
    "lm_head.weight",
    "shared.weight",
)
ROW = ("o.weight", "wo.weight")


def libai_layout(name: str) -> tuple[str, str]:
    """LiBai's parameter SBP on a [dp, tp] mesh, by parameter name (MT5 in LiBai)."""
    if name.endswith(COLUMN):
        return ("B", "S(0)")
    if name.endswith(ROW):
        return ("B", "S(1)")
    return ("B", "B")


# ------------------------------------------------------------------ phase 1: 8 ranks


def build_rank(args: argparse.Namespace) -> None:
    """One rank of the 8-rank job build of ``args.variant`` (parameters allocated, never touched by us)."""
    import numpy as np
    import oneflow as flow
    import zoo

    from autopar.bridges.oneflow import make_train_graph

    out = Path(args.out)
    placement = flow.placement("cpu", ranks=np.arange(8).reshape(4, 2).tolist())
    sbp = {"B": flow.sbp.broadcast, "S(0)": flow.sbp.split(0), "S(1)": flow.sbp.split(1)}
    module, arrays = zoo.build(
        "mt5-base",
        seed=None,
        batch=args.batch,
        layers=args.layers,
        fused=True,
        vocab=args.vocab,
        fused_cross_kv=args.fused_cross_kv,
    )
    for name, param in list(module.named_parameters()):
        layout = (
            ("B", "B") if args.ap_ignore_user_sbp and args.variant == "auto_parallel" else libai_layout(name)
        )
        *path, attr = name.split(".")
        owner = module
        for part in path:
            owner = getattr(owner, part)
        empty = flow.empty(*param.shape, placement=placement, sbp=[sbp[s] for s in layout])
        setattr(owner, attr, flow.nn.Parameter(empty))
    broadcast = [flow.sbp.broadcast] * 2
    inputs = [
        flow.tensor(a)
        .to_global(placement, broadcast)
        .to_global(placement, [flow.sbp.split(0), flow.sbp.broadcast])
        for a in arrays
    ]
    # SGD: OneFlow allocates (and zero-fills) Adam's m and v when the job is built, which
    # 8 CPU ranks cannot afford for mt5-base; autopar models AdamW states either way.
    optimizer = flow.optim.SGD(module.parameters(), lr=1e-4)
    graph = make_train_graph(
        module,
        optimizer,
        zero_stage=2,
        auto_parallel=args.variant == "auto_parallel",
        auto_parallel_ignore_user_sbp=args.ap_ignore_user_sbp,
    )
    wall, cpu = time.perf_counter(), time.process_time()
    graph.build_graph(*inputs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if flow.env.get_rank() == 0:
        (out / f"job_{args.variant}.pb").write_bytes(graph._full_job_proto.SerializeToString())
        (out / f"build_{args.variant}.json").write_text(json.dumps({"wall_s": wall, "cpu_s": cpu}))
        print(
            f"[build] {args.variant}: {len(graph._full_job_proto.net.op)} ops, build_graph "
            f"{wall:.1f} s wall, {cpu:.1f} s CPU on rank 0",
            flush=True,
        )


# ------------------------------------------------------------------ phases 2 and 3


def summarize(name: str, graph: Any, plan: Any, plan_s: float | None) -> dict[str, Any]:
    from autopar.cost.evaluate import evaluate

    ev = evaluate(graph, plan)
    gib = 1024**3
    return {
        "plan": name,
        "source": plan.source,
        "valid": ev.valid,
        "errors": len(ev.errors),
        "step_time_ms": ev.step_time_s * 1e3,
        "compute_ms": ev.compute_time_s * 1e3,
        "comm_ms": ev.comm_time_s * 1e3,
        "comm_ms_per_axis": {str(a): t * 1e3 for a, t in sorted(ev.comm_time_s_per_axis.items())},
        "comm_gib_per_axis": {str(a): b / gib for a, b in sorted(ev.comm_bytes_per_axis.items())},
        "memory_gib": ev.memory.total / gib,
        "memory_breakdown_gib": {
            "params": ev.memory.params / gib,
            "grads": ev.memory.grads / gib,
            "optimizer": ev.memory.optimizer / gib,
            "activations": ev.memory.activations / gib,
        },
        "planning_s": plan_s,
        "fallback_op_types": ev.fallback_op_types,
    }


def table(rows: list[dict[str, Any]], timings: dict[str, Any]) -> str:
    lines = [
        "| plan | step time (ms) | compute / comm (ms) | comm axis 0 / axis 1 (ms) "
        "| comm axis 0 / axis 1 (GiB) | memory / device (GiB) | time to plan (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ms, gb = r["comm_ms_per_axis"], r["comm_gib_per_axis"]
        plan_s = "-" if r["planning_s"] is None else f"{r['planning_s']:.1f}"
        lines.append(
            f"| {r['plan']} | {r['step_time_ms']:.1f} | {r['compute_ms']:.1f} / {r['comm_ms']:.1f} "
            f"| {ms.get('0', 0):.1f} / {ms.get('1', 0):.1f} | {gb.get('0', 0):.2f} / {gb.get('1', 0):.2f} "
            f"| {r['memory_gib']:.2f} | {plan_s} |"
        )
    lines.append("")
    names = {"inference": "SBP inference", "auto_parallel": "auto-parallel"}
    lines.append(
        "OneFlow `build_graph` on 8 CPU ranks sharing 2 cores (wall / CPU of rank 0): "
        + ", ".join(f"{names[v]} {t['wall_s']:.1f} s / {t['cpu_s']:.1f} s" for v, t in timings.items())
        + "."
    )
    return "\n".join(lines)


def plan_and_evaluate(args: argparse.Namespace) -> None:
    from autopar.bridges.oneflow import import_job, import_plan
    from autopar.bridges.oneflow.planning import request_plan
    from autopar.hardware.cluster import Cluster

    out = Path(args.out)
    cluster = Cluster.parse(args.cluster, args.preset)
    timings = {v: json.loads((out / f"build_{v}.json").read_text()) for v in args.variants}
    rows = []
    graphs = {}
    for variant, label in (
        ("inference", "(a) OneFlow SBP inference, LiBai layout"),
        ("auto_parallel", "(b) OneFlow auto-parallel"),
    ):
        if variant not in args.variants:
            continue
        graph = import_job(out / f"job_{variant}.pb", zero_stage=2)
        graphs[variant] = graph
        if variant == "inference":
            graph.save(str(out / "graph.json"))
        plan = import_plan(out / f"job_{variant}.pb", graph=graph, cluster=cluster, zero_stage=2)
        plan.save(str(out / f"plan_{variant}.json"))
        build_s = timings[variant]["wall_s"] if variant == "auto_parallel" else None
        rows.append(summarize(label, graph, plan, build_s))
    for planner, label in (("megatron", "(c) megatron baseline"), ("solver", "(d) autopar")):
        t0 = time.perf_counter()
        plan = request_plan(
            str(out / "graph.json"),
            str(out / f"plan_{planner}.json"),
            mesh_shape=(4, 2),
            cluster=args.cluster,
            preset=args.preset,
            zero_stage=2,
            planner=planner,
            time_limit_s=args.time_limit,
        )
        wall = time.perf_counter() - t0
        rows.append(summarize(label, graphs["inference"], plan, wall if planner == "solver" else None))
    result = {
        "model": "mt5-base",
        "layers": args.layers,
        "vocab": args.vocab,
        "fused_cross_kv": args.fused_cross_kv,
        "batch": args.batch,
        "sequence": [512, 128],
        "mesh": [4, 2],
        "cluster": args.cluster,
        "preset": args.preset,
        "zero_stage": 2,
        "graph_ops": len(graphs["inference"].ops),
        "oneflow_ops": graphs["inference"].meta["oneflow"]["op_count"],
        "build_s": timings,
        "plans": rows,
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    text = table(rows, timings)
    (out / "table.md").write_text(text + "\n")
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", nargs="?", default="all", choices=["all", "build", "evaluate"])
    parser.add_argument("--variant", default="inference", choices=["inference", "auto_parallel"])
    parser.add_argument(
        "--ap-ignore-user-sbp",
        action="store_true",
        help="auto-parallel also searches parameter layouts (all parameters start B; needs 2x memory)",
    )
    parser.add_argument("--out", default="/tmp/autopar-oneflow-mt5")
    parser.add_argument("--layers", type=int, default=12, help="encoder and decoder layers (12 = mt5-base)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary (default mt5-base's 250112)")
    parser.add_argument("--master-port", type=int, default=29500, help="port of rank 0 for the 8-rank launch")
    parser.add_argument(
        "--fused-cross-kv", action="store_true", help="one head-first key_value linear per cross-attention"
    )
    parser.add_argument(
        "--variants",
        default="inference,auto_parallel",
        type=lambda text: tuple(v for v in text.split(",") if v),
        help="OneFlow jobs to build (auto_parallel's cost tables take OneFlow minutes on 8 CPU ranks)",
    )
    parser.add_argument("--cluster", default="2x4")
    parser.add_argument("--preset", default="a100-40g")
    parser.add_argument("--time-limit", type=float, default=60.0, help="solver time limit, s")
    args = parser.parse_args()
    if "inference" not in args.variants or set(args.variants) - {"inference", "auto_parallel"}:
        parser.error(f"--variants: 'inference', optionally 'auto_parallel'; got {','.join(args.variants)}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.phase == "build":
        build_rank(args)
        return
    if args.phase == "all":
        for variant in args.variants:
            command = [
                sys.executable,
                "-m",
                "oneflow.distributed.launch",
                "--nproc_per_node",
                "8",
                "--master_port",
                str(args.master_port),
                str(Path(__file__).resolve()),
                "build",
                "--variant",
                variant,
                "--out",
                args.out,
                "--layers",
                str(args.layers),
                "--batch",
                str(args.batch),
            ]
            if args.vocab is not None:
                command += ["--vocab", str(args.vocab)]
            if args.ap_ignore_user_sbp:
                command.append("--ap-ignore-user-sbp")
            if args.fused_cross_kv:
                command.append("--fused-cross-kv")
            subprocess.run(command, check=True, env=dict(os.environ))
    plan_and_evaluate(args)


if __name__ == "__main__":
    main()
