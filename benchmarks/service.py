"""Benchmark of the planning service on loopback (the server runs in a second process).

::

    .venv/bin/python -m benchmarks.service [--hits 200] [--time-limit 30] [--skip-cold]
                                           [--skip-redis] [--skip-429] [--out results.json]

1. **Body**: size of the mt5-base graph request, raw / gzip / zstd.
2. **Cold end-to-end**: ``autopar plan``'s planner on mt5-base in a fresh process
   (``plan()`` wall time, cold memo) vs the service on an empty embedded cache
   (``PlanClient.plan``: upload, job, server-sent events, plan download).
   Target: overhead <= 10 %.
3. **Cache-hit latency over HTTP**, embedded cache and Redis (+ 1 ``autopar
   worker``): POSTs of the same mt5-base body (gzip, keep-alive) from 1 client
   (``--hits`` requests; upload, latency after upload and the server's own
   ``Server-Timing: app`` reported apart) and from 8 concurrent clients
   (``--hits`` requests in all; total latency per request and requests/s).
   Target: p99 <= 50 ms.
4. **The 429 path**: with ``AUTOPAR_MAX_JOBS_PER_CLIENT=1`` and one job
   running, 20 POSTs of new mt5-base requests are refused; latency of the 429s
   (the body is parsed before the job is known to be new).
5. **Throughput with 2 workers** (Redis + 2 ``autopar worker`` processes, only
   without ``--skip-cold``): cold solves/minute of 6 distinct tiny-mt5 requests.
6. **Load** (``--load SECONDS``, alone; ``--skip-redis`` for embedded only): 50 clients
   POST distinct small plans (tiny-gpt, a new seed each) while 8 clients POST a cached
   mt5-base plan, for SECONDS, embedded and Redis (+ 2 workers).  Reported: p50/p99 of
   the hits, 429 and 5xx counts, jobs lost (accepted, then ``job_lost``/``worker_lost``
   or never ending), and the API process's RSS before, at peak and after.  Then one
   44 MB body of 1.5 million ops (refused, 413): the API's RSS before, at peak, after.

   ``.venv/bin/python -m benchmarks.service --load 60``
7. **Hostile clients** (``--hostile SECONDS``, alone; issue 34): keyless and keyed clients
   cycling through every bundled model's graph (401 without a key; the keyed latency once
   each was built); valid graphs (tiny-gpt, mt5-base, t5-base) parsed and checked in full
   and hostile bodies of 1, 10 and 33 MB (tiny-gpt with ``ops[5].attrs.junk = [7] * N``),
   one at a time: status, code and the API's RSS rise (sampled every 0.1 s); then one key floods four
   10 MB bodies at a time for SECONDS while another key posts small requests that need a
   parse: the victim's p50/p99 and statuses, and the 5xx count.

   ``.venv/bin/python -m benchmarks.service --hostile 20``
8. **Isolation** (``--isolation SECONDS``, alone; issue 43; ``benchmarks/service_isolation.py``):
   5,001-digit integers in every body route (the 5xx count); one key's progress streams (how many
   it may hold, the API's descriptors, another key's cache hits meanwhile; embedded and Redis);
   another key's keyed cache hits (p50/p99) quiet and while one key floods 10 MB bodies, valid
   graphs to ``/v1/evaluate``, reports with changing compare sets, and all three; the client's
   cache hit on mt5-base against curl (gzip body) and a bundled name.

   ``.venv/bin/python -m benchmarks.service --isolation 20``
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import zstandard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autopar.client import PlanClient, ServiceError  # noqa: E402
from autopar.models import build  # noqa: E402
from autopar_cache.redis_server import RedisServer, free_port  # noqa: E402

CLUSTER, MESH, BUDGET, ZERO = "2x4", [4, 2], 30 * 2**30, 2

LOCAL_PLAN = """
import json, sys, time
from autopar.hardware.cluster import Cluster
from autopar.models import build
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest, plan
graph = build("mt5-base")
request = PlanRequest(graph, Cluster.parse("{cluster}"), tuple({mesh}), {budget}, {zero},
                      SolverOptions(time_limit_s={limit}))
t0 = time.perf_counter()
result = plan(request)
print(json.dumps({{"plan_s": time.perf_counter() - t0, "step_time_s": result.step_time_s}}))
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": 1e3 * pct(values, 50),
        "p90_ms": 1e3 * pct(values, 90),
        "p99_ms": 1e3 * pct(values, 99),
        "mean_ms": 1e3 * statistics.fmean(values),
        "max_ms": 1e3 * max(values),
    }


SERVER_PIDS: dict[str, int] = {}
"""URL -> pid of the ``autopar serve`` process (the API: its RSS is what the load run samples)."""


@contextmanager
def serve(cache_dir: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``autopar serve`` in a subprocess; yields its URL once ready."""
    port = free_port()
    margin = {"AUTOPAR_JOB_TIMEOUT_MARGIN_S": "900"}  # building mt5-base's cost tables on a busy machine
    environment = {**os.environ, "PYTHONPATH": str(REPO), **margin, **(env or {})}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autopar.cli",
            "serve",
            "--port",
            str(port),
            "--cache-dir",
            str(cache_dir),
            "--log-level",
            "warning",
            *extra,
        ],
        env=environment,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        client = PlanClient(url, retries=0, timeout_s=2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if client.ready().get("status") == "ready":
                    break
            except ServiceError:  # not up yet
                time.sleep(0.1)
        else:
            raise RuntimeError("server did not become ready")
        SERVER_PIDS[url] = proc.pid
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@contextmanager
def workers(redis_url: str, count: int) -> Iterator[None]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AUTOPAR_REDIS_URL": redis_url,
        "AUTOPAR_SOLVER_WORKERS": "1",
        "AUTOPAR_JOB_TIMEOUT_MARGIN_S": "900",  # building mt5-base's cost tables on a busy machine
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autopar.cli",
                "worker",
                "--name",
                f"bench-{i}",
                "--log-level",
                "warning",
            ],
            env=env,
            start_new_session=True,
        )
        for i in range(count)
    ]
    try:
        yield
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(30)


def plan_body(graph_json: bytes, **fields: Any) -> bytes:
    rest = json.dumps(
        {
            "cluster": CLUSTER,
            "mesh_shape": MESH,
            "memory_budget_bytes": BUDGET,
            "zero_stage": ZERO,
            **fields,
        }
    ).encode()
    return b'{"graph":' + graph_json + b"," + rest[1:]


def hit_latency(url: str, body: bytes, n: int) -> dict[str, Any]:
    """Sequential cache-hit POSTs on one keep-alive connection."""
    packed = gzip.compress(body, 5)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    uploads, after, server_app, totals = [], [], [], []
    for i in range(n + 5):
        t0 = time.perf_counter()
        conn.putrequest("POST", "/v1/plans")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Encoding", "gzip")
        conn.putheader("Content-Length", str(len(packed)))
        conn.endheaders()
        conn.send(packed)
        t1 = time.perf_counter()
        resp = conn.getresponse()
        data = resp.read()
        t2 = time.perf_counter()
        assert resp.status == 200, (resp.status, data[:300])
        timing = dict(part.strip().split(";dur=") for part in resp.getheader("Server-Timing", "").split(","))
        if i >= 5:  # warm-up excluded
            uploads.append(t1 - t0)
            after.append(t2 - t1)
            totals.append(t2 - t0)
            server_app.append(float(timing["app"]) / 1e3)
    conn.close()
    return {
        "requests": n,
        "response_bytes": len(data),
        "upload": summary(uploads),
        "latency_after_upload": summary(after),
        "server_app": summary(server_app),
        "total": summary(totals),
    }


def concurrent_posts(url: str, bodies: list[bytes], clients: int, expect: int) -> dict[str, Any]:
    """``clients`` threads, each on its own keep-alive connection, POST ``bodies`` round-robin.

    Every answer must have status ``expect``; returns the latency summary and requests/s.
    """
    host, port = url.removeprefix("http://").split(":")
    packed = [gzip.compress(b, 5) for b in bodies]
    latencies: list[float] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        mine = []
        for body in packed[index::clients]:
            t0 = time.perf_counter()
            conn.request(
                "POST", "/v1/plans", body, {"Content-Type": "application/json", "Content-Encoding": "gzip"}
            )
            resp = conn.getresponse()
            data = resp.read()
            mine.append(time.perf_counter() - t0)
            assert resp.status == expect, (resp.status, data[:300])
        conn.close()
        with lock:
            latencies.extend(mine)

    t0 = time.perf_counter()
    pool = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": len(latencies),
        "rps": len(latencies) / wall,
        **summary(latencies),
    }


def hit_report(url: str, body: bytes, hits: int) -> dict[str, Any]:
    """Cache hits from 1 client (with the upload / server split) and from 8 concurrent clients."""
    concurrent_posts(url, [body] * 8, 8, 200)  # warm-up: every connection once
    return {
        "1_client": hit_latency(url, body, hits),
        "8_clients": concurrent_posts(url, [body] * hits, 8, 200),
    }


def refused_report(cache: Path, graph_json: bytes, requests: int) -> dict[str, Any]:
    """429 latency: one client at its limit of unfinished jobs asks for more."""
    env = {"AUTOPAR_MAX_JOBS_PER_CLIENT": "1", "AUTOPAR_LOCAL_WORKERS": "1"}
    with serve(cache, env=env) as url:
        client = PlanClient(url, timeout_s=120)
        busy = client.submit(
            graph_json,
            cluster=CLUSTER,
            mesh_shape=MESH,
            memory_budget_bytes=BUDGET,
            options={"time_limit_s": 300},
        )
        bodies = [
            plan_body(graph_json, options={"time_limit_s": 300, "seed": i + 1}) for i in range(requests)
        ]
        result = concurrent_posts(url, bodies, 1, 429)
        client.cancel(busy.key)
    return result


def cold_jobs(client: PlanClient) -> dict[str, Any]:
    """6 distinct tiny-mt5 requests solved by the worker pool."""
    small = build("tiny-mt5").to_json().encode()
    requests = [(z, b) for z in (1, 2, 3) for b in (20 * 2**30, 30 * 2**30)]
    t0 = time.perf_counter()
    keys = [
        client.submit(
            small,
            cluster="1x4",
            mesh_shape=(2, 2),
            options={"time_limit_s": 5},
            zero_stage=z,
            memory_budget_bytes=b,
        ).key
        for z, b in requests
    ]
    jobs = [client.wait_job(k) for k in keys]
    elapsed = time.perf_counter() - t0
    assert all(j["status"] == "succeeded" for j in jobs), jobs
    return {
        "jobs": len(jobs),
        "wall_s": elapsed,
        "jobs_per_min": 60 * len(jobs) / elapsed,
        "mean_solve_s": statistics.fmean(j["result"]["solve_wall_s"] for j in jobs),
    }


class RssSampler:
    """Samples a process's resident set size (``/proc/PID/status`` VmRSS) every 0.1 s."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.read()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> int:
        with open(f"/proc/{self.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.read())

    def stop(self, settle_s: float = 2.0) -> dict[str, float]:
        """Before / peak / after (``settle_s`` after the load) in MiB."""
        time.sleep(settle_s)
        self._stop.set()
        self._thread.join()
        after = self.read()
        self.peak = max(self.peak, after)
        mib = 2**20
        return {"before_mib": self.before / mib, "peak_mib": self.peak / mib, "after_mib": after / mib}


def _post(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", "/v1/plans", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def _load_clients(url: str, hit_body: bytes, small: bytes, seconds: float) -> dict[str, Any]:
    """50 posting clients (distinct small plans) and 8 hitting clients for ``seconds``."""
    host, port = url.removeprefix("http://").split(":")
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    hits: list[float] = []
    counts: dict[str, int] = {}
    accepted: list[str] = []
    seeds = iter(range(10**9))

    def count(status: int) -> None:
        with lock:
            counts[str(status)] = counts.get(str(status), 0) + 1

    def poster() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        while time.monotonic() < deadline:
            with lock:
                seed = next(seeds)
            body = plan_body(small, options={"time_limit_s": 5, "seed": seed}, cluster="1x2", mesh_shape=[2])
            status, data = _post(conn, body)
            count(status)
            if status == 202:
                with lock:
                    accepted.append(json.loads(data)["id"])
            elif status == 429:
                time.sleep(0.5)  # as a client honouring Retry-After (shortened) would

    def hitter() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            status, _ = _post(conn, hit_body)
            count(status)
            if status == 200:
                with lock:
                    hits.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=poster) for _ in range(50)]
    threads += [threading.Thread(target=hitter) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"hits": hits, "counts": counts, "accepted": accepted}


def _jobs_lost(url: str, accepted: list[str], wait_s: float = 300) -> dict[str, Any]:
    """Follow every accepted job to its end; lost = ``job_lost``/``worker_lost`` or never ending."""
    client = PlanClient(url, timeout_s=60)
    ends: dict[str, int] = {}
    lost = 0
    deadline = time.monotonic() + wait_s
    for key in accepted:
        job = client.job(key)
        while job["status"] not in ("succeeded", "failed", "canceled") and time.monotonic() < deadline:
            time.sleep(0.5)
            job = client.job(key)
        code = (job.get("error") or {}).get("code")
        end = job["status"] + (f":{code}" if code else "")
        ends[end] = ends.get(end, 0) + 1
        if job["status"] not in ("succeeded", "failed", "canceled") or code in ("job_lost", "worker_lost"):
            lost += 1
    return {"accepted": len(accepted), "ends": ends, "lost": lost}


def load_report(url: str, hit_body: bytes, seconds: float) -> dict[str, Any]:
    """The load run against one server: hit latency, status counts, jobs lost, API RSS."""
    small = build("tiny-gpt").to_json().encode()
    rss = RssSampler(SERVER_PIDS[url])
    run = _load_clients(url, hit_body, small, seconds)
    memory = rss.stop()
    counts = run["counts"]
    return {
        "seconds": seconds,
        "hits": {"requests": len(run["hits"]), **(summary(run["hits"]) if run["hits"] else {})},
        "status_counts": counts,
        "429": counts.get("429", 0),
        "5xx": sum(n for status, n in counts.items() if status.startswith("5")),
        "jobs": _jobs_lost(url, run["accepted"]),
        "api_rss": memory,
    }


def big_body_report(url: str, ops: int = 1_500_000) -> dict[str, Any]:
    """One body of ``ops`` tiny ops (44 MB at 1.5 M): its status and the API's RSS around it."""
    graph = {
        "format": "autopar.graph/v1",
        "tensors": {},
        "ops": [{"name": f"o{i}", "type": "r"} for i in range(ops)],
    }
    body = json.dumps({"graph": graph, "cluster": "1x2", "mesh_shape": [2]}, separators=(",", ":")).encode()
    del graph
    host, port = url.removeprefix("http://").split(":")
    rss = RssSampler(SERVER_PIDS[url])
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    t0 = time.perf_counter()
    status, data = _post(conn, body)
    elapsed = time.perf_counter() - t0
    memory = rss.stop()
    code = json.loads(data).get("code") if data else None
    return {
        "body_mb": len(body) / 1e6,
        "ops": ops,
        "status": status,
        "code": code,
        "seconds": elapsed,
        "api_rss": memory,
    }


def _warm_and_load(url: str, graph_json: bytes, options: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Plan mt5-base once on the server at ``url`` (the plan the hit clients ask for), then
    the load run of :func:`load_report` against it."""
    _plan(PlanClient(url, timeout_s=300), graph_json, options)
    return load_report(url, plan_body(graph_json, options=options), seconds)


def _plan(client: PlanClient, graph_json: bytes, options: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's plan request (mt5-base on CLUSTER, MESH, BUDGET, ZeRO) through ``client``."""
    return client.plan(
        graph_json,
        cluster=CLUSTER,
        mesh_shape=MESH,
        memory_budget_bytes=BUDGET,
        zero_stage=ZERO,
        options=options,
    )


def load_main(args: argparse.Namespace, graph_json: bytes) -> dict[str, Any]:
    """``--load SECONDS``: the load run, embedded then Redis, and the large body."""
    results: dict[str, Any] = {"cpus": os.cpu_count()}
    quick = {"time_limit_s": 120.0}  # the whole request, mt5-base's cost tables included
    with tempfile.TemporaryDirectory(prefix="autopar-bench-") as tmp:
        with serve(Path(tmp) / "cache") as url:
            results["load_embedded"] = _warm_and_load(url, graph_json, quick, args.load)
            print("load embedded", json.dumps(results["load_embedded"], indent=1), flush=True)
            results["big_body_embedded"] = big_body_report(url)
            print("big body", json.dumps(results["big_body_embedded"], indent=1), flush=True)
        if not args.skip_redis:
            with (
                RedisServer() as redis_server,
                workers(redis_server.url, 2),
                serve(Path(tmp) / "cache-redis", "--redis-url", redis_server.url) as url,
            ):
                results["load_redis"] = _warm_and_load(url, graph_json, quick, args.load)
                print("load redis", json.dumps(results["load_redis"], indent=1), flush=True)
    return results


# ------------------------------------------------------------------ 7. hostile clients (issue 34)

KEY_A, KEY_B = "bench-key-a-" + "a" * 20, "bench-key-b-" + "b" * 20


def _junk_body(graph: dict[str, Any], elements: int, **fields: Any) -> bytes:
    """tiny-gpt with ``ops[5].attrs.junk = [7] * elements`` (issue 34's hostile body)."""
    ops = [dict(op) for op in graph["ops"]]
    ops[5] = {**ops[5], "attrs": {**ops[5].get("attrs", {}), "junk": [7] * elements}}
    body = {"graph": {**graph, "ops": ops}, "cluster": "1x2", "mesh_shape": [2], **fields}
    return json.dumps(body, separators=(",", ":")).encode()


def _keyed_post(url: str, body: bytes, key: str) -> tuple[int, str | None, float]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/plans", body, {"Content-Type": "application/json", "X-API-Key": key})
    response = conn.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - t0
    conn.close()
    code = json.loads(data).get("code") if response.status >= 400 and data else None
    return response.status, code, elapsed


def body_memory_report(url: str, graph: dict[str, Any]) -> list[dict[str, Any]]:
    """One hostile body at a time, 1 to 33 MB: status, code and the API's RSS around it."""
    rows = []
    for elements in (500_000, 5_000_000, 16_500_000):
        body = _junk_body(graph, elements)
        rss = RssSampler(SERVER_PIDS[url])
        status, code, seconds = _keyed_post(url, body, KEY_A)
        memory = rss.stop(settle_s=1.0)
        rows.append(
            {
                "body_mb": round(len(body) / 1e6, 1),
                "status": status,
                "code": code,
                "seconds": round(seconds, 3),
                "rss_rise_mib": round(memory["peak_mib"] - memory["before_mib"], 1),
                **{k: round(v, 1) for k, v in memory.items()},
            }
        )
        print("body", rows[-1], flush=True)
    return rows


def valid_body_memory_report(url: str) -> list[dict[str, Any]]:
    """Valid graphs parsed and checked in full (``POST /v1/evaluate`` with an empty plan: 422
    after the graph's checks, no solve): status and the API's RSS around each."""
    host, port = url.removeprefix("http://").split(":")
    rows = []
    for name in ("tiny-gpt", "mt5-base", "t5-base"):
        body = json.dumps({"graph": build(name).to_dict(), "plan": {}}, separators=(",", ":")).encode()
        rss = RssSampler(SERVER_PIDS[url])
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        conn.request("POST", "/v1/evaluate", body, {"Content-Type": "application/json", "X-API-Key": KEY_A})
        response = conn.getresponse()
        response.read()
        conn.close()
        memory = rss.stop(settle_s=1.0)
        rows.append(
            {
                "graph": name,
                "body_mb": round(len(body) / 1e6, 2),
                "status": response.status,
                "rss_rise_mib": round(memory["peak_mib"] - memory["before_mib"], 1),
            }
        )
        print("valid body", rows[-1], flush=True)
    return rows


def flood_report(url: str, graph: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Key A floods with four 10 MB hostile bodies at a time while key B posts small plan
    requests that need a parse (each body differs in bytes, the plan is cached): B's latency."""
    flood = _junk_body(graph, 5_000_000)
    small = {"graph": graph, "cluster": "1x2", "mesh_shape": [2], "options": {"time_limit_s": 10}}
    status, code, _ = _keyed_post(url, json.dumps(small).encode(), KEY_B)  # solve it once
    deadline = time.monotonic() + 300
    while status == 202 and time.monotonic() < deadline:  # until the plan is cached
        time.sleep(0.5)
        status, code, _ = _keyed_post(url, json.dumps(small).encode(), KEY_B)
    if status != 200:
        raise RuntimeError(f"the victim's plan was not cached: {status} {code}")
    stop = threading.Event()
    a_statuses: dict[str, int] = {}
    b_latency: list[float] = []
    b_statuses: dict[str, int] = {}

    def flooder() -> None:
        while not stop.is_set():
            status, code, _ = _keyed_post(url, flood, KEY_A)
            tag = f"{status} {code}"
            a_statuses[tag] = a_statuses.get(tag, 0) + 1

    threads = [threading.Thread(target=flooder, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        body = json.dumps(small, indent=i % 7).encode()  # new bytes, same plan: parsed every time
        status, code, elapsed = _keyed_post(url, body, KEY_B)
        tag = f"{status} {code}"
        b_statuses[tag] = b_statuses.get(tag, 0) + 1
        b_latency.append(elapsed)
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(300)
    fives = sum(n for tag, n in {**a_statuses}.items() if tag.startswith("5"))
    fives += sum(n for tag, n in b_statuses.items() if tag.startswith("5"))
    return {
        "seconds": seconds,
        "flooder_statuses": a_statuses,
        "victim_statuses": b_statuses,
        "victim_ms": summary(b_latency),
        "5xx": fives,
    }


def model_cycle_report(url: str, seconds: float = 10.0) -> dict[str, Any]:
    """Keyless clients asking for model graphs (401), keyed ones cycling through every model."""
    from autopar.models import MODEL_NAMES

    host, port = url.removeprefix("http://").split(":")
    statuses: dict[str, int] = {}
    latency: list[float] = []
    end = time.monotonic() + seconds
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    i = 0
    while time.monotonic() < end:
        name = MODEL_NAMES[i % len(MODEL_NAMES)]
        headers = {"X-API-Key": KEY_A} if i % 2 else {}
        t0 = time.perf_counter()
        conn.request("GET", f"/v1/models/{name}/graph", headers=headers)
        response = conn.getresponse()
        response.read()
        tag = f"{'keyed' if i % 2 else 'keyless'} {response.status}"
        statuses[tag] = statuses.get(tag, 0) + 1
        if i % 2 and i >= 2 * len(MODEL_NAMES):  # after each model was built once
            latency.append(time.perf_counter() - t0)
        i += 1
    return {"statuses": statuses, "keyed_after_first_build_ms": summary(latency)}


def hostile_main(seconds: float) -> dict[str, Any]:
    """Issue 34's hostile checks against ``autopar serve`` (embedded cache, two keys)."""
    graph = build("tiny-gpt").to_dict()
    env = {"AUTOPAR_API_KEYS": f"{KEY_A},{KEY_B}"}
    results: dict[str, Any] = {"cpus": os.cpu_count()}
    with (
        tempfile.TemporaryDirectory(prefix="autopar-bench-") as tmp,
        serve(Path(tmp) / "cache", env=env) as url,
    ):
        results["models"] = model_cycle_report(url)
        print("models", results["models"], flush=True)
        results["valid_bodies"] = valid_body_memory_report(url)
        results["bodies"] = body_memory_report(url, graph)
        results["flood"] = flood_report(url, graph, seconds)
        print("flood", json.dumps(results["flood"]), flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hits", type=int, default=200)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--skip-cold", action="store_true")
    parser.add_argument("--skip-redis", action="store_true")
    parser.add_argument("--skip-429", action="store_true")
    parser.add_argument("--only-429", action="store_true", help="only the 429 measurement")
    parser.add_argument(
        "--load",
        type=float,
        default=None,
        metavar="SECONDS",
        help="only the load run (50 posting + 8 hitting clients for SECONDS) and the 44 MB body",
    )
    parser.add_argument(
        "--hostile",
        type=float,
        default=None,
        metavar="SECONDS",
        help="only issue 34's hostile checks: model graphs with and without a key, RSS per hostile "
        "body (1-33 MB) and per valid graph, one key's latency while another floods 10 MB bodies for SECONDS",
    )
    parser.add_argument(
        "--isolation",
        type=float,
        default=None,
        metavar="SECONDS",
        help="only issue 43's checks: huge integers, one key's streams, another key's cache hits under "
        "each flood for SECONDS, the client's cache hit (benchmarks/service_isolation.py)",
    )
    parser.add_argument(
        "--parts",
        default="huge,streams,floods,client,redis",
        help="with --isolation: the parts to run (default: %(default)s)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.isolation is not None:
        from benchmarks.service_isolation import isolation_main

        parts = tuple(p for p in args.parts.split(",") if not (args.skip_redis and p == "redis"))
        text = json.dumps(isolation_main(args.isolation, parts), indent=1)
        if args.out:
            Path(args.out).write_text(text)
        print(text)
        return 0
    if args.hostile is not None or args.load is not None:
        alone = (
            hostile_main(args.hostile)
            if args.hostile is not None
            else load_main(args, build("mt5-base").to_json().encode())
        )
        text = json.dumps(alone, indent=1)
        if args.out:
            Path(args.out).write_text(text)
        print(text)
        return 0
    results: dict[str, Any] = {"cpus": os.cpu_count(), "time_limit_s": args.time_limit}

    graph_json = build("mt5-base").to_json().encode()
    # with --skip-cold the embedded solve only makes a plan to hit; the limit is the whole
    # request's, mt5-base's cold cost tables included (a loaded machine needs more than 5 s)
    options = {"time_limit_s": 30.0 if args.skip_cold else args.time_limit}
    body = plan_body(graph_json, options=options)
    results["body"] = {
        "raw_bytes": len(body),
        "gzip_bytes": len(gzip.compress(body, 5)),
        "zstd_bytes": len(zstandard.ZstdCompressor(level=3).compress(body)),
    }
    print("body", results["body"], flush=True)

    if args.only_429:
        with tempfile.TemporaryDirectory(prefix="autopar-bench-") as tmp:
            results["refused_429"] = refused_report(Path(tmp) / "cache-429", graph_json, 20)
        print(json.dumps(results, indent=1))
        return 0

    with tempfile.TemporaryDirectory(prefix="autopar-bench-") as tmp:
        cache = Path(tmp) / "cache"
        if not args.skip_cold:
            code = LOCAL_PLAN.format(
                cluster=CLUSTER, mesh=MESH, budget=BUDGET, zero=ZERO, limit=args.time_limit
            )
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", code],
                cwd=REPO,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                check=True,
            )
            local_process_s = time.perf_counter() - t0
            local = json.loads(out.stdout.strip().splitlines()[-1])
            results["local"] = {**local, "process_s": local_process_s}
            print("local", results["local"], flush=True)

        with serve(cache) as url:
            client = PlanClient(url, timeout_s=120)
            t0 = time.perf_counter()
            record = _plan(client, graph_json, options)
            cold_s = time.perf_counter() - t0
            job = client.job(record["key"])
            results["service_cold"] = {
                "end_to_end_s": cold_s,
                "solve_s": (job.get("result") or {}).get("solve_wall_s"),
                "step_time_s": record["step_time_s"],
            }
            if "local" in results:
                results["service_cold"]["overhead_vs_plan"] = cold_s / results["local"]["plan_s"] - 1
            print("service cold", results["service_cold"], flush=True)
            results["hit_embedded"] = hit_report(url, body, args.hits)
            print("hit embedded", json.dumps(results["hit_embedded"], indent=1), flush=True)

        if not args.skip_429:
            results["refused_429"] = refused_report(Path(tmp) / "cache-429", graph_json, 20)
            print("429", json.dumps(results["refused_429"], indent=1), flush=True)

        if not args.skip_redis:
            with (
                RedisServer() as redis_server,
                workers(redis_server.url, 1 if args.skip_cold else 2),
                serve(cache, "--redis-url", redis_server.url) as url,
            ):
                client = PlanClient(url, timeout_s=120)
                # a plan to hit (its quality does not matter here); the whole request's limit
                quick = {"time_limit_s": 30.0}
                _plan(client, graph_json, quick)
                results["hit_redis"] = hit_report(url, plan_body(graph_json, options=quick), args.hits)
                print("hit redis", json.dumps(results["hit_redis"], indent=1), flush=True)
                if not args.skip_cold:
                    results["cold_jobs_2_workers"] = cold_jobs(client)
                    print("cold jobs", results["cold_jobs_2_workers"], flush=True)

    text = json.dumps(results, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
