"""Issue 43's service cases, replayed against a real server (embedded backend, two keys).

1. integers out of range (5,001 digits, past 2**63) anywhere in a body, on every route that takes
   one: 4xx problem+json naming the field, never a 500;
2. progress streams are bounded per client and in all (429 ``too_many_streams``), and a closed
   stream gives its slot back;
4. a bundled model's name is kept for that model's content alone;
5. a shape attr its output does not have is refused naming the op and the attr; a refused body
   is freed at once (no collection needed); keyed answers are ``Cache-Control: private``.

The Redis side of 2 (a stream holds no thread) is in ``test_redis_issue43.py``; the client (7) in
``test_client_keys.py``; the isolation (3) is measured by ``benchmarks/service.py --isolation``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from autopar.models import build
from tests.service.helpers import LiveServer, live_server, make_settings, plan_body, wait_status
from tests.service.test_hostile import KEY_A, KEY_B

pytestmark = pytest.mark.timeout(300)

HUGE = "1" + "0" * 5000


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = make_settings(
        tmp_path_factory.mktemp("issue43"),
        api_keys=[KEY_A, KEY_B],
        local_workers=1,
        max_streams_per_client=3,
        max_streams=5,
    )
    with live_server(settings) as s:
        yield s


def _post(server: LiveServer, path: str, body: bytes, key: str = KEY_A) -> tuple[int, dict[str, Any]]:
    with server.client(headers={"X-API-Key": key, "Content-Type": "application/json"}) as c:
        r = c.post(path, content=body)
    return r.status_code, r.json()


# ---------------------------------------------------------------- 1. bounded integers


def _huge_bodies(tiny: dict[str, Any]) -> list[tuple[str, str, bytes]]:
    """(route, field named, body) with the 5,001-digit integer in each place a number sits."""
    small = json.dumps(tiny, separators=(",", ":"))
    in_attr = small.replace('"attrs":{', f'"attrs":{{"junk":{HUGE},', 1)
    in_shape = small.replace('"shape":[', f'"shape":[{HUGE},', 1)
    plan = {"format": "autopar.plan/v1", "zero_stage": 2}
    base = '"graph":"tiny-gpt","cluster":"1x2"'
    return [
        ("/v1/plans", "memory_budget_bytes", f'{{{base},"memory_budget_bytes":{HUGE}}}'.encode()),
        ("/v1/plans", "memory_budget_bytes", f'{{{base},"memory_budget_bytes":-{HUGE}}}'.encode()),
        ("/v1/plans", "seed", f'{{{base},"options":{{"seed":{HUGE}}}}}'.encode()),
        ("/v1/plans", "mesh_shape", f'{{{base},"mesh_shape":[2,{HUGE}]}}'.encode()),
        ("/v1/plans", "junk", f'{{"graph":{in_attr},"cluster":"1x2"}}'.encode()),
        ("/v1/plans", "shape", f'{{"graph":{in_shape},"cluster":"1x2"}}'.encode()),
        ("/v1/plans", "memory_budget_bytes", f'{{{base},"memory_budget_bytes":{"9" * 20}}}'.encode()),
        (
            "/v1/evaluate",
            "micro_batches",
            f'{{"graph":"tiny-gpt","plan_key":"{"a" * 64}","micro_batches":{HUGE}}}'.encode(),
        ),
        (
            "/v1/evaluate",
            "zero_stage",
            json.dumps({"graph": "tiny-gpt", "plan": plan}).replace("2}", HUGE + "}").encode(),
        ),
        ("/v1/evaluate", "junk", f'{{"graph":{in_attr},"plan_key":"{"a" * 64}"}}'.encode()),
        ("/v1/sweeps", "memory_budgets_bytes", f'{{{base},"memory_budgets_bytes":[{HUGE}]}}'.encode()),
        ("/v1/sweeps", "zero_stages", f'{{{base},"zero_stages":[2,{HUGE}]}}'.encode()),
        ("/v1/sweeps", "shape", f'{{"graph":{in_shape},"cluster":"1x2"}}'.encode()),
    ]


def test_every_route_that_takes_a_body_is_covered(keyed: LiveServer) -> None:
    with_bodies = {
        path
        for path, operations in keyed.app.openapi()["paths"].items()
        for operation in operations.values()
        if "requestBody" in operation
    }
    assert with_bodies == {route for route, _, _ in _huge_bodies(build("tiny-gpt").to_dict())}


def test_integers_out_of_range_are_4xx_naming_the_field(
    keyed: LiveServer, tiny_graph: dict[str, Any]
) -> None:
    for route, field, body in _huge_bodies(tiny_graph):
        status, problem = _post(keyed, route, body)
        assert status == 422, (route, field, status, problem)
        assert problem["code"] == "number_too_large", (route, field, problem)
        assert problem["field"] == field and f"'{field}'" in problem["detail"], (route, problem)
        assert "2**63" in problem["detail"]
    with keyed.client(headers={"X-API-Key": KEY_A}) as a:  # query parameters and headers too
        assert a.get(f"/v1/jobs/{'a' * 64}", params={"wait": "1", "since": HUGE}).status_code == 422
        assert a.get(f"/v1/jobs/{'a' * 64}", params={"wait": HUGE}).status_code == 422
        assert a.get("/metrics").text.count('status="500"') == 0


def test_a_huge_content_length_is_413_not_500(keyed: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=60) as sock:
        sock.sendall(
            f"POST /v1/plans HTTP/1.1\r\nHost: t\r\nX-API-Key: {KEY_A}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {'9' * 40}\r\n\r\n{{}}".encode()
        )
        head = sock.recv(4096).decode("latin-1")
    status = int(head.split(" ", 2)[1])
    assert 400 <= status < 500, head


# ---------------------------------------------------------------- 2. bounded streams


def _open_stream(server: LiveServer, job: str, key: str) -> tuple[socket.socket | None, int]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(f"GET /v1/jobs/{job}/events HTTP/1.1\r\nHost: t\r\nX-API-Key: {key}\r\n\r\n".encode())
    head = sock.recv(4096).decode("latin-1")
    status = int(head.split(" ", 2)[1])
    if status != 200:
        sock.close()
        return None, status
    return sock, status


def _streams(server: LiveServer) -> dict[str, int]:
    return dict(server.app.state.service.streams.open)


@contextlib.contextmanager
def _stopped_job(server: LiveServer, tiny_graph: dict[str, Any]) -> Iterator[str]:
    """A job that stays unfinished: its solver process group is stopped (SIGSTOP) meanwhile."""
    slow = plan_body(
        tiny_graph, cluster="1x8", mesh_shape=[2, 2, 2], options={"time_limit_s": 60, "seed": 43}
    )
    with server.client(headers={"X-API-Key": KEY_A}) as a:
        job = a.post("/v1/plans", json=slow).json()["id"]
        jobs = server.app.state.service.jobs
        deadline = time.monotonic() + 120
        while jobs.pid(job) is None or os.getpgid(jobs.pid(job)) != jobs.pid(job):  # its own group
            assert time.monotonic() < deadline, "the solve did not start"
            time.sleep(0.01)
        pid = jobs.pid(job)
        os.killpg(pid, signal.SIGSTOP)
        try:
            yield job
        finally:
            os.killpg(pid, signal.SIGCONT)
            a.delete(f"/v1/jobs/{job}")


def test_streams_are_bounded_per_client_and_in_all(keyed: LiveServer, tiny_graph: dict[str, Any]) -> None:
    with keyed.client(headers={"X-API-Key": KEY_A}) as a, _stopped_job(keyed, tiny_graph) as job:
        held: list[socket.socket] = []
        try:
            for _ in range(3):
                sock, status = _open_stream(keyed, job, KEY_A)
                assert sock is not None, status
                held.append(sock)
            _, status = _open_stream(keyed, job, KEY_A)  # A's fourth: its own bound
            assert status == 429
            r = a.get(f"/v1/jobs/{job}/events")
            assert (
                r.status_code == 429 and r.json()["code"] == "too_many_streams" and r.headers["Retry-After"]
            )
            for _ in range(2):  # B may still follow it, up to the server's bound of 5
                sock, status = _open_stream(keyed, job, KEY_B)
                assert sock is not None, status
                held.append(sock)
            _, status = _open_stream(keyed, job, KEY_B)
            assert status == 429
            assert sum(_streams(keyed).values()) == 5
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 60  # a closed stream gives its slot back (at its next write)
        while _streams(keyed):
            assert time.monotonic() < deadline, _streams(keyed)
            time.sleep(0.1)
        sock, status = _open_stream(keyed, job, KEY_A)
        assert sock is not None, status
        sock.close()


# ---------------------------------------------------------------- 4. bundled names


def test_a_bundled_name_is_kept_only_for_that_models_content(
    keyed: LiveServer, tiny_graph: dict[str, Any]
) -> None:
    """The issue's case: k1 posts tiny-gpt's content named mt5-base; k2 asks for tiny-gpt by
    name: k2 gets a record titled tiny-gpt.  Content of no bundled model named mt5-base is
    stored as graph-{hash}, and its poster is not shown mt5-base either."""
    request = {"cluster": "1x2", "mesh_shape": [2], "options": {"time_limit_s": 20}}
    with keyed.client(headers={"X-API-Key": KEY_A}) as a, keyed.client(headers={"X-API-Key": KEY_B}) as b:
        first = a.post("/v1/plans", json={**request, "graph": {**tiny_graph, "name": "mt5-base"}})
        key = first.json().get("id") or first.json()["key"]
        wait_status(a, key, {"succeeded"}, timeout_s=240)
        record = b.post("/v1/plans", json={**request, "graph": "tiny-gpt"}).json()
        assert record["key"] == key and record["graph"]["name"] == "tiny-gpt"
        assert record["summary"].startswith("plan for tiny-gpt (") and "mt5-base" not in json.dumps(record)
        page = b.get(f"/v1/plans/{key}/report").text
        assert "tiny-gpt" in page and "mt5-base" not in page
        other = copy.deepcopy(tiny_graph)
        other["ops"][5].setdefault("attrs", {})["note"] = "not tiny-gpt"
        posted = a.post("/v1/plans", json={**request, "graph": {**other, "name": "mt5-base"}})
        other_key = posted.json().get("id") or posted.json()["key"]
        wait_status(a, other_key, {"succeeded"}, timeout_s=240)
        for answer in (
            a.get(f"/v1/plans/{other_key}").json(),
            a.post("/v1/plans", json={**request, "graph": {**other, "name": "mt5-base"}}).json(),
        ):
            assert answer["graph"]["name"] == f"graph-{answer['graph']['hash'][:12]}"
            assert "mt5-base" not in json.dumps(answer)
        assert (
            a.get(f"/v1/plans/{other_key}", params={"name": "mt5-base"})
            .json()["graph"]["name"]
            .startswith("graph-")
        )


# ---------------------------------------------------------------- 5. the low ones


def test_a_shape_attr_its_output_lacks_is_refused(keyed: LiveServer, tiny_graph: dict[str, Any]) -> None:
    graph = copy.deepcopy(tiny_graph)
    reshape = next(op for op in graph["ops"] if op["type"] == "reshape")
    reshape["attrs"]["shape"] = [*reshape["attrs"]["shape"][:-1], reshape["attrs"]["shape"][-1] + 1]
    for route, body in (("/v1/plans", plan_body(graph)), ("/v1/evaluate", {"graph": graph, "plan": {}})):
        status, problem = _post(keyed, route, json.dumps(body).encode())
        assert status == 422 and problem["code"] == "shape_mismatch", problem
        assert problem["op"] == reshape["name"] and problem["attr"] == "shape"
        assert reshape["name"] in problem["detail"] and "attr 'shape'" in problem["detail"]


def test_keyed_answers_are_private(keyed: LiveServer, tiny_graph: dict[str, Any]) -> None:
    fill = {"{key}": "ab" * 32, "{job_id}": "ab" * 32, "{sweep_id}": "ab" * 32, "{name}": "tiny-gpt"}
    with keyed.client(headers={"X-API-Key": KEY_A}) as a:
        for path, operations in keyed.app.openapi()["paths"].items():
            if not path.startswith("/v1") or "get" not in operations or path.endswith("/events"):
                continue
            for hole, value in fill.items():
                path = path.replace(hole, value)
            r = a.get(path)
            control = r.headers.get("cache-control", "")
            assert "private" in control and "public" not in control, (path, r.status_code, control)
        graph = a.get("/v1/models/tiny-gpt/graph")
        assert graph.status_code == 200 and graph.headers["cache-control"].startswith("private")
        assert "private" in a.get("/metrics").headers["cache-control"]
        assert "public" in a.get("/ui/plotly.min.js").headers["cache-control"]  # the page's files are open


def test_a_refused_body_is_freed_at_once(keyed: LiveServer, tiny_graph: dict[str, Any]) -> None:
    """A refused 33 MB body leaves nothing behind in the API process, without a collection (it
    climbed by about 60 MiB per body until one ran)."""
    graph = copy.deepcopy(tiny_graph)
    graph["ops"][5]["attrs"]["junk"] = [7] * 16_500_000
    body = json.dumps(plan_body(graph), separators=(",", ":")).encode()
    del graph
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(2):
            status, problem = _post(keyed, "/v1/plans", body)
            assert status == 413 and problem["code"] == "too_many_values", problem
        # the server's thread may still be unwinding the second request when the client has its
        # answer (seen once under load: the whole body still held): look again, collecting nothing
        for _ in range(600):  # up to 30 s: a verdict about a leak, not about the machine's load
            after, peak = tracemalloc.get_traced_memory()
            if after - before < len(body) // 4:
                break
            time.sleep(0.05)
    finally:
        tracemalloc.stop()
    assert peak - before > len(body)  # the body passed through this process ...
    assert after - before < len(body) // 4, (after - before, len(body))  # ... and was freed, uncollected


def test_the_api_freezes_what_it_built_at_start(tmp_path) -> None:
    """A full collection in the API walked every object its start built (the solver's modules, the
    app: 145,000 objects, 180 ms) and stalled every request meanwhile; they are frozen at start."""
    import gc

    before = gc.get_freeze_count()
    try:
        with live_server(make_settings(tmp_path, freeze_gc=True)):
            assert gc.get_freeze_count() > before + 10_000
    finally:
        gc.unfreeze()
