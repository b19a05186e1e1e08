"""Test helpers: a live API server on loopback, RQ worker processes, request bodies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from autopar_cache.redis_server import free_port
from autopar_service.app import create_app
from autopar_service.settings import Settings

REPO = Path(__file__).resolve().parents[2]

FAST = {
    "default_time_limit_s": 10.0,
    "max_time_limit_s": 60.0,
    "job_timeout_margin_s": 60.0,
    "heartbeat_interval_s": 0.5,
    "worker_lost_after_s": 3.0,
    "janitor_interval_s": 0.5,
    "retry_after_s": 1,
    "solver_workers": 1,
    # a body waits for a worker process at most this long before 429 server_busy: far above what
    # a loaded 2-core machine makes it wait, so no verdict moves with the load (the tests of the
    # busy path set their own)
    "max_parse_s": 120.0,
    "freeze_gc": False,  # the test process hosts many servers: nothing of one is frozen for good
}


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"cache_dir": tmp_path / "cache", "local_workers": 2, **FAST}
    values.update(overrides)
    return Settings(**values)


class LiveServer:
    """``create_app(settings)`` served by uvicorn in a thread on a free loopback port."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # proxy_headers=False: the peer is the client (uvicorn would trust X-Forwarded-For from
        # loopback); the app reads a proxy header only when settings name one
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", proxy_headers=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kw)


@contextmanager
def live_server(settings: Settings) -> Iterator[LiveServer]:
    server = LiveServer(settings).start()
    try:
        yield server
    finally:
        server.stop()


def plan_body(graph: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "graph": graph,
        "cluster": "1x2",
        "mesh_shape": [2],
        "options": {"time_limit_s": 5},
    }
    body.update(fields)
    return body


def wait_job(client: httpx.Client, job_id: str, timeout_s: float = 60) -> dict[str, Any]:
    """Long-poll until the job ends."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = client.get(f"/v1/jobs/{job_id}", params={"wait": 5})
        assert r.status_code == 200, r.text
        job = r.json()
        if job["status"] in ("succeeded", "failed", "canceled"):
            return job
    raise AssertionError(f"job {job_id} did not finish in {timeout_s} s")


def wait_status(client: httpx.Client, job_id: str, statuses: set[str], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} never reached {statuses}")


def second_attempt(c: httpx.Client, key: str, timeout_s: float = 300) -> dict[str, Any]:
    """The job as first seen with two attempts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = c.get(f"/v1/jobs/{key}").json()
        if job["attempts"] >= 2:
            return dict(job)
        time.sleep(0.02)
    raise AssertionError(f"job {key} was not retried within {timeout_s} s")


UNREACHABLE_LIMIT_S = 600.0
"""A time limit a loaded machine cannot run out of on tiny-gpt: the solve (``relative_gap`` 0) stops
at its proven optimum, seconds in when idle.  At 10 s the retried attempt of the SIGKILL test ran
out building its cost tables at load 14-19 (it passes alone), so its verdict hung on the load."""


def metric(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} not found")


class WorkerProcess:
    """``autopar worker`` in its own process group (so a test can SIGKILL all of it)."""

    def __init__(self, redis_url: str, name: str, **env: str) -> None:
        environment = {k: v for k, v in os.environ.items() if k != "AUTOPAR_REDIS_URL"}
        for key, value in FAST.items():
            environment[f"AUTOPAR_{key.upper()}"] = str(value)
        environment.update(env)
        environment["PYTHONPATH"] = str(REPO)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autopar.cli",
                "worker",
                "--redis-url",
                redis_url,
                "--name",
                name,
                "--log-level",
                "warning",
            ],
            env=environment,
            cwd=REPO,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def kill(self) -> None:
        """SIGKILL the worker and every process below it (the work horse runs in its own group)."""
        doomed = [self.process.pid, *descendants(self.process.pid)]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self, grace_s: float = 10) -> None:
        """SIGTERM the worker's group; SIGKILL it all if it has not exited ``grace_s`` later."""
        self.terminate()
        self.wait_or_kill(time.monotonic() + grace_s)

    def terminate(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        if self.process.poll() is None:
            try:
                self.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process.stderr is not None:
            self.process.stderr.close()


TEARDOWN_GRACE_S = 2.0
"""How long a test's teardown waits for its workers to exit on SIGTERM before it SIGKILLs
them: an idle worker exits at once; one with a job running (RQ's warm shutdown waits for the
job) took the 10 s of :meth:`WorkerProcess.stop` each, one after the other."""


def stop_workers(workers: list[WorkerProcess], grace_s: float = TEARDOWN_GRACE_S) -> None:
    """A test's teardown: SIGTERM every worker at once, SIGKILL those still there ``grace_s``
    later (no test checks how its workers end; Redis is flushed before each test)."""
    for w in workers:
        w.terminate()
    deadline = time.monotonic() + grace_s
    for w in workers:
        w.wait_or_kill(deadline)


def descendants(pid: int) -> list[int]:
    """Every process whose ancestry reaches ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        children = [p for p, parent in parents.items() if parent == current]
        found += children
        frontier += children
    return found


def encode(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body).encode()
