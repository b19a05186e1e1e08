"""Issue 43 with Redis: progress streams are bounded and hold no thread between (or during) polls.

One key opened 1,000 streams on a job in Redis mode and another key's cache hits went to p99 7 s:
every stream polled the job's record in a thread of the API's shared pool.  Now a client holds at
most ``max_streams_per_client`` streams, and every follower of a job shares one asyncio poll of
its record (RQ's own view is read in a thread once every 2 s per job, not per stream).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from autopar_cache.redis_server import RedisServer
from tests.service.helpers import LiveServer, live_server, make_settings, plan_body
from tests.service.test_hostile import KEY_A, KEY_B

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

PER_CLIENT = 6


@pytest.fixture
def server(redis_server: RedisServer, tmp_path) -> Iterator[LiveServer]:
    redis.Redis.from_url(redis_server.url).flushall()
    settings = make_settings(
        tmp_path,
        redis_url=redis_server.url,
        api_keys=[KEY_A, KEY_B],
        max_streams_per_client=PER_CLIENT,
        max_streams=PER_CLIENT + 2,
    )
    with live_server(settings) as s:
        yield s


def _open(server: LiveServer, job: str, key: str) -> tuple[socket.socket | None, int]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(f"GET /v1/jobs/{job}/events HTTP/1.1\r\nHost: t\r\nX-API-Key: {key}\r\n\r\n".encode())
    head = sock.recv(4096).decode("latin-1")
    status = int(head.split(" ", 2)[1])
    if status != 200:
        sock.close()
        return None, status
    return sock, status


def _threads_borrowed(server: LiveServer, loop: asyncio.AbstractEventLoop) -> int:
    """Threads of the API's shared pool in use now (anyio's default limiter, read on its loop)."""

    async def probe() -> int:
        import anyio.to_thread

        return int(anyio.to_thread.current_default_thread_limiter().borrowed_tokens)

    return asyncio.run_coroutine_threadsafe(probe(), loop).result(10)


def test_streams_share_one_poll_and_hold_no_thread(server: LiveServer, tiny_graph: dict[str, Any]) -> None:
    jobs = server.app.state.service.jobs
    with server.client(headers={"X-API-Key": KEY_A}) as a, server.client(headers={"X-API-Key": KEY_B}) as b:
        job = a.post(
            "/v1/plans", json=plan_body(tiny_graph, options={"time_limit_s": 5, "seed": 430})
        ).json()["id"]
        held = []
        try:
            for _ in range(PER_CLIENT):  # no worker runs: the job stays queued
                sock, status = _open(server, job, KEY_A)
                assert sock is not None, status
                held.append(sock)
            _, status = _open(server, job, KEY_A)
            assert status == 429
            deadline = time.monotonic() + 30
            while job not in jobs._watches or jobs._watches[job].waiters < PER_CLIENT:
                assert time.monotonic() < deadline, "the streams do not share one watch"
                time.sleep(0.05)
            watch = jobs._watches[job]
            assert watch.task is not None and len(jobs._watches) == 1  # one poll for six streams
            loop = watch.task.get_loop()
            threaded: list[str] = []  # reads of the job in a thread (RQ's view): once per 2 s in all
            real_get = jobs.get

            async def counted_get(job_id: str) -> Any:
                threaded.append(job_id)
                return await real_get(job_id)

            jobs.get = counted_get
            samples = []
            try:
                for _ in range(60):  # 3 s of six streams following the job
                    samples.append(_threads_borrowed(server, loop))
                    time.sleep(0.05)
            finally:
                del jobs.get
            assert max(samples) <= 1, samples
            assert len(threaded) <= 3, len(threaded)  # per stream and poll, it was 6 x 2 a second
            # another key is served meanwhile: its job status, long-polled, and its own streams
            r = b.get(f"/v1/jobs/{job}", params={"wait": 0.5, "since": 10**6})
            assert r.status_code == 200 and r.json()["status"] == "queued"
            sock, status = _open(server, job, KEY_B)
            assert sock is not None, status
            held.append(sock)
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 60
        while server.app.state.service.streams.open:
            assert time.monotonic() < deadline, server.app.state.service.streams.open
            time.sleep(0.1)
        while job in jobs._watches:  # the last follower gone, the poll stops
            assert time.monotonic() < deadline
            time.sleep(0.1)
