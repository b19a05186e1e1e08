"""End-to-end planning benchmark (issue: solver).

    .venv/bin/python -m benchmarks.solver [--models mt5-base,t5-base,gpt2-medium,bert-large]
        [--clusters 2x4:4,2,1x8:4,2] [--time-limit 30] [--zero 2]

For each model and cluster:mesh it prints ops, problem size before and after
reductions (and layer tying), time per phase, the reported gap, and the
modelled step time and memory of autopar's plan against the megatron,
inferred and data-parallel baselines evaluated in the same process.
"""

from __future__ import annotations

import argparse
import resource
import time

from autopar.baselines import baseline_plan
from autopar.cluster import Cluster, Mesh, parse_mesh_shape
from autopar.evaluate import evaluate
from autopar.models import build
from solver.options import SolverOptions
from solver.planner import PlanRequest, plan

GIB = 1024**3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mt5-base,t5-base,gpt2-medium,bert-large")
    ap.add_argument("--clusters", default="2x4:4,2,1x8:4,2")
    ap.add_argument("--preset", default="a100-40g")
    ap.add_argument("--memory", type=float, default=40.0, help="GiB per device")
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--layers", type=int, default=None)
    args = ap.parse_args()
    specs = args.clusters.split(",")
    pairs = []
    i = 0
    while i < len(specs):
        cl, shape0 = specs[i].split(":")
        pairs.append((cl, parse_mesh_shape(f"{shape0},{specs[i + 1]}")))
        i += 2
    header = (
        f"{'model':<12}{'cluster':<8}{'mesh':<8}{'ops':>6}{'nodes>red':>12}{'tables s':>9}{'search s':>8}"
        f"{'total s':>8}{'gap':>8}  {'autopar ms':>10}{'megatron':>9}{'inferred':>9}{'dp':>9}  "
        f"{'mem GiB a/m':>12}"
    )
    print(header)
    for name in args.models.split(","):
        overrides = {"layers": args.layers} if args.layers else {}
        graph = build(name, **overrides)
        for cl, shape in pairs:
            cluster = Cluster.parse(cl, args.preset)
            mesh = Mesh(cluster, shape)
            options = SolverOptions(time_limit_s=args.time_limit)
            t0 = time.perf_counter()
            p = plan(PlanRequest(graph, cluster, shape, int(args.memory * GIB), args.zero, options))
            total = time.perf_counter() - t0
            st = p.solver["stats"] if p.solver else {}
            red = st.get("reductions", {})
            nodes = f"{red.get('before', {}).get('nodes', '?')}>{red.get('after', {}).get('nodes', '?')}"
            base = {}
            for kind in ("megatron", "inferred", "data-parallel"):
                ev = evaluate(graph, baseline_plan(kind, graph, mesh, args.zero))
                base[kind] = ev
            mega = base["megatron"]
            print(
                f"{name:<12}{cl:<8}{','.join(map(str, shape)):<8}{len(graph.ops):>6}{nodes:>12}"
                f"{st.get('time_cost_tables_s', 0):>9.1f}{sum(st.get('phases_s', {}).values()):>8.1f}"
                f"{total:>8.1f}{100 * p.solver['gap']:>7.2f}%  {p.step_time_s * 1e3:>10.1f}"
                f"{mega.step_time_s * 1e3:>9.1f}{base['inferred'].step_time_s * 1e3:>9.1f}"
                f"{base['data-parallel'].step_time_s * 1e3:>9.1f}  "
                f"{p.memory_per_device_bytes / GIB:>5.2f}/{mega.memory.total / GIB:<5.2f}"
            )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"peak RSS {rss:.2f} GiB")


if __name__ == "__main__":
    main()
