"""The per-op / per-edge / per-layer breakdown adds up to the evaluator's totals."""

from __future__ import annotations

import math

import pytest

from autopar.baselines import baseline_plan
from autopar.breakdown import TOP_LEVEL, breakdown, layer_of, memory_timeline, module_of
from autopar.cluster import Cluster, Mesh
from autopar.evaluate import evaluate
from autopar.models import build


@pytest.fixture(scope="module")
def graph():
    return build("tiny-mt5")


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("decoder.layers.1.mlp.wo.matmul", "decoder.layers.1"),
        ("layers.0.self_attn.q.weight.adam_update", "layers.0"),
        ("encoder.final_norm.weight.cast", "encoder.final_norm"),
        ("embedding.word", "embedding"),
        ("input_ids", TOP_LEVEL),
    ],
)
def test_layer_of(name: str, layer: str) -> None:
    assert layer_of(name) == layer


def test_module_of() -> None:
    assert module_of("encoder.layers.0.self_attn.q.weight") == "encoder.layers.0.self_attn.q"


@pytest.mark.parametrize("kind", ["megatron", "inferred", "data-parallel"])
@pytest.mark.parametrize("zero", [0, 2])
def test_parts_add_up_to_the_evaluation(graph, kind: str, zero: int) -> None:
    mesh = Mesh(Cluster.parse("2x4"), (4, 2))
    plan = baseline_plan(kind, graph, mesh, zero)
    ev = evaluate(graph, plan)
    parts = breakdown(graph, plan)
    assert math.isclose(sum(o.compute_s for o in parts.ops), ev.compute_time_s, rel_tol=1e-9)
    assert math.isclose(sum(e.time_s for e in parts.edges), ev.comm_time_s, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(sum(parts.comm_s.values()), ev.comm_time_s, rel_tol=1e-9, abs_tol=1e-15)
    for kind_name, t in ev.comm_time_s_per_collective.items():
        mine = sum(v for (c, _), v in parts.comm_s.items() if c == kind_name)
        assert math.isclose(mine, t, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(
        sum(parts.layer_compute_s.values()) + sum(parts.layer_comm_s.values()),
        ev.step_time_s,
        rel_tol=1e-9,
    )
    boxed = [e for e in parts.edges if not e.zero_gather]
    assert len(boxed) == ev.boxed_edges
    timeline = memory_timeline(graph, plan)
    assert len(timeline.activations) == len(graph.ops)
    assert math.isclose(timeline.peak, ev.memory.total, rel_tol=1e-9)


def test_zero2_gather_is_listed_and_edges_are_sorted(graph) -> None:
    mesh = Mesh(Cluster.parse("2x4"), (4, 2))
    parts = breakdown(graph, baseline_plan("megatron", graph, mesh, 2))
    gathers = [e for e in parts.edges if e.zero_gather]
    assert gathers, "ZeRO-2 gathers the updated parameters back over the data-parallel axis"
    assert all(e.producer == e.consumer and e.steps for e in gathers)
    top = parts.most_expensive_edges(10)
    assert len(top) == 10
    assert [e.time_s for e in top] == sorted((e.time_s for e in top), reverse=True)
    assert top[0].time_s == max(e.time_s for e in parts.edges)
    assert all(e.shape == tuple(graph.tensors[e.tensor].shape) for e in top)
