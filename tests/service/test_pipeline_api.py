"""``options.stages`` in the API: pipeline plans requested, cached, read back, evaluated and reported."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.models import build
from autopar_service.requests import SolverOptionsBody, build_request, key_dict_of
from autopar_service.settings import Settings
from tests.service.helpers import LiveServer, live_server, make_settings

# tiny-gpt (2 blocks) on 1x8 as 2 stages of [2, 2]: solves in a few seconds
PIPELINE = {"time_limit_s": 30, "micro_batches": 4, "checkpointing": "full", "stages": 2}


def _body(graph: Any, **options: Any) -> dict[str, Any]:
    return {"graph": graph, "cluster": "1x8", "mesh_shape": [2, 2], "options": {**PIPELINE, **options}}


def _key(mesh: list[int] | None, **options: Any) -> dict[str, Any]:
    request = build_request(
        build("tiny-gpt"), Cluster.parse("1x8"), mesh, None, 2, SolverOptionsBody(**options), Settings()
    )
    return key_dict_of(request)


def test_one_stage_keeps_its_key_and_stages_are_part_of_the_key() -> None:
    one = _key([4, 2], stages=1)
    assert "stages" not in one["options"] and "stage_mesh_shape" not in one
    assert _key([4, 2])["options"]["stages"] == "auto"  # the default, as autopar plan's
    two = _key([2, 2], stages=2)
    assert two["options"]["stages"] == 2 and two["stage_mesh_shape"] == [2, 2] and two["mesh_shape"] is None
    assert _key(None, stages=2) != two  # the stage mesh is searched: another problem
    auto = _key(None, stages="auto")
    assert auto["options"]["stages"] == "auto" and auto not in (one, two)


@pytest.mark.parametrize("stages", [0, -1, "2", True, 2.0, "AUTO", "pipeline", [2]])
def test_a_stages_value_of_the_wrong_type_or_range_is_refused(stages: object) -> None:
    with pytest.raises(ValidationError):
        SolverOptionsBody(stages=stages)


@pytest.mark.parametrize(
    ("mesh", "stages", "words"),
    [
        (None, 3, "do not divide 8 devices"),  # 8 devices in 3 stages
        (None, 4, "2 blocks"),  # tiny-gpt has 2 blocks
        ([4, 2], 2, "[4, 2]"),  # a stage has 4 devices, not 8
    ],
)
def test_stages_the_cluster_or_graph_cannot_cut_are_refused(
    mesh: list[int] | None, stages: int, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _key(mesh, stages=stages)
    assert caught.value.code == "bad_stages" and words in caught.value.message
    assert "options.stages" in caught.value.message


# ------------------------------------------------------------------ over HTTP


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path_factory.mktemp("pipeline"))) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def record(client: httpx.Client, tiny_graph: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/plans", params={"wait": 240}, json=_body(tiny_graph))
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_two_stage_plan_round_trips(
    client: httpx.Client, tiny_graph: dict[str, Any], record: dict[str, Any]
) -> None:
    plan = record["plan"]
    assert plan["format"] == "autopar.pipeline/v1" and plan["block_counts"] == [1, 1]
    assert record["num_stages"] == 2 and record["mesh_shape"] == [2, 2]
    assert record["request"]["options"]["stages"] == 2 and record["request"]["stage_mesh_shape"] == [2, 2]
    predicted = plan["predicted"]
    assert record["iteration_time_s"] == pytest.approx(predicted["iteration_time_s"])
    assert record["memory_per_device_bytes"] == pytest.approx(predicted["memory_per_device_bytes"])
    assert record["bubble_fraction"] == pytest.approx(predicted["bubble_fraction"])
    assert record["stages"] == predicted["stages"]
    rows = record["stages"]
    assert [r["stage"] for r in rows] == [0, 1]
    spans = [(r["first_block"], r["last_block"]) for r in rows]
    assert spans == [("layers.0", "layers.0"), ("layers.1", "layers.1")]
    assert all(r["devices"] == 4 and r["mesh_shape"] == [2, 2] for r in rows)
    assert [r["in_flight"] for r in rows] == [2, 1]  # min(S - s, K)
    # the iteration's parts: the slowest stage's micro-batch, the largest once-per-step work
    assert record["micro_batch_time_s"] == pytest.approx(max(r["micro_batch_time_s"] for r in rows))
    assert record["once_per_step_s"] == pytest.approx(max(r["once_per_step_time_s"] for r in rows))
    k = 4
    assert record["iteration_time_s"] == pytest.approx(
        sum(r["micro_batch_time_s"] for r in rows)
        + (k - 1) * record["micro_batch_time_s"]
        + record["once_per_step_s"]
    )
    assert "2 stages" in record["summary"] and "stage 1" in record["summary"]
    assert record["solver"]["time_limit_s"] == 30

    # the same request is the cached plan; GET reads it back
    again = client.post("/v1/plans", json=_body(tiny_graph))
    assert again.status_code == 200 and again.json()["key"] == record["key"], again.text
    got = client.get(f"/v1/plans/{record['key']}")
    assert got.status_code == 200 and got.json()["plan"] == plan

    # one stage on the same cluster is another plan (its key as before stages existed)
    one = client.post(
        "/v1/plans", json={**_body(tiny_graph), "mesh_shape": [4, 2], "options": {"time_limit_s": 5}}
    )
    assert one.status_code in (200, 202), one.text
    one_key = one.json().get("id") or one.json()["key"]
    assert one_key != record["key"]
    client.delete(f"/v1/jobs/{one_key}")


def test_the_job_result_names_the_stages(client: httpx.Client, record: dict[str, Any]) -> None:
    job = client.get(f"/v1/jobs/{record['key']}").json()
    assert job["status"] == "succeeded", job
    assert job["result"]["num_stages"] == 2 and job["result"]["mesh_shape"] == [2, 2]
    assert job["result"]["iteration_time_s"] == pytest.approx(record["iteration_time_s"])


def test_evaluate_re_checks_a_pipeline_plan(
    client: httpx.Client, tiny_graph: dict[str, Any], record: dict[str, Any]
) -> None:
    r = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan_key": record["key"]})
    assert r.status_code == 200, r.text
    ev = r.json()
    assert ev["valid"] and ev["num_stages"] == 2 and (ev["micro_batches"], ev["checkpointing"]) == (4, "full")
    assert ev["iteration_time_s"] == pytest.approx(record["iteration_time_s"])
    assert [s["in_flight"] for s in ev["stages"]] == [2, 1]
    eight = client.post(
        "/v1/evaluate", json={"graph": tiny_graph, "plan": record["plan"], "micro_batches": 8}
    ).json()
    assert eight["micro_batches"] == 8 and eight["iteration_time_s"] > ev["iteration_time_s"]
    assert [s["in_flight"] for s in eight["stages"]] == [2, 1]
    other = build("tiny-gpt", layers=1).to_dict()
    mismatch = client.post("/v1/evaluate", json={"graph": other, "plan": record["plan"]})
    assert mismatch.status_code == 422 and mismatch.json()["code"] == "plan_graph_mismatch", mismatch.text


def test_the_report_shows_the_stages(client: httpx.Client, record: dict[str, Any]) -> None:
    r = client.get(f"/v1/plans/{record['key']}/report", params=[("compare", "megatron")])
    assert r.status_code == 200, r.text[:500]
    page = r.text
    assert "pipeline plan report" in page and "<b>2 pipeline stages</b>" in page
    table = page[page.index("id='stages-table'") :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 3  # the head and two stages
    for text in ("layers.0", "layers.1", "[2, 2]", "micro-batches in flight", "receives"):
        assert text in table, text
    headline = page[page.index('id="headline"') : page.index('id="stages"')]
    assert "bubble" in headline and "megatron" in headline and "1F1B" in headline


@pytest.mark.parametrize(
    ("options", "code", "words"),
    [
        ({"stages": 0}, "invalid_request", "stages"),
        ({"stages": "2"}, "invalid_request", "stages"),
        ({"stages": True}, "invalid_request", "stages"),
        ({"stages": "all"}, "invalid_request", "stages"),
        ({"stages": 3}, "bad_stages", "do not divide"),
        ({"stages": 8}, "bad_stages", "2 blocks"),
    ],
)
def test_a_bad_stages_value_is_a_422_naming_it(
    client: httpx.Client, tiny_graph: dict[str, Any], options: dict[str, Any], code: str, words: str
) -> None:
    body = _body(tiny_graph, **options)
    body["mesh_shape"] = None
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert problem["code"] == code and words in problem["detail"], problem


def test_a_sweep_refuses_stages(client: httpx.Client, tiny_graph: dict[str, Any]) -> None:
    body = {"graph": tiny_graph, "cluster": "1x8", "mesh_shapes": [[2, 2]], "options": {"stages": 2}}
    r = client.post("/v1/sweeps", json=body)
    assert r.status_code == 422 and r.json()["code"] == "stages_not_supported", r.text


def test_the_openapi_schema_describes_stages(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    options = schema["SolverOptionsBody"]["properties"]["stages"]
    assert "auto" in str(options) and "integer" in str(options)
    record = schema["PlanRecordView"]["properties"]
    assert {"num_stages", "bubble_fraction", "stages"} <= set(record)
    assert "in_flight" in schema["StageRow"]["properties"]


def test_auto_stages_plans_and_records_the_stage_search(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    # on two nodes: auto on one node plans one stage (docs/pipeline.md)
    body = {**_body(tiny_graph, stages="auto", time_limit_s=20), "mesh_shape": None, "cluster": "2x4"}
    r = client.post("/v1/plans", params={"wait": 240}, json=body)
    assert r.status_code == 200, r.text
    record = r.json()
    assert record["request"]["options"]["stages"] == "auto"
    plan = record["plan"]
    rows = plan["diagnostics"]["stage_search"]  # every number of stages tried, with its figures
    assert [row["stages"] for row in rows] == [1, 2]
    best = min((row for row in rows if "iteration_time_s" in row), key=lambda row: row["iteration_time_s"])
    assert record["iteration_time_s"] == pytest.approx(best["iteration_time_s"])
    if best["stages"] == 1:
        assert plan["format"] == "autopar.plan/v1" and "num_stages" not in record
    else:
        assert plan["format"] == "autopar.pipeline/v1" and record["num_stages"] == best["stages"]


@pytest.mark.parametrize(("text", "sent"), [("2", 2), ("auto", None), (" AUTO ", None)])
def test_submit_reads_stages_as_plan_does(text: str, sent: int | None) -> None:
    from autopar_service.cli import _parse_stages

    assert _parse_stages(text) == sent


@pytest.mark.parametrize("text", ["0", "-1", "two", "2.5", ""])
def test_submit_refuses_a_bad_stages_value(text: str) -> None:
    from autopar_service.cli import _parse_stages

    with pytest.raises(ConfigError) as caught:
        _parse_stages(text)
    assert caught.value.code == "bad_stages"


@pytest.mark.redis
def test_an_rq_worker_plans_stages(redis_server: Any, tmp_path: Any, tiny_graph: dict[str, Any]) -> None:
    """The same request through Redis and an ``autopar worker`` process: the payload carries the
    stage mesh, the worker's key matches the API's, the record is the pipeline's."""
    import redis

    from tests.service.helpers import WorkerProcess

    redis.Redis.from_url(redis_server.url).flushall()
    worker = WorkerProcess(redis_server.url, "pipeline-worker")
    try:
        with live_server(make_settings(tmp_path, redis_url=redis_server.url)) as s:
            r = httpx.post(f"{s.url}/v1/plans", params={"wait": 240}, json=_body(tiny_graph), timeout=300)
        assert r.status_code == 200, r.text
        record = r.json()
    finally:
        worker.stop()
    assert record["num_stages"] == 2 and record["plan"]["format"] == "autopar.pipeline/v1"
    assert [row["in_flight"] for row in record["stages"]] == [2, 1]
