"""``options.micro_batches`` and ``options.checkpointing`` in the API's requests and plan key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from autopar.baselines.plans import baseline_plan
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.models import build
from autopar_service.requests import SolverOptionsBody, build_request, key_dict_of
from autopar_service.settings import Settings
from tests.service.helpers import LiveServer, live_server, make_settings, plan_body


def _key(**options: object) -> dict[str, object]:
    request = build_request(
        build("tiny-gpt"), Cluster.parse("1x4"), [2, 2], None, 2, SolverOptionsBody(**options), Settings()
    )
    return key_dict_of(request)


def test_the_iteration_is_part_of_the_plan_key() -> None:
    """K = 1 without checkpointing keeps the key it had before those options; the default
    checkpointing is ``auto`` (as autopar plan's), its own key."""
    off = _key(micro_batches=1, checkpointing="off")
    assert "micro_batches" not in off["options"] and "checkpointing" not in off["options"]
    default = _key()
    assert default["options"]["checkpointing"] == "auto" and default == _key(checkpointing="auto")
    eight = _key(micro_batches=8)
    assert eight != default and eight["options"]["micro_batches"] == 8
    assert _key(micro_batches=8, checkpointing="full") != eight


@pytest.mark.parametrize("options", [{"micro_batches": 0}, {"micro_batches": "8"}, {"checkpointing": "some"}])
def test_bad_iteration_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SolverOptionsBody(**options)


# ------------------------------------------------------------------ over HTTP


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path_factory.mktemp("iteration"))) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def dp_plan() -> dict[str, Any]:
    """The data-parallel baseline of tiny-gpt on 1x4: a plan to evaluate without a solve."""
    graph = build("tiny-gpt")
    return baseline_plan("data-parallel", graph, Mesh(Cluster.parse("1x4"), (4,)), 2).to_dict()


def test_two_requests_differing_only_in_k_or_checkpointing_get_two_keys(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    ids = []
    for options in ({}, {"micro_batches": 4}, {"micro_batches": 4, "checkpointing": "full"}):
        body = plan_body(tiny_graph, options={"time_limit_s": 5, **options})
        r = client.post("/v1/plans", json=body)
        assert r.status_code in (200, 202), r.text
        ids.append(r.json().get("id") or r.json()["key"])
    assert len(set(ids)) == 3, ids
    for key in ids:  # the solves are not what this test is about
        client.delete(f"/v1/jobs/{key}")


def test_auto_checkpointing_is_accepted_as_its_own_key(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    body = plan_body(tiny_graph, options={"time_limit_s": 5, "checkpointing": "auto"})
    r = client.post("/v1/plans", json=body)
    assert r.status_code in (200, 202), r.text
    client.delete(f"/v1/jobs/{r.json().get('id') or r.json()['key']}")  # the solve is not the point
    assert _key(checkpointing="auto") not in (_key(checkpointing="off"), _key(checkpointing="full"))


def test_evaluate_re_prices_a_plan_at_another_iteration(
    client: httpx.Client, tiny_graph: dict[str, Any], dp_plan: dict[str, Any]
) -> None:
    def evaluate(**extra: object) -> dict[str, Any]:
        r = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan": dp_plan, **extra})
        assert r.status_code == 200, r.text
        return dict(r.json())

    own = evaluate()  # the plan's own: one micro-batch, nothing recomputed
    assert (own["micro_batches"], own["checkpointing"]) == (1, "off")
    assert own["iteration_time_s"] == pytest.approx(own["step_time_s"])
    eight = evaluate(micro_batches=8)
    assert (eight["micro_batches"], eight["checkpointing"]) == (8, "off")
    assert eight["iteration_time_s"] == pytest.approx(
        8 * eight["micro_batch_time_s"] + eight["once_per_step_time_s"]
    )
    assert eight["iteration_time_s"] > 4 * own["iteration_time_s"]
    assert eight["step_time_s"] == pytest.approx(own["step_time_s"])
    full = evaluate(micro_batches=8, checkpointing="full")  # recompute: more time per micro-batch
    assert full["checkpointing"] == "full" and full["iteration_time_s"] > eight["iteration_time_s"]
    at_k = {**dp_plan, "micro_batches": 8}  # a plan made for K = 8 is priced at its K by default
    r = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan": at_k})
    assert r.status_code == 200 and r.json()["iteration_time_s"] == pytest.approx(eight["iteration_time_s"])
    # auto re-prices the blocks an auto plan recorded: this plan records none
    auto = evaluate(micro_batches=8, checkpointing="auto")
    assert auto["checkpointing"] == "auto" and auto["iteration_time_s"] == pytest.approx(
        eight["iteration_time_s"]
    )


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"micro_batches": 0}, "invalid_request"),
        ({"checkpointing": "some"}, "invalid_request"),
    ],
)
def test_evaluate_refuses_a_bad_iteration(
    client: httpx.Client,
    tiny_graph: dict[str, Any],
    dp_plan: dict[str, Any],
    extra: dict[str, Any],
    code: str,
) -> None:
    r = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan": dp_plan, **extra})
    assert r.status_code == 422 and r.json()["code"] == code, r.text


def test_evaluate_refuses_a_plan_made_for_another_graph(
    client: httpx.Client, dp_plan: dict[str, Any]
) -> None:
    other = build("tiny-gpt", layers=1).to_dict()  # another graph, every op of it in the plan
    r = client.post("/v1/evaluate", json={"graph": other, "plan": dp_plan})
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["code"] == "plan_graph_mismatch" and problem["plan_graph_hash"] == dp_plan["graph"]["hash"]
    assert "POST /v1/plans" in problem["detail"]


def test_a_sweep_carries_the_iteration_and_shows_its_time(
    client: httpx.Client, tiny_graph: dict[str, Any]
) -> None:
    body = {
        "graph": tiny_graph,
        "cluster": "1x2",
        "mesh_shapes": [[2]],
        "zero_stages": [2],
        "options": {"time_limit_s": 20, "micro_batches": 4, "checkpointing": "full"},
    }
    r = client.post("/v1/sweeps", params={"wait": 120}, json=body)
    assert r.status_code == 200, r.text
    view = r.json()
    (row,) = view["rows"]
    assert row["status"] == "succeeded", row
    assert (row["micro_batches"], row["checkpointing"]) == (4, "full")
    assert row["iteration_time_s"] > row["step_time_s"] > 0  # four micro-batches, not one
    assert "iter ms" in view["table"] and " 4  full" in view["table"]
    plan = client.get(row["links"]["plan"]).json()["plan"]
    assert (plan["micro_batches"], plan["checkpointing"]) == (4, "full")
    # the sweep's key is the plan request's key: the same point planned alone is the cached plan
    alone = client.post("/v1/plans", json=plan_body(tiny_graph, options=body["options"], zero_stage=2))
    assert alone.status_code == 200 and alone.json()["key"] == row["key"], alone.text
    again = client.post("/v1/evaluate", json={"graph": tiny_graph, "plan_key": row["key"]})
    assert again.status_code == 200 and again.json()["iteration_time_s"] == pytest.approx(
        row["iteration_time_s"]
    )
