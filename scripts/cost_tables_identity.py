"""Dump or compare every op and edge cost array of a few cold cost-table builds.

    python scripts/cost_tables_identity.py dump OUT.npz [--more] [--only=mt5-base@4,2,1]
    python scripts/cost_tables_identity.py compare A.npz B.npz
    python scripts/cost_tables_identity.py sample [--edges=40] [--only=mt5-base@2,2,2]

Run ``dump`` once with the old code on ``PYTHONPATH`` and once with the new, then
``compare``: a change that only makes the tables faster to compute must leave
every array identical (exactly; the largest relative difference is printed).
Cases: mt5-base on [4, 2] and [2, 4] (cluster 2x4), tiny-gpt on [2, 2] (1x4) and
[2, 2, 2] (2x4), ZeRO-2, the default runtime profile; ``--more`` takes meshes with
size-1 axes instead (mt5-base on [4, 2, 1] and [1, 1, 1, 8]), slow with the old code.

``sample`` checks the three-axis tables, which the old code takes minutes per
mt5-base case to build: for mt5-base on [2, 2, 2] (2x4), [4, 2, 4] and [2, 2, 8]
(4x8), it builds the tables (priced from the shared
:class:`autopar.runtimes.oneflow_09.hop_table.HopTable`) and reprices a sample of the edges,
every pair, on the reference path: each pair's route and hops as
:func:`autopar.runtimes.oneflow_09.pricing.chain_steps` lowers them (``lower_hop`` and its
per-pair send/recv contraction), gradient edges through
:func:`autopar.cost.edges.edge_time` pair by pair.  Every entry must be equal
(the largest relative difference is printed).
"""

from __future__ import annotations

import sys
import time

import numpy as np

CASES = [
    ("mt5-base", "2x4", (4, 2)),
    ("tiny-gpt", "1x4", (2, 2)),
    ("tiny-gpt", "2x4", (2, 2, 2)),
    ("mt5-base", "2x4", (2, 4)),
]
MORE = [
    ("mt5-base", "2x4", (4, 2, 1)),
    ("mt5-base", "1x8", (1, 1, 1, 8)),
]


def dump(path: str, cases: list[tuple[str, str, tuple[int, ...]]]) -> None:
    import autopar
    from autopar.cost.build_tables import build_cost_tables
    from autopar.cost.tables import clear_process_caches
    from autopar.hardware.cluster import Cluster
    from autopar.hardware.mesh import Mesh
    from autopar.infra.store import MemoryStore
    from autopar.models import build

    print("autopar from", autopar.__file__)
    arrays: dict[str, np.ndarray] = {}
    for model, cluster, shape in cases:
        graph = build(model)
        mesh = Mesh(Cluster.parse(cluster), shape)
        clear_process_caches()
        t0 = time.perf_counter()
        tables = build_cost_tables(graph, mesh, 2, store=MemoryStore(), workers=1)
        case = f"{model}@{','.join(map(str, shape))}"
        print(f"{case}: {time.perf_counter() - t0:.2f} s")
        for name, op in tables.ops.items():
            arrays[f"{case}|op|{name}"] = op.compute_s
            arrays[f"{case}|sig|{name}"] = np.array([str(s) for s in op.signatures])
        for e in tables.edges:
            arrays[f"{case}|edge|{e.producer}.{e.out_port}->{e.consumer}.{e.in_port}"] = e.matrix
    np.savez_compressed(path, **arrays)


SAMPLE = [
    ("mt5-base", "2x4", (2, 2, 2)),
    ("mt5-base", "4x8", (4, 2, 4)),
    ("mt5-base", "4x8", (2, 2, 8)),
]


def reference_matrix(tables: object, edge: object) -> np.ndarray:
    """The edge's matrix priced pair by pair, off the shared hop table."""
    from autopar.cost.edges import EdgeKind, edge_kind, edge_time
    from autopar.ir.optimizer import weight_gradient_path
    from autopar.runtimes.oneflow_09.boxing import OneFlowBoxing

    t, e = tables, edge
    graph, mesh = t.graph, t.mesh  # type: ignore[attr-defined]
    spec = graph.tensors[e.tensor]  # type: ignore[attr-defined]
    cons = graph.op_by_name[e.consumer]  # type: ignore[attr-defined]
    rows = range(len(t.ops[e.producer].signatures))  # type: ignore[attr-defined]
    cols = range(len(t.ops[e.consumer].signatures))  # type: ignore[attr-defined]
    src = [t.port_sbp(e.producer, i, e.out_port, True) for i in rows]  # type: ignore[attr-defined]
    dst = [t.port_sbp(e.consumer, j, e.in_port, False) for j in cols]  # type: ignore[attr-defined]
    gradient = e.tensor in weight_gradient_path(graph)  # type: ignore[attr-defined]
    kind = edge_kind(cons, e.in_port, gradient, t.runtime.lowering.value)  # type: ignore[attr-defined]
    if kind is EdgeKind.GRADIENT:
        return np.array([[edge_time(spec, a, b, mesh, kind, t.runtime)[0] for b in dst] for a in src])  # type: ignore[attr-defined]
    if kind is EdgeKind.IN_PLACE:
        return np.array([[0.0 if a == b else np.inf for b in dst] for a in src])
    from autopar.ir.graph import DTYPE_BYTES

    search = OneFlowBoxing(spec.shape, DTYPE_BYTES[spec.dtype], mesh)
    return search.matrices(src, dst, None)[0]


def sample(cases: list[tuple[str, str, tuple[int, ...]]], n_edges: int) -> int:
    from autopar.cost.build_tables import build_cost_tables
    from autopar.cost.tables import clear_process_caches
    from autopar.hardware.cluster import Cluster
    from autopar.hardware.mesh import Mesh
    from autopar.infra.store import MemoryStore
    from autopar.models import build

    bad = 0
    worst = 0.0
    for model, cluster, shape in cases:
        graph = build(model)
        mesh = Mesh(Cluster.parse(cluster), shape)
        clear_process_caches()
        t0 = time.perf_counter()
        tables = build_cost_tables(graph, mesh, 2, store=MemoryStore(), workers=1)
        built = time.perf_counter() - t0
        by_key: dict[tuple[str, str, tuple[int, ...]], object] = {}
        for e in tables.edges:  # one edge per distinct (tensor shape and dtype, ports' SBP lists)
            spec = graph.tensors[e.tensor]
            by_key.setdefault((spec.dtype, e.out_port + e.in_port, tuple(spec.shape)), e)
        picked = list(by_key.values())[:: max(1, len(by_key) // n_edges)][:n_edges]
        t1 = time.perf_counter()
        entries = 0
        for e in picked:
            ref = reference_matrix(tables, e)
            got = e.matrix  # type: ignore[attr-defined]
            entries += ref.size
            if not np.array_equal(np.isfinite(ref), np.isfinite(got)):
                print("inf pattern differs:", e)
                bad += 1
                continue
            f = np.isfinite(ref)
            rel = np.abs(ref[f] - got[f]) / np.maximum(np.abs(ref[f]), 1e-300)
            worst = max(worst, float(rel.max(initial=0.0)))
            if not np.array_equal(ref, got):
                bad += 1
        case = f"{model}@{','.join(map(str, shape))}"
        print(
            f"{case}: tables {built:.2f} s ({tables.stats['time_edges_s']:.2f} s edges); {len(picked)} "
            f"edges, {entries} entries repriced pair by pair in {time.perf_counter() - t1:.1f} s"
        )
    print(f"{bad} sampled edges differ, max relative difference {worst:.3g}")
    return 1 if bad else 0


def compare(a_path: str, b_path: str) -> int:
    a, b = np.load(a_path), np.load(b_path)
    if set(a.files) != set(b.files):
        print("different entries:", sorted(set(a.files) ^ set(b.files))[:10])
        return 1
    bad = 0
    worst = 0.0
    for k in a.files:
        x, y = a[k], b[k]
        if x.shape != y.shape or x.dtype.kind != y.dtype.kind:
            print("shape/type differs:", k, x.shape, y.shape)
            bad += 1
            continue
        if x.dtype.kind in "US":
            if not np.array_equal(x, y):
                print("signatures differ:", k)
                bad += 1
            continue
        if not np.array_equal(x, y):
            finite = np.isfinite(x) & np.isfinite(y)
            if not np.array_equal(np.isfinite(x), np.isfinite(y)):
                print("inf pattern differs:", k)
                bad += 1
                continue
            rel = np.abs(x[finite] - y[finite]) / np.maximum(np.abs(x[finite]), 1e-300)
            worst = max(worst, float(rel.max()))
            print(f"differs: {k} (max relative {rel.max():.3g})")
            bad += 1
    print(f"{len(a.files)} arrays compared, {bad} differ, max relative difference {worst:.3g}")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "sample":
        n = int(next((a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--edges=")), "40"))
        only = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--only=")]
        sys.exit(sample([c for c in SAMPLE if not only or f"{c[0]}@{','.join(map(str, c[2]))}" in only], n))
    if sys.argv[1] == "dump":
        picked = MORE if "--more" in sys.argv[3:] else CASES
        only = [a.split("=", 1)[1] for a in sys.argv[3:] if a.startswith("--only=")]
        dump(sys.argv[2], [c for c in picked if not only or f"{c[0]}@{','.join(map(str, c[2]))}" in only])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
