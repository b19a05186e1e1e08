"""Issue 34 with Redis: exactly-once results under a paused worker (fencing tokens).

A worker and its work horse are SIGSTOPped mid-solve past the lease (``worker_lost_after_s``):
the janitor requeues the job, another worker runs it to the end.  After SIGCONT the paused
attempt finds at its next phase that the record no longer holds its fencing token, stops,
and its result is discarded: one plan stored, one terminal write, ``/readyz`` counts only
workers that answer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from autopar_cache.redis_server import RedisServer
from autopar_service.rq_jobs import JobRecords
from tests.service.helpers import WorkerProcess, descendants, live_server, make_settings, plan_body, wait_job

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        for pid in (w.process.pid, *descendants(w.process.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        w.stop()


def _signal_all(worker: WorkerProcess, signum: int) -> None:
    for pid in (worker.process.pid, *descendants(worker.process.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _until(what: str, check: Any, timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def _field(records: JobRecords, key: str, name: str) -> Any:
    info = records.load(key)
    return getattr(info, name) if info is not None else None


def test_a_paused_worker_does_not_complete_a_job_twice(
    tmp_path, workers: list[WorkerProcess], redis_url: str, tiny_graph: dict[str, Any]
) -> None:
    client = redis.Redis.from_url(redis_url)
    settings = make_settings(tmp_path, redis_url=redis_url, job_retries=1)
    body = plan_body(
        tiny_graph, cluster="1x8", mesh_shape=[2, 2, 2], options={"time_limit_s": 10, "relative_gap": 0}
    )
    env = {"AUTOPAR_JOB_RETRIES": "1"}
    with live_server(settings) as server, server.client() as c:
        paused = WorkerProcess(redis_url, "paused", **env)
        workers.append(paused)
        _until("one worker ready", lambda: c.get("/readyz").json()["checks"]["jobs"].get("workers") == 1)
        key = c.post("/v1/plans", json=body).json()["id"]
        records = JobRecords(client, settings.job_ttl_s)
        _until(
            "the solve started", lambda: _field(records, key, "phase") not in (None, "starting", "loading")
        )
        _signal_all(paused, signal.SIGSTOP)
        # a stopped worker stops counting as ready once its liveness key expires
        _until("readiness drops", lambda: c.get("/readyz").status_code == 503)
        workers.append(WorkerProcess(redis_url, "rescuer", **env))
        _until("the job restarted on the rescuer", lambda: _field(records, key, "attempts") == 2)
        _signal_all(paused, signal.SIGCONT)  # mid-solve: the paused attempt resumes
        job = wait_job(c, key, timeout_s=120)
        assert job["status"] == "succeeded" and job["attempts"] == 2, job
        _until(
            "the paused attempt noticed",
            lambda: client.get("autopar:stat:attempts_superseded") == b"1",
            timeout_s=120,
        )
        assert client.get("autopar:stat:plans_stored") == b"1"  # one result, the rescuer's
        assert c.get("/readyz").json()["checks"]["jobs"]["workers"] == 2
        assert _field(records, key, "fence") is not None  # the rescuer's token
