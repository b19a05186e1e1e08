"""Issue 43, item 7: a client that does not re-upload.

``PlanClient`` computes a request's plan key itself (:mod:`autopar.ir.plan_key`, with the
service's ``GET /v1/plan-keys``) and asks for the plan by key; these tests hold the client's key
to the service's for requests of every kind, and check that a cache hit uploads nothing.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from autopar.client import PlanClient
from autopar.ir.graph import Graph
from autopar_cache.plans import code_versions
from autopar_service import work_tasks
from autopar_service.work_pool import WorkerContext
from tests.service.helpers import LiveServer, live_server, make_settings

KEY = "client-keys"

REQUESTS: list[dict[str, Any]] = [
    {},
    {"cluster": "1x2", "mesh_shape": (2,)},
    {"cluster": "1x8", "mesh_shape": [2, 2, 2], "memory_budget_bytes": 12 * 2**30, "zero_stage": 0},
    {"cluster": "2x4", "preset": "a100-80g", "zero_stage": 3, "options": {"runtime": "ideal"}},
    {"cluster": "1x4", "options": {"micro_batches": 8, "checkpointing": "full", "time_limit_s": 45}},
    {"cluster": "1x4", "options": {"checkpointing": "auto", "relative_gap": 0.05, "seed": 3}},
    {"cluster": "1x8", "mesh_shape": [2, 2], "options": {"stages": 2, "micro_batches": 4}},
    {"cluster": "1x8", "options": {"stages": "auto", "micro_batches": 4, "checkpointing": "full"}},
    {"cluster": "1x4", "mesh_shape": [2, 2], "options": {"stages": 1}},
    {"cluster": "1x4", "options": {"deterministic": True, "seed": 5, "relative_gap": 0, "time_limit_s": 8}},
    {"cluster": "1x4", "options": {"deterministic": True, "relative_gap": 0.02}},
    {"cluster": "1x4", "options": {"use_hint": False, "reductions": False, "time_limit_s": 12.5}},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path_factory.mktemp("client-keys"), api_keys=[KEY, "other-key"])
    with live_server(settings) as s:
        yield s


def _body(graph: Any, request: dict[str, Any]) -> bytes:
    fields = {k: (list(v) if isinstance(v, tuple) else v) for k, v in request.items()}
    return json.dumps({"graph": graph, **fields}).encode()


def _service_key(server: LiveServer, graph: Any, request: dict[str, Any]) -> str:
    """The key the service computes for this body (the worker task a POST runs)."""
    context = WorkerContext(server.settings, code_versions())
    try:
        prepared = work_tasks.prepare_plan(context, False, body=_body(graph, request))
    finally:
        context.close()
    return prepared.key


@pytest.mark.parametrize("request_fields", REQUESTS, ids=[json.dumps(r)[:60] for r in REQUESTS])
def test_the_client_computes_the_services_key(
    server: LiveServer, tiny_graph: dict[str, Any], request_fields: dict[str, Any]
) -> None:
    client = PlanClient(server.url, api_key=KEY)
    expected = _service_key(server, tiny_graph, request_fields)
    as_dict = client.plan_key(tiny_graph, **request_fields)
    as_graph = client.plan_key(Graph.from_dict(tiny_graph), **request_fields)
    as_bytes = client.plan_key(json.dumps(tiny_graph, indent=1).encode(), **request_fields)
    assert as_dict == as_graph == as_bytes == expected


def test_keys_agree_with_a_post_to_the_live_service(server: LiveServer, tiny_graph: dict[str, Any]) -> None:
    """The job a POST starts has the key the client computed (then the job is withdrawn)."""
    client = PlanClient(server.url, api_key=KEY)
    for request_fields in (REQUESTS[2], REQUESTS[4], REQUESTS[6], REQUESTS[9]):
        submission = client.submit(tiny_graph, **request_fields)
        assert submission.key == client.plan_key(tiny_graph, **request_fields)
        if submission.record is None:
            client.cancel(submission.key)


def _posts(server: LiveServer) -> float:
    """``POST /v1/plans`` requests the service has answered, any status."""
    prefix = 'autopar_http_requests_total{method="POST",route="/v1/plans"'
    with server.client(headers={"X-API-Key": KEY}) as c:
        text = c.get("/metrics").text
    return sum(float(line.split()[1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_cache_hit_uploads_nothing_and_carries_the_callers_name(
    server: LiveServer, tiny_graph: dict[str, Any]
) -> None:
    graph = copy.deepcopy(tiny_graph)
    graph["ops"][5].setdefault("attrs", {})["note"] = "a launcher's own model"  # no bundled model's
    request = {"cluster": "1x2", "mesh_shape": (2,), "options": {"time_limit_s": 10}}
    first = PlanClient(server.url, api_key=KEY).plan({**graph, "name": "launcher-a"}, **request)
    assert first["graph"]["name"] == "launcher-a"
    posts = _posts(server)
    # a re-launch: a fresh client, the graph re-exported (other meta, other key order), another name
    relaunched = {"meta": {"launch": 2}, **dict(reversed(list(graph.items()))), "name": "launcher-b"}
    again = PlanClient(server.url, api_key="other-key").plan(relaunched, **request)
    assert again["key"] == first["key"] and again["plan"] == {
        **first["plan"],
        "graph": {**first["plan"]["graph"], "name": "launcher-b"},
    }
    assert again["graph"]["name"] == "launcher-b" and "launcher-a" not in json.dumps(again)
    assert _posts(server) == posts  # asked for by key: no POST, nothing uploaded


def test_a_plan_that_does_not_answer_is_not_taken(server: LiveServer, tiny_graph: dict[str, Any]) -> None:
    """A cached plan answers a request as the service decides (``record_answers``): one whose
    proven gap is larger than asked and that was solved with less time than now allowed is not
    taken by key (the client then posts, and the service solves again from it)."""
    client = PlanClient(server.url, api_key=KEY)
    request = {"cluster": "1x4", "mesh_shape": (2, 2), "options": {"time_limit_s": 20, "relative_gap": 0.5}}
    record = client.plan(tiny_graph, timeout_s=600, **request)
    assert client.cached_plan(tiny_graph, **request)["key"] == record["key"]
    stricter = {**request, "options": {"time_limit_s": 40, "relative_gap": 0.0}}
    assert client.plan_key(tiny_graph, **stricter) == record["key"]  # one problem, one key
    answers = record["solver"]["gap"] == 0  # proved optimal: it answers any gap asked
    assert (client.cached_plan(tiny_graph, **stricter) is not None) is answers


def test_a_key_reveals_only_the_plan_of_its_request(server: LiveServer, tiny_graph: dict[str, Any]) -> None:
    client = PlanClient(server.url, api_key=KEY)
    record = client.plan(tiny_graph, cluster="1x2", mesh_shape=(2,), options={"time_limit_s": 10})
    near = record["key"][:-1] + ("0" if record["key"][-1] != "0" else "1")
    with server.client(headers={"X-API-Key": "other-key"}) as other:
        assert other.get(f"/v1/plans/{near}").status_code == 404
        context = other.get("/v1/plan-keys").json()
    assert set(context) == {"schema", "versions", "request_versions", "options"}
    assert record["key"] not in json.dumps(context)
    with server.client() as anon:
        assert anon.get("/v1/plan-keys").status_code == 401
