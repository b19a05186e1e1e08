"""Redis killed and restarted under a running API and real ``autopar worker`` processes.

With and without AOF persistence: the worker survives (it re-registers, so
``/readyz`` counts it again), the job it was solving ends ``succeeded`` with
its plan stored, and every other submitted job ends ``succeeded`` or
``failed`` with a reason (without persistence a queued job is lost: it ends
``failed``/``job_lost``, never a 404).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from autopar_cache.redis_server import RedisServer, redis_server_binary
from tests.service.helpers import WorkerProcess, live_server, make_settings, plan_body, stop_workers

pytestmark = [pytest.mark.redis, pytest.mark.timeout(420)]

TERMINAL = {"succeeded", "failed", "canceled"}


def running_body(graph: dict[str, Any], seed: int) -> dict[str, Any]:
    """A solve that runs several seconds (gap 0 on a [2, 2, 2] mesh: on [2, 2] tiny-gpt now
    proves its optimum in about a second); distinct seeds, distinct jobs.
    The limit covers the cost tables too: 20 s leaves a loaded machine room to find a plan."""
    options = {"time_limit_s": 20, "relative_gap": 0, "seed": seed}
    return plan_body(graph, cluster="1x8", mesh_shape=[2, 2, 2], options=options)


def poll(c: httpx.Client, path: str, done: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            r = c.get(path)
            last = (r.status_code, r.text[:300])
            if done(r):
                return r
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise AssertionError(f"{what}: not reached in {timeout_s} s (last: {last})")


def workers_ready(n: int) -> Any:
    def check(r: httpx.Response) -> bool:
        return r.status_code == 200 and r.json()["checks"]["jobs"].get("workers", 0) >= n

    return check


def job_in(statuses: set[str]) -> Any:
    return lambda r: r.status_code == 200 and r.json()["status"] in statuses


def solving(r: httpx.Response) -> bool:
    """The job runs past loading its graph (which a restart without persistence would lose)."""
    job = r.json() if r.status_code == 200 else {}
    return job.get("status") == "running" and job.get("phase") not in (None, "starting", "loading")


@pytest.fixture
def worker_list() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    stop_workers(started)


@pytest.mark.parametrize("appendonly", [False, True], ids=["no-persistence", "aof"])
def test_redis_killed_mid_solve(
    tmp_path, tiny_graph: dict[str, Any], worker_list: list[WorkerProcess], appendonly: bool
) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server binary not installed")
    redis = RedisServer(appendonly=appendonly).start()
    try:
        settings = make_settings(tmp_path, redis_url=redis.url)
        with live_server(settings) as server, server.client() as c:
            worker_list.append(WorkerProcess(redis.url, "outage-w1"))
            poll(c, "/readyz", workers_ready(1), 60, "worker registered")
            running = c.post("/v1/plans", json=running_body(tiny_graph, 1)).json()["id"]
            queued = c.post("/v1/plans", json=running_body(tiny_graph, 2)).json()["id"]
            poll(c, f"/v1/jobs/{running}", solving, 60, "first job solving")

            redis.kill()
            r = c.get(f"/v1/jobs/{running}")
            assert r.status_code == 503
            assert "127.0.0.1" not in r.text and str(redis.port) not in r.text
            ready = c.get("/readyz")
            assert ready.status_code == 503 and str(redis.port) not in ready.text
            time.sleep(1.0)  # an outage long enough for the worker's calls to fail
            redis.start()

            poll(c, "/readyz", workers_ready(1), 30, "worker re-registered after the restart")
            for job_id in (running, queued):
                r = poll(c, f"/v1/jobs/{job_id}", job_in(TERMINAL), 180, f"job {job_id[:12]} ended")
                job = r.json()
                if job["status"] == "succeeded":
                    assert c.get(f"/v1/plans/{job_id}").status_code == 200
                else:
                    assert job["error"]["message"], job
            first = c.get(f"/v1/jobs/{running}").json()
            assert first["status"] == "succeeded", first["error"]  # the finished solve was not lost
            assert c.get(f"/v1/plans/{running}").status_code == 200
            second = c.get(f"/v1/jobs/{queued}").json()
            if appendonly:
                assert second["status"] == "succeeded", (second["phase"], second.get("error"))
            else:
                assert second["status"] in ("succeeded", "failed"), second
            assert worker_list[0].process.poll() is None  # the worker is still alive
    finally:
        redis.close()
