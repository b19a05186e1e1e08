"""Modelled step time and memory of the reference plans (issue: planning core).

    .venv/bin/python -m benchmarks.baselines [--model mt5-base] [--cluster 2x4] [--mesh-shape 4,2] [--zero 2]
        [--micro-batches K]

Prints, per baseline, the evaluator's step time, compute / communication split,
communication per mesh axis and memory per device, and the ratio to ``megatron``;
with ``--micro-batches K`` also the iteration (K micro-batches, the checkpointing
each system runs with: :func:`autopar.cost.iteration.baseline_training`).
"""

from __future__ import annotations

import argparse
import time

from autopar.baselines.plans import baseline_plan
from autopar.cost.evaluate import evaluate
from autopar.cost.iteration import baseline_training
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh, parse_mesh_shape
from autopar.ir.training import TrainingConfig
from autopar.models import build

GIB = 1024**3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mt5-base")
    ap.add_argument("--cluster", default="2x4")
    ap.add_argument("--preset", default="a100-40g")
    ap.add_argument("--mesh-shape", default="4,2")
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    graph = build(args.model)
    mesh = Mesh(Cluster.parse(args.cluster, args.preset), parse_mesh_shape(args.mesh_shape))
    print(
        f"{args.model}: {len(graph.ops)} ops, built in {time.perf_counter() - t0:.2f} s; "
        f"cluster {args.cluster} {args.preset}, mesh {list(mesh.shape)}, ZeRO-{args.zero}"
    )
    results = {}
    for kind in ("megatron", "inferred", "data-parallel", "single-device"):
        t1 = time.perf_counter()
        plan = baseline_plan(kind, graph, mesh, args.zero)
        ev = evaluate(graph, plan, training=baseline_training(kind, TrainingConfig(args.micro_batches)))
        results[kind] = (ev, time.perf_counter() - t1)
    base = results["megatron"][0].step_time_s
    print(
        f"{'baseline':<15}{'step ms':>10}{'x megatron':>12}{'compute ms':>12}{'comm ms':>10}"
        f"{'axis0 ms':>10}{'axis1 ms':>10}{'mem GiB':>9}{'valid':>7}{'build s':>9}"
        f"{'iteration ms':>14}{'ckpt':>6}"
    )
    for kind, (ev, dt) in results.items():
        axes = [ev.comm_time_s_per_axis.get(a, 0.0) * 1e3 for a in range(2)]
        print(
            f"{kind:<15}{ev.step_time_s * 1e3:>10.1f}{ev.step_time_s / base:>12.2f}"
            f"{ev.compute_time_s * 1e3:>12.1f}{ev.comm_time_s * 1e3:>10.1f}"
            f"{axes[0]:>10.1f}{axes[1]:>10.1f}{ev.memory.total / GIB:>9.2f}{ev.valid!s:>7}{dt:>9.2f}"
            f"{ev.iteration_time_s * 1e3:>14.1f}{ev.training.checkpointing:>6}"
        )


if __name__ == "__main__":
    main()
