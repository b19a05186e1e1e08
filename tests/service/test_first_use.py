"""Issue 24, items 8, 9, 10 and 14 against a real server (embedded cache, local solver processes).

* invalid graphs are 422 before any job (duplicate variables, ``axis: 1e308``, a zero-size or
  rank-0 tensor where the op's rule cannot take it);
* a graph re-encoded as JavaScript writes it (``1.0`` -> ``1``) has the same plan key, so the
  second request is a cache hit;
* the plan keeps the model's display name (record, summary, report title), not in the key;
* ``{"graph": "tiny-gpt"}`` names a bundled model.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from autopar.ir.plan import Plan
from tests.service.helpers import REPO, LiveServer, live_server, make_settings, plan_body, wait_job


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path_factory.mktemp("first-use"))) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def _as_javascript(text: str) -> str:
    """``JSON.stringify(JSON.parse(text))``: an integer-valued float loses its ``.0``."""
    return re.sub(r"(?<=[:\[,])(-?\d+)\.0(?=[,\]}])", r"\1", text)


def _post(client: httpx.Client, body: dict[str, Any] | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return client.post("/v1/plans", content=content, headers={"Content-Type": "application/json"})


def _solved(client: httpx.Client, response: httpx.Response) -> dict[str, Any]:
    assert response.status_code in (200, 202), response.text
    if response.status_code == 200:
        return dict(response.json())
    job = wait_job(client, response.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", job
    return dict(client.get(f"/v1/plans/{job['id']}").json())


def _copy(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data))


def _first(data: dict[str, Any], op_type: str) -> dict[str, Any]:
    return next(op for op in data["ops"] if op["type"] == op_type)


def _duplicate_variable(g: dict[str, Any]) -> None:
    g["variables"].append(dict(g["variables"][0]))


def _huge_axis(g: dict[str, Any]) -> None:
    _first(g, "gather")["attrs"]["axis"] = 1e308


def _zero_size(g: dict[str, Any]) -> None:
    g["tensors"][_first(g, "broadcast_matmul")["inputs"]["a_0"]]["shape"] = [0, 0, 0]


def _rank_0(g: dict[str, Any]) -> None:
    g["tensors"][_first(g, "broadcast_matmul")["inputs"]["a_0"]]["shape"] = []


@pytest.mark.parametrize(
    ("spoil", "code"),
    [
        (_duplicate_variable, "duplicate_variable"),
        (_huge_axis, "bad_attr"),
        (_zero_size, "bad_shape"),
        (_rank_0, "op_unsupported"),
    ],
)
def test_invalid_graphs_are_422_before_any_job(
    client: httpx.Client, tiny_graph: dict[str, Any], spoil: Any, code: str
) -> None:
    graph = _copy(tiny_graph)
    spoil(graph)
    r = _post(client, plan_body(graph))
    assert r.status_code == 422, r.text
    assert r.json()["code"] == code, r.json()
    assert r.headers["content-type"].startswith("application/problem+json")


def test_one_key_for_every_number_spelling_and_the_model_name(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    python_text = json.dumps(plan_body(tiny_graph), separators=(",", ":"))
    js_text = _as_javascript(python_text)
    assert ":1.0," in python_text and ":1.0," not in js_text
    first = _solved(client, _post(client, js_text))  # the page's encoding first
    again = _post(client, python_text)  # then the command line's / curl's
    assert again.status_code == 200, again.text  # a cache hit, no second solve
    assert again.json()["key"] == first["key"]
    by_name = _post(client, plan_body("tiny-gpt"))
    assert by_name.status_code == 200 and by_name.json()["key"] == first["key"]


def test_the_plan_keeps_the_models_display_name(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    record = _solved(client, _post(client, plan_body("tiny-gpt", zero_stage=1)))
    assert record["graph"]["name"] == "tiny-gpt" and record["plan"]["graph"]["name"] == "tiny-gpt"
    assert record["summary"].startswith("plan for tiny-gpt ")
    report = client.get(f"/v1/plans/{record['key']}/report")
    assert report.status_code == 200, report.text[:300]
    assert "<title>autopar plan report: tiny-gpt</title>" in report.text
    unnamed = _copy(tiny_graph)
    del unnamed["name"]  # named by content when the request names none ... and not part of the key
    assert _post(client, plan_body(unnamed, zero_stage=1)).json()["key"] == record["key"]


def test_an_unknown_model_name_is_422_with_a_suggestion(client: httpx.Client) -> None:
    r = _post(client, plan_body("tiny-gtp"))
    assert r.status_code == 422 and r.json()["code"] == "unknown_model"
    assert "did you mean 'tiny-gpt'" in r.json()["detail"]


# ------------------------------------------------------------------ issue 34, first use


def test_the_plan_record_carries_the_iteration_at_its_top_level(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    """One iteration figure: K micro-batches plus once per step, with recompute."""
    options = {"time_limit_s": 30, "micro_batches": 4, "checkpointing": "full"}
    record = _solved(client, _post(client, plan_body(tiny_graph, options=options)))
    plan = Plan.from_dict(record["plan"])
    assert record["iteration_time_s"] == pytest.approx(plan.iteration_time_s)
    assert record["iteration_time_s"] == pytest.approx(
        4 * record["micro_batch_time_s"] + record["once_per_step_s"]
    )
    # the independent evaluator prices the same iteration
    evaluated = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan_key": record["key"]})
    assert evaluated.status_code == 200, evaluated.text
    assert evaluated.json()["iteration_time_s"] == pytest.approx(record["iteration_time_s"], rel=1e-6)
    # the deprecated field is one micro-batch with its once-per-step work, well under K of them
    assert record["step_time_s"] < record["iteration_time_s"]
    figures = [line.split()[0] for line in record["summary"].splitlines()[1:] if line.strip()]
    assert figures[0] == "iteration"


def test_the_key_is_the_problem_not_the_time_limit(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    """The same request at 30 s and at 15 s is one key: the second is a cache hit, no job.
    Another K is another problem."""
    first = _solved(client, _post(client, plan_body(tiny_graph, options={"time_limit_s": 30})))
    assert first["solver"]["gap"] <= 0.01  # within the default gap asked
    again = _post(client, plan_body(tiny_graph, options={"time_limit_s": 15}))
    assert again.status_code == 200, again.text
    assert again.json()["key"] == first["key"]
    other = _post(client, plan_body(tiny_graph, options={"time_limit_s": 15, "micro_batches": 2}))
    assert other.status_code in (200, 202) and other.json().get("key", other.json().get("id")) != first["key"]


ONEFLOW_PYTHON = REPO / ".venv-oneflow" / "bin" / "python"


@pytest.mark.skipif(not ONEFLOW_PYTHON.exists(), reason="no OneFlow venv (scripts/oneflow-env.sh)")
def test_the_oneflow_example_requests_its_plan_from_the_service(
    server: LiveServer, client: httpx.Client, tmp_path: Any
) -> None:
    """``train_with_plan.py plan --server URL``: exports the job, asks the service, and writes
    the service's plan (the one it then applies); the model is named as the CLI names it."""
    site = subprocess.run(
        [str(ONEFLOW_PYTHON), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    libs = [f"{site}/nvidia/cudnn/lib", f"{site}/nvidia/cublas/lib", os.environ.get("LD_LIBRARY_PATH", "")]
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libs), "PYTHONPATH": str(REPO)}
    command = [
        str(ONEFLOW_PYTHON), str(REPO / "examples" / "oneflow" / "train_with_plan.py"), "plan",
        "--model", "tiny-gpt", "--mesh", "2", "--server", server.url, "--time-limit", "30",
        "--out", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, "\n".join((done.stdout + done.stderr).splitlines()[-30:])
    asked = re.search(r"/v1/plans/([0-9a-f]+): iteration", done.stdout)
    assert asked is not None, done.stdout
    record = client.get(f"/v1/plans/{asked.group(1)}").json()
    written = Plan.load(str(tmp_path / "plan.json"))
    stored = Plan.from_dict(record["plan"]).to_dict()
    # each answer shows its own request's name: the stored record has the service's
    # graph-{hash}, the example's answer the name its import gave the job
    assert written.graph_name != stored["graph"]["name"] and not written.graph_name.startswith("graph-")
    assert {**written.to_dict(), "graph": stored["graph"]} == stored
    assert written.mesh.shape == (2,) and written.graph_hash == record["graph"]["hash"]
