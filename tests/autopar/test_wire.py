"""The wire formats: strict pydantic validation, errors naming the field, round trips, schema files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.baselines.plans import baseline_plan
from autopar.cost.evaluate import attach_evaluation, evaluate
from autopar.errors import GraphError, PlanError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.wire import GRAPH_DOCUMENT, MAX_JSON_DEPTH, PlanModel, json_schemas
from autopar.models import MODEL_NAMES, build

REPO = Path(__file__).resolve().parents[2]


def tiny() -> dict:
    return build("tiny-gpt").to_dict()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_bundled_model_round_trips_through_the_models(name: str) -> None:
    graph = build(name, **({"layers": 2} if not name.startswith("tiny") else {}))
    text = graph.to_json()
    assert GRAPH_DOCUMENT.validate_json(text) == json.loads(text)
    again = Graph.from_json(text)
    assert again.to_dict() == graph.to_dict() and again.content_hash() == graph.content_hash()


def test_a_plan_round_trips_through_the_model() -> None:
    graph = build("tiny-t5")
    mesh = Mesh(Cluster.parse("1x4", "a100-40g"), (2, 2))
    plan = baseline_plan("megatron", graph, mesh, 2)
    attach_evaluation(plan, evaluate(graph, plan))
    data = json.loads(plan.to_json())
    model = PlanModel.model_validate(data)
    assert model.predicted["step_time_s"] == plan.step_time_s
    assert model.memory["per_device_bytes"] == plan.memory_per_device_bytes
    assert Plan.from_dict(data).to_dict() == plan.to_dict()


@pytest.mark.parametrize(
    ("edit", "code", "field"),
    [
        (lambda d: d["variables"][0].__setitem__("grad", ["x"]), "bad_format", "variables[0].grad"),
        (
            lambda d: d["variables"][0].__setitem__("optimizer", {"a": 1}),
            "bad_format",
            "variables[0].optimizer",
        ),
        (lambda d: d.__setitem__("meta", "hello"), "bad_format", "meta"),
        (lambda d: d["ops"][0].__setitem__("attrs", [1]), "bad_format", "ops[0].attrs"),
        (lambda d: d["ops"][1].__setitem__("inputs", {"x_0": 3}), "bad_format", "ops[1].inputs.x_0"),
        (lambda d: d.__setitem__("ops", {}), "bad_format", "ops"),
        (lambda d: d.__setitem__("extra", 1), "bad_format", "extra"),
        (lambda d: d.__setitem__("name", ""), "bad_format", "name"),
        (
            lambda d: next(iter(d["tensors"].values())).__setitem__("shape", [10**400]),
            "bad_shape",
            "shape[0]",
        ),
        (lambda d: next(iter(d["tensors"].values())).__setitem__("shape", [-1, 4]), "bad_shape", "shape[0]"),
        (lambda d: next(iter(d["tensors"].values())).__setitem__("shape", [True]), "bad_shape", "shape[0]"),
        (lambda d: next(iter(d["tensors"].values())).__setitem__("shape", [2.0]), "bad_shape", "shape[0]"),
        (lambda d: next(iter(d["tensors"].values())).__setitem__("shape", [1] * 17), "bad_shape", "shape"),
        (
            lambda d: next(iter(d["tensors"].values())).__setitem__("dtype", "float7"),
            "unknown_dtype",
            "float7",
        ),
        (lambda d: d["ops"][0].__setitem__("role", "sideways"), "bad_role", "ops[0].role"),
    ],
)
def test_wrong_types_name_the_field(edit, code: str, field: str) -> None:
    data = tiny()
    edit(data)
    with pytest.raises(GraphError) as info:
        Graph.from_dict(data)
    assert info.value.code == code and field in info.value.message, info.value.message
    with pytest.raises(GraphError) as again:  # the same answer from the JSON text
        Graph.from_json(json.dumps(data))
    assert again.value.code == code and field in again.value.message


def test_deep_nesting_is_refused() -> None:
    data = tiny()
    deep: list = []
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = [deep]
    data["meta"] = {"x": deep}
    with pytest.raises(GraphError, match="nested deeper than") as info:
        Graph.from_dict(data)
    assert "meta" in info.value.message


def test_absurd_nesting_in_json_text_is_a_graph_error() -> None:
    text = '{"format": "autopar.graph/v1", "tensors": {}, "ops": [], "meta": {"a": ' + "[" * 100_000
    text += "]" * 100_000 + "}}"
    with pytest.raises(GraphError) as info:
        Graph.from_json(text)
    assert info.value.code in ("bad_json", "bad_format")


def test_plan_fields_are_typed() -> None:
    graph = build("tiny-gpt")
    plan = baseline_plan("data-parallel", graph, Mesh(Cluster.parse("1x2", "a100-40g"), (2,)), 0)
    attach_evaluation(plan, evaluate(graph, plan))
    data = json.loads(plan.to_json())
    data["zero_stage"] = True
    with pytest.raises(PlanError, match="zero_stage"):
        Plan.from_dict(data)
    data = json.loads(plan.to_json())
    data["predicted"]["step_time_s"] = "fast"
    with pytest.raises(PlanError, match=r"predicted\.step_time_s"):
        Plan.from_dict(data)
    data = json.loads(plan.to_json())
    next(iter(data["ops"].values()))["inputs"] = {"in_0": "S(x)"}
    with pytest.raises(PlanError, match="ops"):
        Plan.from_dict(data)


def test_committed_schema_files_are_up_to_date() -> None:
    """``python -m autopar.ir.wire docs/schemas`` regenerates them."""
    for name, schema in json_schemas().items():
        path = REPO / "docs" / "schemas" / name
        assert path.exists(), f"run: python -m autopar.ir.wire docs/schemas ({name} missing)"
        committed = json.loads(path.read_text())
        assert committed == schema, f"{name} is stale: run python -m autopar.ir.wire docs/schemas"
