"""The API with Redis: RQ workers (separate processes), progress and records in Redis."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from autopar.models import build
from autopar_cache.redis_server import RedisServer
from autopar_service.jobs import JobStatus
from autopar_service.rq_jobs import JobRecords
from tests.service.helpers import (
    UNREACHABLE_LIMIT_S,
    LiveServer,
    WorkerProcess,
    encode,
    live_server,
    make_settings,
    metric,
    plan_body,
    second_attempt,
    stop_workers,
    wait_job,
    wait_status,
)

pytestmark = pytest.mark.redis

LONG = {"cluster": "1x8", "mesh_shape": [2, 2, 2], "options": {"time_limit_s": 20, "relative_gap": 0}}


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture
def workers(redis_url: str) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    stop_workers(started)


@pytest.fixture
def server(tmp_path, redis_url: str) -> Iterator[LiveServer]:
    # twenty concurrent POSTs from one address below: let them all reach the parser (bodies in
    # the parser count toward the client's unfinished jobs)
    settings = make_settings(tmp_path, redis_url=redis_url, max_parses_per_client=32, max_jobs_per_client=32)
    with live_server(settings) as s:
        yield s


def start_worker(workers: list[WorkerProcess], url: str, name: str, **env: str) -> WorkerProcess:
    w = WorkerProcess(url, name, **env)
    workers.append(w)
    return w


def wait_ready(client: httpx.Client, workers: int, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = client.get("/readyz")
        if r.status_code == 200 and r.json()["checks"]["jobs"]["workers"] >= workers:
            return r.json()
        time.sleep(0.1)
    raise AssertionError(f"never ready with {workers} workers: {r.text}")


def test_not_ready_without_workers(server: LiveServer) -> None:
    with server.client() as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    checks = r.json()["checks"]
    assert checks["cache"] == {"ok": True, "backend": "redis"}
    assert checks["jobs"]["ok"] is False and checks["jobs"]["workers"] == 0
    assert "autopar worker" in checks["jobs"]["detail"]


def test_miss_hit_and_single_flight_with_two_workers(
    server: LiveServer, workers: list[WorkerProcess], redis_url: str, tiny_graph: dict[str, Any]
) -> None:
    start_worker(workers, redis_url, "w1")
    start_worker(workers, redis_url, "w2")
    with server.client() as c:
        ready = wait_ready(c, 2)
        assert ready["checks"]["jobs"]["kind"] == "rq"
        body = encode(plan_body(tiny_graph))

        def post(_: int) -> httpx.Response:
            with httpx.Client(base_url=server.url, timeout=60) as one:
                return one.post("/v1/plans", content=body, headers={"Content-Type": "application/json"})

        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(post, range(20)))
        assert {r.status_code for r in answers} <= {200, 202}
        ids = {r.json().get("id") or r.json().get("key") for r in answers}
        assert len(ids) == 1
        key = ids.pop()
        job = wait_job(c, key)
        assert job["status"] == "succeeded", job
        assert job["attempts"] == 1
        assert metric(c, "autopar_solves_started_total") == 1
        text = c.get("/metrics").text
        assert 'autopar_jobs_finished_total{status="succeeded"} 1' in text
        assert "autopar_solve_seconds_count 1" in text

        hit = c.post("/v1/plans", content=body, headers={"Content-Type": "application/json"})
        assert hit.status_code == 200 and hit.json()["key"] == key
        assert hit.json()["step_time_s"] == pytest.approx(job["result"]["step_time_s"])


def test_cost_tables_are_shared_across_graphs(
    server: LiveServer, workers: list[WorkerProcess], redis_url: str
) -> None:
    """A second graph that shares layers with the first reuses their cost-table entries."""
    start_worker(workers, redis_url, "w1")
    small = build("tiny-gpt", layers=2).to_dict()
    deeper = build("tiny-gpt", layers=3).to_dict()
    with server.client() as c:
        wait_ready(c, 1)
        first = c.post("/v1/plans", json=plan_body(small)).json()["id"]
        assert wait_job(c, first)["status"] == "succeeded"
        stats_a = c.get(f"/v1/plans/{first}").json()["plan"]["solver"]["stats"]["cost_tables"]
        assert stats_a["op_entries_computed"] == stats_a["unique_op_entries"]  # cold cache

        second = c.post("/v1/plans", json=plan_body(deeper)).json()["id"]
        assert wait_job(c, second)["status"] == "succeeded"
        stats_b = c.get(f"/v1/plans/{second}").json()["plan"]["solver"]["stats"]["cost_tables"]
    # every layer-shaped entry was already there: the deeper graph computes almost nothing new
    assert stats_b["unique_op_entries"] >= stats_a["unique_op_entries"]
    assert stats_b["op_entries_computed"] < stats_b["unique_op_entries"] / 4
    assert stats_b["edge_entries_computed"] < stats_b["unique_edge_entries"] / 4
    keys = redis.Redis.from_url(redis_url).keys("autopar:cost:*")
    assert len(keys) >= stats_a["unique_op_entries"] + stats_a["unique_edge_entries"]


def test_cancel_running_job_keeps_worker(
    server: LiveServer, workers: list[WorkerProcess], redis_url: str, tiny_graph: dict[str, Any]
) -> None:
    start_worker(workers, redis_url, "w1")
    with server.client() as c:
        wait_ready(c, 1)
        key = c.post("/v1/plans", json=plan_body(tiny_graph, **LONG)).json()["id"]
        wait_status(c, key, {"running"})
        time.sleep(0.5)
        r = c.delete(f"/v1/jobs/{key}")
        assert r.status_code == 200 and r.json()["status"] == "canceled"
        assert wait_job(c, key)["status"] == "canceled"
        # the worker survives and takes the next job
        other = c.post("/v1/plans", json=plan_body(tiny_graph)).json()["id"]
        assert wait_job(c, other)["status"] == "succeeded"
        assert workers[0].process.poll() is None

        # the horse's last record update got lost: RQ's return value still settles the job
        records = JobRecords(redis.Redis.from_url(redis_url), ttl_s=60)
        lost = records.load(other)
        assert lost is not None
        lost.status, lost.result = JobStatus.RUNNING, None
        records.save(lost)
        settled = c.get(f"/v1/jobs/{other}").json()
        assert settled["status"] == "succeeded" and settled["result"]["step_time_s"] > 0


def test_cancel_queued_job(
    server: LiveServer, workers: list[WorkerProcess], redis_url: str, tiny_graph: dict[str, Any]
) -> None:
    with server.client() as c:  # no worker yet: the job waits in the queue
        key = c.post("/v1/plans", json=plan_body(tiny_graph)).json()["id"]
        assert c.get(f"/v1/jobs/{key}").json()["status"] == "queued"
        assert c.delete(f"/v1/jobs/{key}").json()["status"] == "canceled"
        start_worker(workers, redis_url, "w1")
        wait_ready(c, 1)
        time.sleep(1.0)
        assert c.get(f"/v1/jobs/{key}").json()["status"] == "canceled"
        assert metric(c, "autopar_solves_started_total") == 0


@pytest.mark.parametrize("retries", [1, 0])
def test_worker_sigkilled_mid_job(
    tmp_path, workers: list[WorkerProcess], redis_url: str, tiny_graph: dict[str, Any], retries: int
) -> None:
    """The whole worker (and its horse) dies: the job is retried elsewhere, or fails clearly."""
    limit = UNREACHABLE_LIMIT_S  # the retried attempt's verdict must not hang on the machine's load
    env = {"AUTOPAR_JOB_RETRIES": str(retries), "AUTOPAR_MAX_TIME_LIMIT_S": str(limit)}
    settings = make_settings(tmp_path, redis_url=redis_url, job_retries=retries, max_time_limit_s=limit)
    body = plan_body(
        tiny_graph,
        cluster="1x8",
        mesh_shape=[2, 2, 2],
        options={"time_limit_s": limit, "relative_gap": 0},  # stops at its optimum
    )
    with live_server(settings) as server, server.client() as c:
        doomed = start_worker(workers, redis_url, "doomed", **env)
        wait_ready(c, 1)
        key = c.post("/v1/plans", json=body).json()["id"]
        wait_status(c, key, {"running"})
        time.sleep(0.3)
        doomed.kill()
        start_worker(workers, redis_url, "rescuer", **env)
        if retries:  # the new attempt shows as itself, not as the lost one (issue 43)
            second = second_attempt(c, key)
            assert second["error"] is None and second["status"] in ("running", "succeeded"), second
        job = wait_job(c, key, timeout_s=limit + 120)
        if retries:
            assert job["status"] == "succeeded", job
            assert job["attempts"] == 2
            assert metric(c, "autopar_solves_started_total") == 2
        else:
            assert job["status"] == "failed", job
            assert job["error"]["code"] == "worker_lost"
            assert "heartbeat" in job["error"]["message"]


def test_redis_down_then_back(tmp_path, workers: list[WorkerProcess], tiny_graph: dict[str, Any]) -> None:
    """Redis stops under a running API: /readyz says so, writes answer 503, never 500."""
    own = RedisServer().start()
    try:
        settings = make_settings(tmp_path, redis_url=own.url)
        with live_server(settings) as server, server.client() as c:
            start_worker(workers, own.url, "w1")
            wait_ready(c, 1)
            own.stop()
            ready = c.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["checks"]["cache"]["ok"] is False
            assert ready.json()["checks"]["cache"]["detail"]
            assert str(own.port) not in ready.text and "127.0.0.1" not in ready.text  # no addresses
            r = c.post("/v1/plans", json=plan_body(tiny_graph))
            assert r.status_code == 503, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["code"] in ("cache_unavailable", "queue_unavailable")
            assert int(r.headers["retry-after"]) >= 1
            for path in (f"/v1/jobs/{'a' * 64}", f"/v1/plans/{'a' * 64}"):
                assert c.get(path).status_code == 503
            assert c.get("/metrics").status_code == 200
            assert c.get("/livez").status_code == 200

            own.start()  # same port, empty data
            deadline = time.monotonic() + 30
            while c.get("/readyz").json()["checks"]["cache"]["ok"] is not True:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            statuses = {c.get("/metrics").status_code}
            assert statuses == {200}
            text = c.get("/metrics").text
            assert 'status="500"' not in text
    finally:
        own.stop()


def test_version_mismatch_is_refused(
    server: LiveServer, workers: list[WorkerProcess], redis_url: str, tiny_graph: dict[str, Any]
) -> None:
    """A worker running other code fails the job clearly instead of caching a foreign plan."""
    start_worker(workers, redis_url, "w1")
    graph = copy.deepcopy(tiny_graph)
    service = server.app.state.service
    service.versions = {**service.versions, "source": "0" * 16}  # the API "runs other code"
    with server.client() as c:
        wait_ready(c, 1)
        key = c.post("/v1/plans", json=plan_body(graph)).json()["id"]
        job = wait_job(c, key)
    assert job["status"] == "failed"
    assert job["error"]["code"] == "version_mismatch"
    assert "same autopar version" in job["error"]["message"]
