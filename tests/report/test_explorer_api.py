"""The explorer's routes over HTTP: page, static files, model graphs, plan reports."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from autopar.ir.graph import Graph
from autopar_service.tasks import graph_key
from tests.service.helpers import live_server, make_settings, wait_job

KEY = "k-" + "7" * 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with live_server(make_settings(tmp_path_factory.mktemp("explorer"), api_keys=[KEY])) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with server.client(headers={"X-API-Key": KEY}) as c:
        yield c


@pytest.fixture(scope="module")
def tiny_graph(client: httpx.Client) -> dict[str, Any]:
    r = client.get("/v1/models/tiny-gpt/graph")
    assert r.status_code == 200
    return r.json()


@pytest.fixture(scope="module")
def plan_key(client: httpx.Client, tiny_graph: dict[str, Any]) -> str:
    body = {"graph": tiny_graph, "cluster": "2x4", "mesh_shape": [4, 2], "zero_stage": 2}
    r = client.post("/v1/plans", json=body)
    assert r.status_code in (200, 202), r.text
    if r.status_code == 200:
        return str(r.json()["key"])
    key = str(r.json()["id"])
    assert wait_job(client, key, timeout_s=120)["status"] == "succeeded"
    return key


def test_page_and_its_files(server) -> None:
    with server.client() as anonymous:
        page = anonymous.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for src in re.findall(r'(?:src|href)="(/ui/[^"]+)"', page.text):
            r = anonymous.get(src)
            assert r.status_code == 200, src
            assert r.headers["content-type"].startswith(("text/javascript", "text/css")), src
        assert "https://" not in page.text
        assert anonymous.get("/ui/plotly.min.js").content.startswith(b"/**")
        for bad in ("../app.py", ".hidden.js", "missing.js", "explorer.py"):
            assert anonymous.get(f"/ui/{bad}").status_code == 404, bad


def test_options_and_model_graphs(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    options = client.get("/v1/explorer/options").json()
    assert "tiny-gpt" in options["models"] and "mt5-base" in options["models"]
    assert options["presets"]["a100-40g"]["memory_bytes"] > 0
    assert "megatron" in options["baselines"]
    assert Graph.from_dict(tiny_graph).validate().name
    missing = client.get("/v1/models/no-such-model/graph")
    assert missing.status_code == 404
    assert missing.json()["code"] == "model_not_found"


REPORT_TIMEOUT_S = 900
"""Rendering prices three plans of the graph; generous for a loaded machine."""


def test_report_of_a_cached_plan(server, client: httpx.Client, plan_key: str) -> None:
    with server.client() as anonymous:  # a report needs the key, as every /v1 route (issue 24)
        assert anonymous.get(f"/v1/plans/{plan_key}/report").status_code == 401
    r = client.get(
        f"/v1/plans/{plan_key}/report",
        params=[("compare", "megatron"), ("compare", "inferred")],
        timeout=REPORT_TIMEOUT_S,
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    html = r.text
    # the canonical compare set: one report (and one memo entry) whatever the order asked
    assert "compared with inferred, megatron" in html
    assert not re.search(r"""<script[^>]*src\s*=""", html)
    default = client.get(f"/v1/plans/{plan_key}/report", timeout=REPORT_TIMEOUT_S)
    assert default.status_code == 200 and "compared with megatron" in default.text


def test_report_errors(server, client: httpx.Client, plan_key: str) -> None:
    unknown = client.get("/v1/plans/" + "0" * 64 + "/report")
    assert unknown.status_code == 404 and unknown.json()["code"] == "plan_not_found"
    assert client.get("/v1/plans/nothex/report").status_code == 422
    bad = client.get(f"/v1/plans/{plan_key}/report", params={"compare": "alpa"})
    assert bad.status_code == 422 and "alpa" in bad.json()["detail"]


def test_report_when_the_graph_expired(server, client: httpx.Client, plan_key: str) -> None:
    service = server.app.state.service
    record = service.plans.get(plan_key).data()
    saved = service.store.get(graph_key(record["request"]["graph"]))
    service.store.delete(graph_key(record["request"]["graph"]))
    try:
        r = client.get(
            f"/v1/plans/{plan_key}/report", params={"compare": "data-parallel"}, timeout=REPORT_TIMEOUT_S
        )
        assert r.status_code == 404
        assert r.json()["code"] == "graph_not_stored"
        assert "autopar report" in r.json()["detail"]
    finally:
        service.store.put(graph_key(record["request"]["graph"]), saved, 3600)
