"""autopar.client.PlanClient against a live server."""

from __future__ import annotations

import time
from typing import Any

import pytest

from autopar.client import PlanClient, ServiceError
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar_cache.redis_server import RedisServer, free_port
from tests.service.helpers import live_server, make_settings

REQUEST = {"cluster": "1x2", "mesh_shape": (2,), "options": {"time_limit_s": 5}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    settings = make_settings(tmp_path_factory.mktemp("client"), api_keys=["k1", "k2"])
    with live_server(settings) as s:
        yield s


def test_plan_end_to_end_then_cached(server, tiny_graph: dict[str, Any]) -> None:
    client = PlanClient(server.url, api_key="k2")
    updates: list[dict[str, Any]] = []
    record = client.plan(Graph.from_dict(tiny_graph), on_progress=updates.append, **REQUEST)
    plan = Plan.from_dict(record["plan"])
    assert plan.mesh.shape == (2,)
    assert record["step_time_s"] == pytest.approx(plan.step_time_s)
    assert updates and updates[-1]["status"] == "succeeded"
    assert any(u["status"] == "running" for u in updates)

    again = client.submit(tiny_graph, **REQUEST)  # a dict this time: same key
    assert again.status == 200 and again.done and again.key == record["key"]  # a cache hit
    assert client.get_plan(record["key"])["key"] == record["key"]

    ev = client.evaluate(tiny_graph, record["plan"])
    assert ev["valid"] is True
    assert ev["step_time_s"] == pytest.approx(record["step_time_s"], rel=1e-6)
    assert client.evaluate(tiny_graph, record["key"])["valid"] is True


def test_raw_bytes_graph_is_sent_as_is(server, tiny_graph: dict[str, Any]) -> None:
    client = PlanClient(server.url, api_key="k1")
    raw = Graph.from_dict(tiny_graph).to_json(indent=2).encode()
    sub = client.submit(raw, wait_s=30, **REQUEST)
    assert sub.status == 200
    assert sub.key == client.submit(tiny_graph, **REQUEST).key


def test_infeasible_raises_with_smallest_feasible(server, tiny_graph: dict[str, Any]) -> None:
    client = PlanClient(server.url, api_key="k1")
    with pytest.raises(ServiceError) as info:
        client.plan(tiny_graph, memory_budget_bytes=64 * 1024, **REQUEST)
    assert info.value.code == "infeasible_budget"
    assert info.value.details["min_feasible_bytes"] > 64 * 1024
    with pytest.raises(ServiceError) as again:  # now answered at once by the POST
        client.submit(tiny_graph, memory_budget_bytes=64 * 1024, **REQUEST)
    assert again.value.status == 422 and again.value.code == "infeasible_budget"


def test_invalid_graph_names_the_op(server, tiny_graph: dict[str, Any]) -> None:
    broken = dict(tiny_graph)
    broken["ops"] = [dict(op) for op in tiny_graph["ops"]]
    victim = next(op for op in broken["ops"] if op["inputs"])
    victim["inputs"] = {k: "ghost" for k in victim["inputs"]}
    with pytest.raises(ServiceError) as info:
        PlanClient(server.url, api_key="k1").submit(broken, **REQUEST)
    assert info.value.status == 422
    assert info.value.details["op"] == victim["name"]


def test_wrong_key_is_401(server, tiny_graph: dict[str, Any]) -> None:
    for key in (None, "wrong"):
        with pytest.raises(ServiceError) as info:
            PlanClient(server.url, api_key=key).submit(tiny_graph, **REQUEST)
        assert info.value.status == 401 and info.value.code == "unauthorized"
    # reads need no key
    assert PlanClient(server.url).ready()["status"] == "ready"


def test_unreachable_after_retries() -> None:
    client = PlanClient(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.01, timeout_s=2)
    with pytest.raises(ServiceError) as info:
        client.job("0" * 64)
    assert info.value.code == "unreachable"


def test_sweep(server, tiny_graph: dict[str, Any]) -> None:
    client = PlanClient(server.url, api_key="k1")
    table = client.sweep(
        tiny_graph,
        cluster="1x2",
        mesh_shapes=[(2,)],
        zero_stages=[2, 3],
        options={"time_limit_s": 5},
        wait_s=60,
    )
    assert table["complete"] is True
    assert [r["zero_stage"] for r in table["rows"]] == [2, 3]
    assert all(r["status"] == "succeeded" for r in table["rows"])
    assert client.get_sweep(table["id"])["rows"] == table["rows"]


@pytest.mark.redis
def test_retries_503_then_raises(tmp_path, tiny_graph: dict[str, Any]) -> None:
    """Redis down: the client retries the 503s (honouring Retry-After) and then gives up."""
    own = RedisServer().start()
    try:
        with live_server(make_settings(tmp_path, redis_url=own.url, retry_after_s=1)) as s:
            own.stop()
            client = PlanClient(s.url, retries=2, backoff_s=0.01)
            t0 = time.perf_counter()
            with pytest.raises(ServiceError) as info:
                client.submit(tiny_graph, **REQUEST)
            elapsed = time.perf_counter() - t0
            assert info.value.status == 503 and info.value.code in ("cache_unavailable", "queue_unavailable")
            assert elapsed >= 2.0  # two Retry-After: 1 waits
            text = client._request("GET", "/metrics")[2].decode()
            line = 'autopar_http_requests_total{method="POST",route="/v1/plans",status="503"} 3.0'
            assert line in text.splitlines()
    finally:
        own.stop()
