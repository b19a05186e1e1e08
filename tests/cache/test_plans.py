"""Plan keys and the plan cache (only a cheaper plan replaces a stored one)."""

from __future__ import annotations

import copy
import json

import pytest

from autopar.hardware.cluster import Cluster
from autopar.ir.graph import Graph
from autopar.models import build
from autopar_cache.base import Store
from autopar_cache.plans import PlanCache, code_versions, plan_key
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build("tiny-gpt")


def key_of(graph: Graph, versions: dict[str, str] | None = None, **fields) -> str:
    request = PlanRequest(
        graph,
        fields.pop("cluster", Cluster.parse("1x4")),
        fields.pop("mesh_shape", (2, 2)),
        fields.pop("memory_budget_bytes", 30 * 2**30),
        fields.pop("zero_stage", 2),
        fields.pop("options", SolverOptions(time_limit_s=5, workers=1)),
    )
    return plan_key(request.to_key_dict(), versions or {"autopar": "x", "ortools": "y"})


def test_key_ignores_op_order_and_whitespace(graph: Graph) -> None:
    data = graph.to_dict()
    shuffled = copy.deepcopy(data)
    shuffled["ops"] = list(reversed(shuffled["ops"]))
    reparsed = Graph.from_json(json.dumps(shuffled, indent=2))
    assert key_of(reparsed) == key_of(graph)


@pytest.mark.parametrize(
    "change",
    [
        {"mesh_shape": (4,)},
        {"memory_budget_bytes": 20 * 2**30},
        {"zero_stage": 1},
        {"cluster": Cluster.parse("1x4", "h100-80g")},
        {"options": SolverOptions(time_limit_s=6, workers=1)},
        {"options": SolverOptions(time_limit_s=5, workers=1, relative_gap=0.0)},
    ],
)
def test_key_changes_with_what_changes_the_plan(graph: Graph, change: dict) -> None:
    assert key_of(graph, **change) != key_of(graph)


def test_key_changes_with_code_versions(graph: Graph) -> None:
    assert key_of(graph, {"autopar": "x", "ortools": "z"}) != key_of(graph)
    assert key_of(graph, {"autopar": "x", "ortools": "y"}) == key_of(graph)


def test_key_changes_with_the_graph() -> None:
    assert key_of(build("tiny-gpt", layers=3)) != key_of(build("tiny-gpt", layers=2))


def test_code_versions() -> None:
    versions = code_versions()
    assert set(versions) == {"autopar", "source", "ortools"}
    assert len(versions["source"]) == 16
    assert versions == code_versions()  # deterministic


def test_plan_cache_keeps_the_cheapest(store: Store) -> None:
    cache = PlanCache(store, ttl_s=60)
    key = "k" * 64
    assert cache.get(key) is None
    assert cache.put(key, {"key": key, "step_time_s": 2.0}, 2.0)
    first = cache.get(key)
    assert first is not None and first.data()["step_time_s"] == 2.0
    assert not cache.put(key, {"key": key, "step_time_s": 3.0}, 3.0)
    assert cache.get(key).data()["step_time_s"] == 2.0
    assert cache.put(key, {"key": key, "step_time_s": 1.0}, 1.0)
    second = cache.get(key)
    assert second.data()["step_time_s"] == 1.0
    assert second.etag != first.etag  # the ETag follows the content
    cache.delete(key)
    assert cache.get(key) is None
    assert cache.put(key, {"key": key, "step_time_s": 9.0}, 9.0)


def test_plan_record_is_compressed_json(store: Store) -> None:
    cache = PlanCache(store)
    record = {"key": "a", "plan": {"ops": {f"op{i}": "(S(0), B) -> S(0)" for i in range(2000)}}}
    cache.put("a", record, 1.0)
    raw = store.get("plan:a")
    assert raw is not None and raw[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert len(raw) < len(json.dumps(record)) / 5
    assert json.loads(cache.get("a").body) == record
