"""Cost-table build time, cold and warm (memo filled), and unique entries.

    .venv/bin/python -m benchmarks.cost_tables [--model mt5-base] [--mesh-shape 4,2] [--workers 2]

Cold: empty memo and no in-process caches, entries computed (in a process pool
with --workers > 1).
Warm: the same graph again with the memo filled.  Also: a graph that differs in
one layer (one more layer) recomputes only the new keys.  Ratios are against
the serial cold build run in the same process.
"""

from __future__ import annotations

import argparse
import time

from autopar.cost.build_tables import build_cost_tables
from autopar.cost.tables import clear_process_caches
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh, parse_mesh_shape
from autopar.infra.store import MemoryStore
from autopar.models import build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mt5-base")
    ap.add_argument("--cluster", default="2x4")
    ap.add_argument("--mesh-shape", default="4,2")
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    graph = build(args.model)
    mesh = Mesh(Cluster.parse(args.cluster), parse_mesh_shape(args.mesh_shape))

    def timed(store: MemoryStore, workers: int, g=graph, cold: bool = True) -> tuple[float, dict]:
        if cold:  # nothing left from the previous run in this process either
            clear_process_caches()
        t0 = time.perf_counter()
        tables = build_cost_tables(g, mesh, args.zero, store=store, workers=workers)
        return time.perf_counter() - t0, tables.stats

    serial, stats = timed(MemoryStore(), 1)
    store = MemoryStore()
    cold, _ = timed(store, args.workers)
    warm, wstats = timed(store, args.workers, cold=False)
    print(
        f"{args.model}: {stats['ops']} ops, {stats['edges']} edges; unique op entries "
        f"{stats['unique_op_entries']}, unique edge entries {stats['unique_edge_entries']}"
    )
    print(f"cold serial          {serial:7.2f} s  (1.00x)")
    print(f"cold {args.workers} workers      {cold:7.2f} s  ({serial / cold:.2f}x faster than serial)")
    print(
        f"warm (memo filled)   {warm:7.2f} s  ({serial / warm:.1f}x faster; computed "
        f"{wstats['op_entries_computed']} op / {wstats['edge_entries_computed']} edge entries)"
    )
    config = graph.meta.get("config", {})
    layers = config.get("layers") or config.get("encoder_layers")
    if layers:
        key = "encoder_layers" if "encoder_layers" in config else "layers"
        bigger = build(args.model, **{key: int(layers) + 1})
        t, s = timed(store, args.workers, bigger, cold=False)
        print(
            f"one more layer       {t:7.2f} s  (computed {s['op_entries_computed']} op / "
            f"{s['edge_entries_computed']} edge entries of {s['unique_op_entries']} / "
            f"{s['unique_edge_entries']})"
        )


if __name__ == "__main__":
    main()
