"""Issue 34's security and reliability cases, replayed against a real server (embedded backend).

1. every ``/v1`` route needs the key when keys are configured; bundled model graphs are
   built once per process, with room for every model;
2. parses are accounted per client: one client cannot hold every parse slot, and a
   timed-out parse frees its slot;
3. a body's attrs and meta are bounded before and after the parse (413/422 naming the limit);
4. graphs whose shapes disagree, non-finite attrs, duplicate keys and time limits below
   the least that loads the graph are refused (the property test is in
   ``test_graph_fuzz.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.service.helpers import LiveServer, live_server, make_settings
from tests.service.test_hostile import KEY_A, KEY_B

pytestmark = pytest.mark.timeout(300)

PUBLIC = {"/livez", "/readyz", "/docs", "/openapi.json", "/", "/ui/{name}", "/metrics"}
"""Routes open without a key (``/metrics`` has its own key check)."""


@pytest.fixture
def keyed(tmp_path) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path, api_keys=[KEY_A, KEY_B], local_workers=1)
    with live_server(settings) as s:
        yield s


def _fill(path: str) -> str:
    return (
        path.replace("{key}", "ab" * 32)
        .replace("{job_id}", "ab" * 32)
        .replace("{id}", "ab" * 32)
        .replace("{name}", "tiny-gpt")
    )


# ---------------------------------------------------------------- 1. keys on every /v1 route


def test_every_v1_route_needs_the_key(keyed: LiveServer) -> None:
    paths = {p: ops for p, ops in keyed.app.openapi()["paths"].items() if p.startswith("/v1")}
    assert "/v1/models/{name}/graph" in paths and "/v1/explorer/options" in paths
    with keyed.client() as anon:
        for path, operations in paths.items():
            for method in operations:
                r = anon.request(method.upper(), _fill(path), content=b"{}")
                assert r.status_code == 401, (method, path, r.status_code)
                assert r.json()["code"] == "unauthorized"
    with keyed.client(headers={"X-API-Key": KEY_A}) as a:
        assert a.get("/v1/explorer/options").status_code == 200
        graph = a.get("/v1/models/tiny-gpt/graph")
        assert graph.status_code == 200 and graph.json()["format"] == "autopar.graph/v1"
        assert a.get("/livez").status_code == 200


def test_bundled_graphs_are_built_once_for_every_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import autopar.models
    from autopar_service import graphs

    built: list[str] = []
    real = autopar.models.build

    def counting(name: str) -> Any:
        built.append(name)
        return real(name)

    monkeypatch.setattr(graphs, "_MODEL_JSON", {})
    monkeypatch.setattr(autopar.models, "build", counting)
    names = ["tiny-gpt", "tiny-t5"]
    for _ in range(3):  # cycling through models rebuilds none
        for name in names:
            assert graphs.model_json(name).startswith(b"{")
    assert built == names
