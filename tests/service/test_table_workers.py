"""Cost tables across real ``autopar worker`` processes (RQ) into a real Redis store.

The entries the workers build are the bytes a local build stores; a worker SIGKILLed in
the middle of a batch loses no entry (the requester builds that batch itself)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rq import Queue
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from autopar.cost.build_tables import build_cost_tables
from autopar.cost.tables import CostTables, clear_process_caches
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline, Progress
from autopar.infra.store import MemoryStore
from autopar.models import build
from autopar_cache.base import PrefixedStore
from autopar_cache.redis_server import RedisServer
from autopar_cache.redis_store import RedisStore
from autopar_service.table_jobs import COST_PREFIX, RQTableBuilder
from autopar_service.worker import alive_key, tables_queue_name
from tests.service.helpers import WorkerProcess, descendants, make_settings, stop_workers

pytestmark = [pytest.mark.redis, pytest.mark.timeout(420)]

MESH = Mesh(Cluster.parse("2x4"), (2, 2, 2))


@pytest.fixture(scope="module")
def graph() -> Any:
    return build("tiny-gpt")


class RecordingStore(MemoryStore):
    """A memory store that keeps what was written to it, for comparison."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, bytes] = {}

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        super().put_many(items, ttl_s)
        self.written.update(items)


@pytest.fixture(scope="module")
def local(graph: Any) -> tuple[CostTables, RecordingStore]:
    """The tables built in this process alone, and the entries it stored."""
    store = RecordingStore()
    clear_process_caches()
    return build_cost_tables(graph, MESH, 2, store=store, workers=1), store


@pytest.fixture()
def queue_env(redis_server: RedisServer, tmp_path: Any) -> Iterator[dict[str, Any]]:
    """A fresh queue name and no cost entries in Redis (so the build is cold)."""
    name = f"tables-test-{uuid.uuid4().hex[:8]}"
    settings = make_settings(tmp_path, redis_url=redis_server.url, queue_name=name)
    store = RedisStore(redis_server.url)
    for key in store.client.scan_iter(match=f"{store.prefix}{COST_PREFIX}*", count=1000):
        store.client.delete(key)
    workers: list[WorkerProcess] = []
    env = {"AUTOPAR_QUEUE_NAME": name, "AUTOPAR_WORKER_ALIVE_TTL_S": "4"}
    yield {"settings": settings, "store": store, "workers": workers, "env": env, "url": redis_server.url}
    stop_workers(workers)
    store.close()


def start_workers(env: dict[str, Any], n: int) -> list[WorkerProcess]:
    for i in range(n):
        env["workers"].append(WorkerProcess(env["url"], f"tables-{i}-{uuid.uuid4().hex[:6]}", **env["env"]))
    client = env["store"].client
    deadline = time.monotonic() + 120
    names = [f"tables-{i}" for i in range(n)]
    while time.monotonic() < deadline:
        alive = [k for k in client.scan_iter(match=alive_key("tables-*"))]
        if len(alive) >= n:
            return list(env["workers"])
        time.sleep(0.1)
    raise AssertionError(f"workers {names} did not register within 120 s")


def remote_build(graph: Any, env: dict[str, Any], builder: RQTableBuilder) -> CostTables:
    cost_store = PrefixedStore(env["store"], COST_PREFIX)
    reports: list[Progress] = []
    tables = build_cost_tables(
        graph,
        MESH,
        2,
        store=cost_store,
        workers=1,
        parallel_threshold=1,
        remote=builder,
        deadline=Deadline(300),
        progress=reports.append,
    )
    edges = [r for r in reports if r.phase == "cost_tables:edges" and r.total]
    assert edges and edges[-1].done == edges[-1].total  # the workers' entries reported as they arrive
    return tables


def assert_same_tables(a: CostTables, b: CostTables) -> None:
    assert a.op_keys == b.op_keys
    for name, table in a.ops.items():
        assert [str(s) for s in table.signatures] == [str(s) for s in b.ops[name].signatures]
        assert np.array_equal(table.compute_s, b.ops[name].compute_s)
    assert len(a.edges) == len(b.edges)
    for ea, eb in zip(a.edges, b.edges, strict=True):
        assert np.array_equal(ea.matrix, eb.matrix), ea.tensor


def test_tables_built_by_two_workers_are_the_local_bytes(graph: Any, local: Any, queue_env: Any) -> None:
    start_workers(queue_env, 2)
    builder = RQTableBuilder(queue_env["store"], queue_env["settings"], help_out=False)
    tables = remote_build(graph, queue_env, builder)
    local_tables, local_store = local
    assert builder.stats["by_workers"] == builder.stats["batches"] > 2
    assert len(builder.workers_seen) == 2  # both workers built batches
    remote = PrefixedStore(queue_env["store"], COST_PREFIX)
    stored = remote.get_many(list(local_store.written))
    assert stored == local_store.written  # bit-identical entries
    assert_same_tables(tables, local_tables)


def test_a_worker_killed_mid_batch_loses_no_entry(graph: Any, local: Any, queue_env: Any) -> None:
    victim, survivor = start_workers(queue_env, 2)
    builder = RQTableBuilder(queue_env["store"], queue_env["settings"], help_out=False)
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(tables=remote_build(graph, queue_env, builder)))
    # the victim is frozen (SIGSTOP) with a batch it started and has not finished, then SIGKILLed
    killed = _freeze_mid_batch(queue_env, victim, thread)
    assert killed, "the victim never held an unfinished batch"
    victim.kill()
    thread.join(300)
    assert "tables" in out
    assert builder.stats["taken_over"] >= 1  # the killed worker's batch, built by the requester
    local_tables, local_store = local
    stored = PrefixedStore(queue_env["store"], COST_PREFIX).get_many(list(local_store.written))
    assert stored == local_store.written
    assert_same_tables(out["tables"], local_tables)
    assert survivor.process.poll() is None


def _freeze_mid_batch(env: dict[str, Any], victim: WorkerProcess, thread: threading.Thread) -> bool:
    """Start the build; SIGSTOP the victim's processes when one of its batches is started,
    and keep them stopped if that batch is still unfinished then (else let them go on)."""
    client = env["store"].client
    queue = Queue(tables_queue_name(env["settings"]), connection=client, serializer=JSONSerializer)
    registry = StartedJobRegistry(queue=queue)
    name = _worker_name(victim)
    thread.start()
    while thread.is_alive():
        for job_id in registry.get_job_ids(cleanup=False):
            job = Job.fetch(job_id, connection=client, serializer=JSONSerializer)
            if job.worker_name != name:
                continue
            pids = [victim.process.pid, *descendants(victim.process.pid)]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            if job.get_status() == "started" and not _arrived(env, job):
                return True
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.002)
    return False


def _worker_name(w: WorkerProcess) -> str:
    args = Path(f"/proc/{w.process.pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--name") + 1].decode()


def _arrived(env: dict[str, Any], job: Job) -> bool:
    keys = job.args[2]
    names = [env["store"].prefix + COST_PREFIX + k for k in keys]
    return bool(env["store"].client.exists(*names) == len(names))
