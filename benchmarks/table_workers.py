"""Cold cost-table build across ``autopar worker`` processes: 1 vs 2 workers (issue 25).

    .venv/bin/python -m benchmarks.table_workers [--model mt5-base] [--mesh 2,2,2] [--workers 1,2]
    .venv/bin/python -m benchmarks.table_workers --redis-url redis://HOST:6379/0 --external

Times the tables of ``--model`` on ``--mesh`` (cluster ``--cluster``) built from an empty
store: in this process (serial), in a local process pool of 2, and through
:class:`autopar_service.table_jobs.RQTableBuilder` with N real ``autopar worker``
processes (started here, registered before the clock starts; each N on fresh workers
and an empty cost store).  The requester only waits (``help_out=False``), so the
figure is the workers' own.  Without ``--redis-url`` a local ``redis-server`` is
started.  ``--external`` starts no workers: it uses whatever workers serve the queue
(e.g. the compose stack of ``docker/``, scaled to 1 then 2 workers by hand) and says
how many are alive.  Entries are compared with the serial build's (bit-identical).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _cold_cost_store(store: Any) -> None:
    from autopar_service.table_jobs import COST_PREFIX

    for key in store.client.scan_iter(match=f"{store.prefix}{COST_PREFIX}*", count=1000):
        store.client.delete(key)


def _start_workers(url: str, queue: str, n: int) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "AUTOPAR_QUEUE_NAME": queue, "PYTHONPATH": str(REPO)}
    env.pop("AUTOPAR_REDIS_URL", None)
    return [
        subprocess.Popen(
            [sys.executable, "-m", "autopar.cli", "worker", "--redis-url", url, "--name", f"{queue}-{i}"],
            env=env,
            cwd=REPO,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(n)
    ]


def _alive_workers(store: Any, queue: str | None) -> int:
    """Workers whose liveness key is set: those named ``{queue}-*`` (started here), or all
    (``queue=None``: external workers keep RQ's own names)."""
    from autopar_service.worker import alive_key

    return len(list(store.client.scan_iter(match=alive_key(f"{queue}-*" if queue else "*"))))


def _timed_remote(graph: Any, mesh: Any, store: Any, settings: Any) -> tuple[float, Any, dict[str, Any]]:
    from autopar.cost.build_tables import build_cost_tables
    from autopar.infra.progress import Deadline
    from autopar_cache.base import PrefixedStore
    from autopar_service.table_jobs import COST_PREFIX, RQTableBuilder

    builder = RQTableBuilder(store, settings, help_out=False)
    t = time.perf_counter()
    tables = build_cost_tables(
        graph,
        mesh,
        2,
        store=PrefixedStore(store, COST_PREFIX),
        workers=1,
        parallel_threshold=1,
        remote=builder,
        deadline=Deadline(1800),
    )
    wall = time.perf_counter() - t
    return wall, tables, {**builder.stats, "workers_seen": len(builder.workers_seen)}


def _same(a: Any, b: Any) -> bool:
    import numpy as np

    return all(np.array_equal(x.matrix, y.matrix) for x, y in zip(a.edges, b.edges, strict=True)) and all(
        np.array_equal(a.ops[k].compute_s, b.ops[k].compute_s) for k in a.ops
    )


def _local(graph: Any, mesh: Any, workers: int) -> tuple[float, Any]:
    from autopar.cost.build_tables import build_cost_tables
    from autopar.cost.tables import clear_process_caches

    clear_process_caches()
    t = time.perf_counter()
    tables = build_cost_tables(graph, mesh, 2, workers=workers, parallel_threshold=1 if workers > 1 else 64)
    return time.perf_counter() - t, tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mt5-base")
    ap.add_argument("--cluster", default="2x4")
    ap.add_argument("--mesh", default="2,2,2")
    ap.add_argument("--workers", default="1,2", help="comma list of worker counts")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--external", action="store_true", help="use the workers already serving --queue")
    ap.add_argument("--skip-local", action="store_true", help="no local pool build (serial: the reference)")
    ap.add_argument(
        "--queue", default=None, help="queue name (default: a fresh one; autopar with --external)"
    )
    args = ap.parse_args()

    from autopar.hardware.cluster import Cluster
    from autopar.hardware.mesh import Mesh, parse_mesh_shape
    from autopar.models import build
    from autopar_cache.redis_server import RedisServer
    from autopar_cache.redis_store import RedisStore
    from autopar_service.settings import Settings

    graph = build(args.model)
    mesh = Mesh(Cluster.parse(args.cluster), parse_mesh_shape(args.mesh))
    rows: list[dict[str, Any]] = []
    serial_s, reference = _local(graph, mesh, 1)
    rows.append({"how": "local, serial", "wall_s": serial_s})
    if not args.skip_local:
        pool_s, _ = _local(graph, mesh, 2)
        rows.append({"how": "local, process pool of 2", "wall_s": pool_s})
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    store = RedisStore(url)
    try:
        for n in [int(x) for x in args.workers.split(",")] if not args.external else [0]:
            queue = args.queue or ("autopar" if args.external else f"bench-{uuid.uuid4().hex[:6]}")
            settings = Settings(redis_url=url, queue_name=queue)
            procs = [] if args.external else _start_workers(url, queue, n)
            try:
                while not args.external and _alive_workers(store, queue) < n:
                    time.sleep(0.2)
                _cold_cost_store(store)
                wall, tables, stats = _timed_remote(graph, mesh, store, settings)
                how = f"{_alive_workers(store, None) if args.external else n} worker(s) via RQ"
                rows.append({"how": how, "wall_s": wall, **stats, "identical": _same(tables, reference)})
            finally:
                for p in procs:
                    os.killpg(p.pid, 15)
                    p.wait(30)
    finally:
        store.close()
        if server is not None:
            server.stop()
    print(f"{args.model} on {list(mesh.shape)} ({args.cluster}), cold; load average {os.getloadavg()[0]:.1f}")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
