"""schemathesis against the live OpenAPI spec: no 5xx, every response matches the schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.service.helpers import LiveServer, live_server, make_settings

API_KEY = "test-key-123"
EXAMPLES = 12


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = make_settings(
        Path(tmp_path_factory.mktemp("openapi")),
        api_keys=[API_KEY],
        local_workers=1,
        default_time_limit_s=5.0,  # the limit covers cost tables too: room for a loaded CI machine
        max_time_limit_s=10.0,
        max_devices=8,
        max_body_bytes=256 * 1024,
        max_compressed_body_bytes=256 * 1024,
    )
    with live_server(settings) as server:
        yield server


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_conforms(api: LiveServer, mode: GenerationMode) -> None:
    """Every operation, generated inputs: no 5xx and every response matches the live schema."""
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    failures: dict[str, str] = {}
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis.settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        def run(case) -> None:
            nonlocal calls
            calls += 1
            # A schema-valid body may still be an invalid graph (422): the schema cannot
            # express graph validity, so positive_data_acceptance does not apply.
            case.call_and_validate(
                base_url=api.url,
                headers={"X-API-Key": API_KEY},
                excluded_checks=[positive_data_acceptance],
                timeout=30,
            )

        try:
            run()
        except hypothesis.errors.Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # nothing to get wrong (no parameters)
        except Exception as exc:  # collect every operation's failure, then report them all
            failures[operation.label] = f"{type(exc).__name__}: {exc}"[:2000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert calls >= 5 * EXAMPLES


def test_spec_documents_every_route(api: LiveServer) -> None:
    import httpx

    spec = httpx.get(f"{api.url}/openapi.json").json()
    paths = spec["paths"]
    for path in (
        "/v1/plans",
        "/v1/plans/{key}",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/events",
        "/v1/evaluate",
        "/v1/sweeps",
        "/v1/sweeps/{sweep_id}",
        "/livez",
        "/readyz",
        "/metrics",
    ):
        assert path in paths, path
    plan_post = paths["/v1/plans"]["post"]
    assert set(plan_post["responses"]) >= {"200", "202", "401", "413", "415", "422", "503"}
    assert plan_post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/PlanBody")
    assert "PlanBody" in spec["components"]["schemas"]
    assert spec["components"]["securitySchemes"]["APIKeyHeader"]["name"] == "X-API-Key"


def test_success_paths_conform(api: LiveServer, tiny_graph) -> None:
    """The 202 / 200 answers of a real solve, checked against the schema too."""
    import time

    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    headers = {"X-API-Key": API_KEY}

    def call(label: str, **kw):
        operation = schema.find_operation_by_label(label)
        assert operation is not None, label
        return operation.Case(headers=headers, **kw).call_and_validate(
            base_url=api.url, excluded_checks=[positive_data_acceptance], timeout=60
        )

    body = {
        "graph": tiny_graph,
        "cluster": "1x2",
        "mesh_shape": [2],
        "options": {"time_limit_s": 10},
    }
    first = call("POST /v1/plans", body=body)
    assert first.status_code == 202
    key = first.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        job = call("GET /v1/jobs/{job_id}", path_parameters={"job_id": key}, query={"wait": 5})
        if job.json()["status"] not in ("queued", "running"):
            break
        assert time.monotonic() < deadline
    assert job.json()["status"] == "succeeded"
    assert call("POST /v1/plans", body=body).status_code == 200
    assert call("GET /v1/plans/{key}", path_parameters={"key": key}).status_code == 200
    ev = call("POST /v1/evaluate", body={"graph": tiny_graph, "plan_key": key})
    assert ev.status_code == 200 and ev.json()["valid"] is True
    sweep = call(
        "POST /v1/sweeps",
        body={**{k: v for k, v in body.items() if k != "mesh_shape"}, "mesh_shapes": [[2]]},
        query={"wait": 30},
    )
    assert sweep.status_code == 200
    sweep_id = sweep.json()["id"]
    assert call("GET /v1/sweeps/{sweep_id}", path_parameters={"sweep_id": sweep_id}).status_code == 200
    done = call("DELETE /v1/jobs/{job_id}", path_parameters={"job_id": key})
    assert done.status_code == 409
