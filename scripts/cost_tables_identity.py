"""Dump or compare every op and edge cost array of a few cold cost-table builds.

    python scripts/cost_tables_identity.py dump OUT.npz [--more] [--only=mt5-base@4,2,1]
    python scripts/cost_tables_identity.py compare A.npz B.npz

Run ``dump`` once with the old code on ``PYTHONPATH`` and once with the new, then
``compare``: a change that only makes the tables faster to compute must leave
every array identical (exactly; the largest relative difference is printed).
Cases: mt5-base on [4, 2] and [2, 4] (cluster 2x4), tiny-gpt on [2, 2] (1x4) and
[2, 2, 2] (2x4), ZeRO-2, the default runtime profile; ``--more`` takes meshes with
size-1 axes instead (mt5-base on [4, 2, 1] and [1, 1, 1, 8]), slow with the old code.
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
    from autopar.cluster import Cluster, Mesh
    from autopar.cost_tables import build_cost_tables, clear_process_caches
    from autopar.models import build
    from autopar.store import MemoryStore

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
    if sys.argv[1] == "dump":
        picked = MORE if "--more" in sys.argv[3:] else CASES
        only = [a.split("=", 1)[1] for a in sys.argv[3:] if a.startswith("--only=")]
        dump(sys.argv[2], [c for c in picked if not only or f"{c[0]}@{','.join(map(str, c[2]))}" in only])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
