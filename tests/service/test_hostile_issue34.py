"""Issue 34's security and reliability cases, replayed against a real server (embedded backend).

1. every ``/v1`` route needs the key when keys are configured; bundled model graphs are
   built once per process, with room for every model;
2. parses are accounted per client: one client cannot hold every parse slot, and a
   timed-out parse frees its slot (issue 43: its worker process is killed);
3. a body's attrs and meta are bounded before and after the parse (413/422 naming the limit);
4. graphs whose shapes disagree, non-finite attrs, duplicate keys and time limits below
   the least that loads the graph are refused (the property test is in
   ``test_graph_fuzz.py``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from autopar_service import work_tasks
from tests.service import held_tasks
from tests.service.helpers import LiveServer, live_server, make_settings, plan_body
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


# ---------------------------------------------------------------- 2. parses per client


def test_one_client_cannot_hold_every_parse_slot(
    tmp_path, monkeypatch: pytest.MonkeyPatch, tiny_graph: dict[str, Any]
) -> None:
    settings = make_settings(
        tmp_path, api_keys=[KEY_A, KEY_B], max_concurrent_parses=2, max_parses_per_client=1, max_parse_s=60
    )
    monkeypatch.setattr(work_tasks, "prepare_plan", held_tasks.held_prepare_plan)
    hold = tmp_path / "hold"
    hold.mkdir()
    held = plan_body({**tiny_graph, "name": held_tasks.hold_name(hold)})
    with (
        live_server(settings) as server,
        server.client(headers={"X-API-Key": KEY_A}) as a,
        server.client(headers={"X-API-Key": KEY_B}) as b,
        ThreadPoolExecutor(1) as pool,
    ):
        first = pool.submit(a.post, "/v1/plans", json=held)
        held_tasks.wait_started(hold)
        assert server.app.state.service.parsing  # A's body counts while a worker parses it
        second = a.post("/v1/plans", json=held)
        assert second.status_code == 429 and second.json()["code"] == "too_many_parses"
        assert second.headers["Retry-After"]
        other = b.post("/v1/plans", json=plan_body(tiny_graph))  # B parses beside A's parse
        assert other.status_code in (200, 202), other.text
        held_tasks.release(hold)
        assert first.result().status_code in (200, 202)


def test_a_timed_out_parse_is_stopped_and_frees_its_worker(
    tmp_path, monkeypatch: pytest.MonkeyPatch, tiny_graph: dict[str, Any]
) -> None:
    """A parse past ``max_parse_s`` answers 503 and its worker process is killed (it cannot go on
    burning CPU for nobody); the next body gets a fresh worker."""
    settings = make_settings(tmp_path, api_keys=[KEY_A, KEY_B], max_concurrent_parses=1, max_parse_s=8)
    monkeypatch.setattr(work_tasks, "prepare_plan", held_tasks.held_prepare_plan)
    hold = tmp_path / "hold"
    hold.mkdir()
    with (
        live_server(settings) as server,
        server.client(headers={"X-API-Key": KEY_A}) as a,
        server.client(headers={"X-API-Key": KEY_B}) as b,
    ):
        r = a.post("/v1/plans", json=plan_body({**tiny_graph, "name": held_tasks.hold_name(hold)}))
        assert r.status_code == 503 and r.json()["code"] == "parse_timeout"
        (pid,) = held_tasks.started(hold)
        _wait_gone(pid)  # killed, not left running
        other = b.post("/v1/plans", json=plan_body(tiny_graph))  # the one worker is back
        assert other.status_code in (200, 202), other.text
        assert pid not in server.app.state.service.pool.pids()
        assert server.app.state.service.parsing == {}


def _wait_gone(pid: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{pid}") and _state(pid) != "Z":
        assert time.monotonic() < deadline, f"process {pid} is still running"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


# ---------------------------------------------------------------- 3. bounded bodies


def _mutated(graph: dict[str, Any], mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    copy = json.loads(json.dumps(graph))
    mutate(copy)
    return copy


BOUNDED: list[tuple[str, Callable[[dict[str, Any]], None], int, str]] = [
    ("5M junk", lambda g: g["ops"][5]["attrs"].update(junk=[7] * 5_000_000), 413, "too_many_values"),
    ("one large op", lambda g: g["ops"][5]["attrs"].update(junk="x" * 100_000), 413, "graph_item_too_large"),
    ("long attr", lambda g: g["ops"][5]["attrs"].update(junk=[7] * 2000), 422, "attrs_too_large"),
    (
        "many attrs",
        lambda g: g["ops"][5]["attrs"].update({f"a{i}": i for i in range(100)}),
        422,
        "attrs_too_large",
    ),
    ("deep attr", lambda g: g["ops"][5]["attrs"].update(junk=[[[[[1]]]]]), 422, "attrs_too_large"),
    ("large meta", lambda g: g.update(meta={f"k{i}": i for i in range(20_000)}), 413, "meta_too_large"),
    ("flat meta", lambda g: g.update(meta={f"k{i}": i for i in range(200_000)}), 413, "too_many_values"),
]


@pytest.mark.parametrize(("mutate", "status", "code"), [c[1:] for c in BOUNDED], ids=[c[0] for c in BOUNDED])
def test_attrs_and_meta_are_bounded(
    keyed: LiveServer,
    tiny_graph: dict[str, Any],
    mutate: Callable[[dict[str, Any]], None],
    status: int,
    code: str,
) -> None:
    with keyed.client(headers={"X-API-Key": KEY_A}) as a:
        r = a.post("/v1/plans", json=plan_body(_mutated(tiny_graph, mutate)))
        assert r.status_code == status, r.text
        problem = r.json()
        assert problem["code"] == code, problem
        assert "most" in problem["detail"]  # names the limit


RAW_REFUSED = [
    (
        "NaN",
        b'{"graph": "tiny-gpt", "cluster": "1x2", "options": {"time_limit_s": NaN}}',
        "non_finite_number",
    ),
    (
        "1e999",
        b'{"graph": "tiny-gpt", "cluster": "1x2", "options": {"time_limit_s": 1e999}}',
        "non_finite_number",
    ),
    ("duplicate", b'{"graph": "tiny-gpt", "cluster": "1x2", "cluster": "2x4"}', "duplicate_key"),
]


@pytest.mark.parametrize(("raw", "code"), [c[1:] for c in RAW_REFUSED], ids=[c[0] for c in RAW_REFUSED])
def test_non_finite_numbers_and_duplicate_keys_are_refused(keyed: LiveServer, raw: bytes, code: str) -> None:
    with keyed.client(headers={"X-API-Key": KEY_A, "Content-Type": "application/json"}) as a:
        for path in ("/v1/plans", "/v1/sweeps", "/v1/evaluate"):
            r = a.post(path, content=raw)
            assert r.status_code == 422 and r.json()["code"] == code, (path, r.text)


@pytest.mark.parametrize("attrs", [{"alpha": float("nan")}, {"epsilon": float("-inf")}], ids=["nan", "-inf"])
def test_non_finite_attrs_are_refused(
    keyed: LiveServer, tiny_graph: dict[str, Any], attrs: dict[str, float]
) -> None:
    graph = _mutated(tiny_graph, lambda g: g["ops"][5]["attrs"].update(attrs))
    raw = json.dumps(plan_body(graph)).encode()  # Python writes NaN and -Infinity
    with keyed.client(headers={"X-API-Key": KEY_A, "Content-Type": "application/json"}) as a:
        r = a.post("/v1/plans", content=raw)
        assert r.status_code == 422 and r.json()["code"] == "non_finite_number", r.text


# ---------------------------------------------------------------- 4. inconsistent requests


def test_a_time_limit_below_the_least_is_refused_naming_it(keyed: LiveServer) -> None:
    with keyed.client(headers={"X-API-Key": KEY_A}) as a:
        r = a.post(
            "/v1/plans", json={"graph": "tiny-gpt", "cluster": "1x2", "options": {"time_limit_s": 1e-9}}
        )
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["code"] == "time_limit_too_small" and problem["minimum_s"] > 0
        assert f"at least {problem['minimum_s']:g} s" in problem["detail"]
        ok = a.post("/v1/plans", json={"graph": "tiny-gpt", "cluster": "1x2", "options": {"time_limit_s": 1}})
        assert ok.status_code in (200, 202), ok.text


SHAPE_FUZZ_EXAMPLES = 40


def test_graphs_whose_shapes_disagree_never_get_a_plan(keyed: LiveServer, tiny_graph: dict[str, Any]) -> None:
    """Property: one dim of one port of an op whose family checks shapes grows by a large
    prime (no broadcast can absorb it): always a 4xx problem, never a 5xx, never a plan."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from autopar.rules.shapes import SHAPE_CHECKS

    checked = [i for i, op in enumerate(tiny_graph["ops"]) if op["type"] in SHAPE_CHECKS]
    seen: dict[str, int] = {}
    with keyed.client(headers={"X-API-Key": KEY_A}) as a:

        @given(data=st.data())
        @settings(
            max_examples=SHAPE_FUZZ_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def run(data: st.DataObject) -> None:
            graph = json.loads(json.dumps(tiny_graph))
            op = graph["ops"][data.draw(st.sampled_from(checked))]
            ports = {**op["inputs"], **op["outputs"]}
            tensor = graph["tensors"][ports[data.draw(st.sampled_from(sorted(ports)))]]
            if not tensor["shape"]:
                return
            dim = data.draw(st.integers(0, len(tensor["shape"]) - 1))
            tensor["shape"][dim] += 1_000_003
            r = a.post("/v1/plans", json=plan_body(graph, options={"time_limit_s": 1}))
            assert 400 <= r.status_code < 500, (op["type"], r.status_code, r.text[:300])
            assert r.headers["content-type"] == "application/problem+json"
            code = r.json()["code"]
            seen[code] = seen.get(code, 0) + 1

        run()
    assert seen.get("shape_mismatch", 0) > SHAPE_FUZZ_EXAMPLES // 2, seen


def test_a_hostile_body_is_refused_within_a_small_multiple_of_its_size(tiny_graph: dict[str, Any]) -> None:
    """Issue 34's 10 MB body (``attrs.junk = [7] * 5_000_000``) is refused by the scan: the
    parse's traced memory stays within twice the body (it was over 40 times)."""
    import tracemalloc

    from autopar_service.body import graph_object_budget, parse_json_model
    from autopar_service.problems import ApiError
    from autopar_service.requests import PlanBody
    from autopar_service.settings import Settings

    settings = Settings()
    graph = _mutated(tiny_graph, lambda g: g["ops"][5]["attrs"].update(junk=[7] * 5_000_000))
    raw = json.dumps(plan_body(graph), separators=(",", ":")).encode()
    del graph
    tracemalloc.start()
    try:
        with pytest.raises(ApiError) as err:
            parse_json_model(
                PlanBody,
                raw,
                settings.max_json_depth,
                graph_object_budget(settings),
                settings.max_graph_item_bytes,
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.status == 413 and err.value.code == "too_many_values"
    assert peak < 2 * len(raw), (peak, len(raw))
