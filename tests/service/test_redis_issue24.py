"""Issue 24 with Redis: real ``redis-server`` and ``autopar worker`` processes.

2. a ``?refresh=true`` of an unfinished job joins it: another client cannot take it over
   and cancel it (the embedded variant is in ``test_hostile_issue24.py``);
5. ``/readyz`` stops counting a SIGKILLed worker within 15 s (its liveness key expires),
   not after RQ's minute-long registration;
6. a stalled Redis (SIGSTOP) answers 503 within one socket timeout, for many requests at
   once, and does not tie up the API's threads (other routes still answer).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from autopar_cache.redis_server import RedisServer, redis_server_binary
from tests.service.helpers import WorkerProcess, live_server, make_settings, plan_body, wait_status
from tests.service.test_api_redis import redis_url, start_worker, wait_ready, workers  # noqa: F401
from tests.service.test_hostile import KEY_A, KEY_B, slow

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]


def test_refresh_joins_a_queued_job_and_cannot_cancel_it(
    tmp_path,
    redis_url: str,  # noqa: F811
    tiny_graph: dict[str, Any],
) -> None:
    """No worker runs: B's job stays queued (unfinished) while A tries to take it over."""
    settings = make_settings(tmp_path, redis_url=redis_url, api_keys=[KEY_A, KEY_B])
    body = slow(tiny_graph, 24)
    with (
        live_server(settings) as server,
        server.client(headers={"X-API-Key": KEY_A}) as a,
        server.client(headers={"X-API-Key": KEY_B}) as b,
    ):
        key = b.post("/v1/plans", json=body).json()["id"]
        assert a.delete(f"/v1/jobs/{key}").status_code == 403
        r = a.post("/v1/plans", json=body, params={"refresh": "true"})
        assert r.status_code == 202 and r.json()["id"] == key
        assert a.delete(f"/v1/jobs/{key}").status_code == 200
        assert b.get(f"/v1/jobs/{key}").json()["status"] == "queued"  # not canceled
        assert b.delete(f"/v1/jobs/{key}").json()["status"] == "canceled"


def test_readyz_drops_a_sigkilled_worker_within_15_s(
    tmp_path,
    redis_url: str,  # noqa: F811
    workers: list[WorkerProcess],  # noqa: F811
) -> None:
    # the worker's own settings as deployed (RQ keeps its registration 3 x 20 s)
    doomed = start_worker(workers, redis_url, "doomed", AUTOPAR_WORKER_LOST_AFTER_S="20")
    with live_server(make_settings(tmp_path, redis_url=redis_url)) as server, server.client() as c:
        wait_ready(c, 1)
        doomed.kill()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            r = c.get("/readyz")
            if r.status_code == 503 and r.json()["checks"]["jobs"]["workers"] == 0:
                break
            time.sleep(0.25)
        else:
            raise AssertionError(f"/readyz still counts the killed worker after 15 s: {r.text}")
        assert "autopar worker" in r.json()["checks"]["jobs"]["detail"]


@pytest.fixture
def stallable_redis() -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.skip("redis-server binary not installed")
    server = RedisServer().start()
    try:
        yield server
    finally:
        if server.process is not None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.close()


def test_a_stalled_redis_gives_503_within_one_timeout(tmp_path, stallable_redis: RedisServer) -> None:
    settings = make_settings(tmp_path, redis_url=stallable_redis.url, redis_timeout_s=5.0)
    job = "ab" * 32
    paths = ["/readyz", f"/v1/jobs/{job}", f"/v1/plans/{job}"] * 16

    def get(path: str) -> int:
        # 12 s: one 5 s socket timeout and a 1 s wait for a pooled connection fit, with room for
        # a loaded machine; redis-py's default retries (four 5 s timeouts) do not
        with httpx.Client(base_url=server.url, timeout=12) as client:
            return client.get(path).status_code

    with live_server(settings) as server, server.client() as c:
        assert c.get(f"/v1/jobs/{job}").status_code == 404  # Redis answers
        assert stallable_redis.process is not None
        os.kill(stallable_redis.process.pid, signal.SIGSTOP)
        with ThreadPoolExecutor(len(paths)) as pool:
            answers = pool.map(get, paths)
            time.sleep(1.5)  # the Redis calls are all waiting now
            # a route that needs a thread but not Redis still answers: the stall holds at
            # most redis_max_connections threads
            with httpx.Client(base_url=server.url, timeout=4) as other:
                assert other.get("/v1/models/tiny-gpt/graph").status_code == 200
                assert other.get("/livez").status_code == 200
            statuses = list(answers)
        assert statuses == [503] * len(paths), statuses
        os.kill(stallable_redis.process.pid, signal.SIGCONT)
        assert c.get(f"/v1/jobs/{job}").status_code == 404  # and recovers


def test_refresh_of_a_running_job_with_a_worker_keeps_the_owner(
    tmp_path,
    redis_url: str,  # noqa: F811
    workers: list[WorkerProcess],  # noqa: F811
    tiny_graph: dict[str, Any],
) -> None:
    """As in the issue: the job runs on a real worker when A refreshes it and deletes it."""
    start_worker(workers, redis_url, "w1")
    settings = make_settings(tmp_path, redis_url=redis_url, api_keys=[KEY_A, KEY_B])
    body = plan_body(
        tiny_graph, cluster="1x8", mesh_shape=[2, 2, 2], options={"time_limit_s": 20, "relative_gap": 0}
    )
    with (
        live_server(settings) as server,
        server.client(headers={"X-API-Key": KEY_A}) as a,
        server.client(headers={"X-API-Key": KEY_B}) as b,
    ):
        wait_ready(b, 1)
        key = b.post("/v1/plans", json=body).json()["id"]
        wait_status(b, key, {"running"})
        assert a.post("/v1/plans", json=body, params={"refresh": "true"}).json()["id"] == key
        assert a.delete(f"/v1/jobs/{key}").status_code == 200
        assert b.get(f"/v1/jobs/{key}").json()["status"] == "running"
        assert b.delete(f"/v1/jobs/{key}").status_code == 200
        assert wait_status(b, key, {"canceled"})["status"] == "canceled"
