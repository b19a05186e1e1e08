"""The API on the embedded default: diskcache + local solver processes (no Redis)."""

from __future__ import annotations

import copy
import gzip
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import zstandard

from autopar.ir.plan import Plan
from tests.service.helpers import (
    UNREACHABLE_LIMIT_S,
    encode,
    live_server,
    make_settings,
    metric,
    plan_body,
    second_attempt,
    wait_job,
)


@pytest.fixture
def server(tmp_path):
    # one address posts twenty bodies at once below: let them all reach the parser (bodies in
    # the parser count toward the client's unfinished jobs)
    with live_server(make_settings(tmp_path, max_parses_per_client=32, max_jobs_per_client=32)) as s:
        yield s


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def solver_pid(server, key: str, timeout_s: float = 30) -> int:
    """The pid of the job's running solver process, once it has one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = server.app.state.service.jobs.pid(key)
        if pid is not None:
            return int(pid)
        time.sleep(0.02)
    raise AssertionError(f"job {key} never got a solver process")


def solve(client: httpx.Client, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """POST, wait for the job, return (key, plan record)."""
    r = client.post("/v1/plans", json=body)
    assert r.status_code in (200, 202), r.text
    if r.status_code == 200:
        return r.json()["key"], r.json()
    key = r.json()["id"]
    job = wait_job(client, key)
    assert job["status"] == "succeeded", job
    record = client.get(f"/v1/plans/{key}").json()
    return key, record


def test_miss_then_hit(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    body = plan_body(tiny_graph)
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 202, r.text
    job = r.json()
    key = job["id"]
    assert len(key) == 64
    assert r.headers["location"] == f"/v1/jobs/{key}"
    assert int(r.headers["retry-after"]) >= 1
    assert job["status"] in ("queued", "running")

    done = wait_job(client, key)
    assert done["status"] == "succeeded"
    assert done["links"]["plan"] == f"/v1/plans/{key}"
    assert done["result"]["step_time_s"] > 0

    hit = client.post("/v1/plans", json=body)
    assert hit.status_code == 200
    record = hit.json()
    assert record["key"] == key
    assert record["mesh_shape"] == [2]
    assert record["step_time_s"] == pytest.approx(done["result"]["step_time_s"])
    plan = Plan.from_dict(record["plan"])
    assert plan.mesh.shape == (2,)
    assert "iteration" in record["summary"]

    etag = hit.headers["etag"]
    again = client.get(f"/v1/plans/{key}")
    assert again.status_code == 200 and again.headers["etag"] == etag
    assert "immutable" in again.headers["cache-control"]
    assert client.get(f"/v1/plans/{key}", headers={"If-None-Match": etag}).status_code == 304
    assert metric(client, "autopar_plan_cache_hits_total") >= 1
    assert metric(client, "autopar_plan_cache_misses_total") == 1
    assert metric(client, "autopar_solves_started_total") == 1

    # the independent evaluator agrees with the cached prediction
    ev = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan_key": key})
    assert ev.status_code == 200, ev.text
    assert ev.json()["valid"] is True
    assert ev.json()["step_time_s"] == pytest.approx(record["step_time_s"], rel=1e-6)


def test_key_ignores_op_order_whitespace_and_encoding(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    key, _ = solve(client, plan_body(tiny_graph))
    shuffled = copy.deepcopy(tiny_graph)
    shuffled["ops"] = list(reversed(shuffled["ops"]))
    pretty = json.dumps(plan_body(shuffled), indent=3).encode()
    r = client.post("/v1/plans", content=pretty, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["key"] == key
    for encoding, packed in (
        ("gzip", gzip.compress(pretty)),
        ("zstd", zstandard.ZstdCompressor().compress(pretty)),
    ):
        r = client.post(
            "/v1/plans",
            content=packed,
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert r.status_code == 200, (encoding, r.text)
        assert r.json()["key"] == key
    # a different request is a different plan
    other = client.post("/v1/plans", json=plan_body(tiny_graph, zero_stage=1))
    assert other.status_code == 202 and other.json()["id"] != key
    wait_job(client, other.json()["id"])


def test_single_flight_twenty_concurrent_posts(
    client: httpx.Client, server, tiny_graph: dict[str, Any]
) -> None:
    body = encode(plan_body(tiny_graph, options={"time_limit_s": 10, "seed": 7}))

    def post(_: int) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            return c.post("/v1/plans", content=body, headers={"Content-Type": "application/json"})

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(post, range(20)))
    assert {r.status_code for r in answers} <= {200, 202}
    ids = {r.json()["id"] if r.status_code == 202 else r.json()["key"] for r in answers}
    assert len(ids) == 1
    job = wait_job(client, ids.pop())
    assert job["status"] == "succeeded" and job["attempts"] == 1
    assert metric(client, "autopar_solves_started_total") == 1


def test_invalid_graph_is_422_naming_the_op(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    broken = copy.deepcopy(tiny_graph)
    victim = next(op for op in broken["ops"][5:] if op["inputs"])
    port = next(iter(victim["inputs"]))
    victim["inputs"][port] = "no_such_tensor"
    r = client.post("/v1/plans", json=plan_body(broken))
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["code"] == "dangling_tensor"
    assert problem["op"] == victim["name"]
    assert problem["type"] == "urn:autopar:problem:dangling_tensor"
    assert victim["name"] in problem["detail"]


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("mesh_shape", [3], "bad_mesh"),
        ("zero_stage", 5, "invalid_request"),
        ("cluster", "two-by-four", "invalid_request"),
        ("options", {"time_limit_s": 10_000}, "bad_solver_option"),
        ("options", {"bogus": 1}, "invalid_request"),
    ],
)
def test_bad_request_fields_are_422(
    client: httpx.Client, tiny_graph: dict[str, Any], field: str, value: Any, code: str
) -> None:
    r = client.post("/v1/plans", json=plan_body(tiny_graph, **{field: value}))
    assert r.status_code == 422, r.text
    assert r.json()["code"] == code


def test_not_json_is_400(client: httpx.Client) -> None:
    r = client.post("/v1/plans", content=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_json"


def test_infeasible_budget_is_422_with_smallest_feasible(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    body = plan_body(tiny_graph, memory_budget_bytes=64 * 1024)
    r = client.post("/v1/plans", params={"wait": 60}, json=body)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["code"] == "infeasible_budget"
    assert problem["title"] == "Infeasible memory budget"
    assert problem["min_feasible_bytes"] > 64 * 1024
    started = metric(client, "autopar_solves_started_total")
    # asked again: answered from the job record, no new solve
    again = client.post("/v1/plans", json=body)
    assert again.status_code == 422 and again.json()["code"] == "infeasible_budget"
    assert metric(client, "autopar_solves_started_total") == started


def test_unknown_job_and_plan_are_404(client: httpx.Client) -> None:
    missing = "0" * 64
    for path in (f"/v1/jobs/{missing}", f"/v1/plans/{missing}", f"/v1/sweeps/{missing}"):
        r = client.get(path)
        assert r.status_code == 404, path
        assert r.headers["content-type"].startswith("application/problem+json")
    assert client.delete(f"/v1/jobs/{missing}").status_code == 404
    assert client.get("/v1/jobs/not-a-key").status_code == 422


def test_sse_stream_reports_progress_then_end(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    r = client.post("/v1/plans", json=plan_body(tiny_graph, zero_stage=3))
    key = r.json()["id"]
    events: list[tuple[str, dict[str, Any]]] = []
    with client.stream("GET", f"/v1/jobs/{key}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((str(event), json.loads(line[6:])))
                if event == "end":
                    break
    kinds = [e for e, _ in events]
    assert kinds[-1] == "end" and events[-1][1]["status"] == "succeeded"
    assert "progress" in kinds
    phases = {d["phase"] for _, d in events}
    assert len(phases) >= 2  # e.g. starting, cost_tables, solve, done
    versions = [int(d.get("attempts", 0)) for _, d in events]
    assert versions  # every event carries the full job


def test_sweep_table(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    body = {
        "graph": tiny_graph,
        "cluster": "1x2",
        "mesh_shapes": [[2]],
        "memory_budgets_bytes": [None, 64 * 1024],
        "zero_stages": [1, 2],
        "options": {"time_limit_s": 10},
    }
    r = client.post("/v1/sweeps", params={"wait": 120}, json=body)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["complete"] is True
    assert len(view["rows"]) == 4
    by = {(row["memory_budget_bytes"], row["zero_stage"]): row for row in view["rows"]}
    device = 40 * 1024**3
    for zero in (1, 2):
        ok = by[(device, zero)]
        assert ok["status"] == "succeeded" and ok["step_time_s"] > 0
        assert ok["links"]["plan"] == f"/v1/plans/{ok['key']}"
        bad = by[(64 * 1024, zero)]
        assert bad["status"] == "infeasible" and bad["min_feasible_bytes"] > 64 * 1024
    # ZeRO-2 shards gradients too: the same plan never needs more memory under ZeRO-2.
    # (The two rows' plans may differ: each is only within the requested gap of optimal
    # in step time, so their memory is not comparable.)
    zero1 = client.get(by[(device, 1)]["links"]["plan"])
    assert zero1.status_code == 200, zero1.text
    plan1 = zero1.json()["plan"]
    as_zero2 = {**plan1, "zero_stage": 2}
    ev1 = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan": plan1})
    ev2 = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan": as_zero2})
    assert ev1.status_code == 200 and ev2.status_code == 200, (ev1.text, ev2.text)
    assert ev1.json()["memory_per_device_bytes"] == pytest.approx(by[(device, 1)]["memory_per_device_bytes"])
    assert ev2.json()["memory_per_device_bytes"] <= ev1.json()["memory_per_device_bytes"]
    assert ev2.json()["memory"]["grads_bytes"] < ev1.json()["memory"]["grads_bytes"]
    assert "infeasible" in view["table"] and "succeeded" in view["table"]
    same = client.get(view["links"]["self"])
    assert same.status_code == 200 and same.json()["rows"] == view["rows"]


def test_sweep_too_large(server, tiny_graph: dict[str, Any]) -> None:
    with server.client() as c:
        body = {"graph": tiny_graph, "cluster": "1x4", "memory_budgets_bytes": list(range(1, 40))}
        r = c.post("/v1/sweeps", json=body)
    assert r.status_code == 422 and r.json()["code"] == "sweep_too_large"


def test_cancel_running_job(client: httpx.Client, server, tiny_graph: dict[str, Any]) -> None:
    body = plan_body(
        tiny_graph,
        cluster="1x8",
        mesh_shape=[2, 2, 2],
        options={"time_limit_s": 50, "relative_gap": 0},
    )
    key = client.post("/v1/plans", json=body).json()["id"]
    pid = solver_pid(server, key)
    time.sleep(0.5)
    os.killpg(pid, 0)  # the solver's process group exists
    r = client.delete(f"/v1/jobs/{key}")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "canceled" and r.json()["error"]["code"] == "canceled"
    assert client.get(f"/v1/jobs/{key}").json()["status"] == "canceled"
    # the solver's whole process group is gone
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("solver processes survived the cancel")
    # asking again starts a fresh job
    again = client.post("/v1/plans", json=body)
    assert again.status_code == 202 and again.json()["status"] in ("queued", "running")
    client.delete(f"/v1/jobs/{key}")


def test_health_endpoints(client: httpx.Client) -> None:
    assert client.get("/livez").json() == {"status": "alive"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    checks = ready.json()["checks"]
    assert checks["cache"] == {"ok": True, "backend": "embedded"}
    assert checks["jobs"]["ok"] is True and checks["jobs"]["kind"] == "local"
    text = client.get("/metrics").text
    assert "# TYPE autopar_http_requests_total counter" in text
    assert 'autopar_http_requests_total{method="GET",route="/readyz",status="200"} 1' in text


def test_server_timing_header(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    r = client.post("/v1/plans", json=plan_body(tiny_graph))
    timing = r.headers["server-timing"]
    assert "total;dur=" in timing and "app;dur=" in timing
    wait_job(client, r.json()["id"])


@pytest.mark.parametrize("retries", [1, 0])
def test_solver_process_sigkilled_mid_job(tmp_path, tiny_graph: dict[str, Any], retries: int) -> None:
    body = plan_body(
        tiny_graph,
        cluster="1x8",
        mesh_shape=[2, 2, 2],
        # the whole solve, cost tables included, with a limit no load reaches (it stops at its optimum)
        options={"time_limit_s": UNREACHABLE_LIMIT_S, "relative_gap": 0},
    )
    settings = make_settings(
        tmp_path, job_retries=retries, max_time_limit_s=UNREACHABLE_LIMIT_S, job_timeout_margin_s=60
    )
    with live_server(settings) as server, server.client() as c:
        key = c.post("/v1/plans", json=body).json()["id"]
        pid = solver_pid(server, key)
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        if retries:  # the new attempt shows as itself, not as the one that died (issue 43)
            second = second_attempt(c, key)
            assert second["error"] is None and second["status"] in ("running", "succeeded"), second
        job = wait_job(c, key, timeout_s=UNREACHABLE_LIMIT_S + 120)
        if retries:
            assert job["status"] == "succeeded", job
            assert job["attempts"] == 2 and job["error"] is None
            assert job["result"]["gap"] == 0  # the retry reached the optimum, not its limit
            assert metric(c, "autopar_solves_started_total") == 2
        else:
            assert job["status"] == "failed"
            assert job["error"]["code"] == "worker_crashed"
            assert "SIGKILL" in job["error"]["message"]
            # a crash is not remembered as the answer: asking again solves again
            again = c.post("/v1/plans", json=body)
            assert again.status_code == 202
            c.delete(f"/v1/jobs/{key}")


def test_refresh_resolves_warm_and_keeps_the_cheaper_plan(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    body = plan_body(tiny_graph)
    key, first = solve(client, body)
    r = client.post("/v1/plans", params={"refresh": "true"}, json=body)
    assert r.status_code == 202 and r.json()["id"] == key
    job = wait_job(client, key)
    assert job["status"] == "succeeded"
    assert job["result"]["step_time_s"] >= first["step_time_s"] or job["result"]["stored"]
    after = client.get(f"/v1/plans/{key}").json()
    assert after["step_time_s"] <= first["step_time_s"]
    if not job["result"]["stored"]:
        assert after["created_at"] == first["created_at"]  # the stored plan was kept
    assert metric(client, "autopar_solves_started_total") == 2


def test_a_request_that_differs_only_in_its_time_limit_is_the_same_problem(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    """The key is the problem, not the effort: a launcher that changes its time limit (or
    asks a gap the cached plan already proves) gets the cached plan at once."""
    # a limit a loaded machine cannot run out of (the solve stops at its proven optimum)
    key, first = solve(client, plan_body(tiny_graph, options={"time_limit_s": 60}))
    assert first["solver"]["gap"] <= 0.01
    again = client.post(
        "/v1/plans", json=plan_body(tiny_graph, options={"time_limit_s": 6, "relative_gap": 0.05})
    )
    assert again.status_code == 200  # a cache hit: no job
    second = again.json()
    assert second["key"] == key
    assert second["iteration_time_s"] == first["iteration_time_s"]
    assert metric(client, "autopar_solves_started_total") == 1


def test_a_cached_plan_answers_only_within_the_gap_asked() -> None:
    from autopar.hardware.cluster import Cluster
    from autopar.models import build
    from autopar_service.requests import answers_within_gap
    from autopar_solver.options import SolverOptions
    from autopar_solver.planner import PlanRequest

    def request(gap: float, deterministic: bool = False, time_limit_s: float = 30) -> PlanRequest:
        options = SolverOptions(relative_gap=gap, deterministic=deterministic, time_limit_s=time_limit_s)
        return PlanRequest(build("tiny-gpt"), Cluster.parse("1x4"), (2, 2), None, 2, options)

    record = {"solver": {"gap": 0.03, "time_limit_s": 10}}
    assert answers_within_gap(record, request(0.05))
    assert not answers_within_gap(record, request(0.01))  # more time than it had: solved again, from it
    assert answers_within_gap(record, request(0.01, time_limit_s=10))  # no more time: it answers
    assert answers_within_gap(record, request(0.01, time_limit_s=5))
    assert not answers_within_gap({"solver": {}}, request(0.05))  # no proven gap: solved again
    assert answers_within_gap(record, request(0.01, deterministic=True))  # keyed on its gap
