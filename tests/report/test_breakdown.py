"""The per-op / per-edge / per-layer breakdown is the evaluator's own records, grouped."""

from __future__ import annotations

import functools
import math

import pytest

from autopar.cost.breakdown import TOP_LEVEL, PricingMemo, breakdown, layer_of, memory_timeline, module_of
from autopar.cost.evaluate import evaluate
from autopar.ir.sbp import S, Signature, nd
from tests.report import plans
from tests.report.plans import model


@pytest.fixture(scope="module")
def graph():
    return model("tiny-gpt")


def baseline(kind: str, zero: int):
    return plans.baseline("tiny-gpt", kind, zero)


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("decoder.layers.1.mlp.wo.matmul", "decoder.layers.1"),
        ("layers.0.self_attn.q.weight.adam_update", "layers.0"),
        ("encoder.final_norm.weight.cast", "encoder"),
        ("shared.weight", "shared"),
        ("embedding.word", "embedding"),
        ("input_ids", TOP_LEVEL),
        ("model.h.0-add_n-40", "model.h.0"),  # OneFlow's <scope>-<type>-<id>
    ],
)
def test_layer_of(name: str, layer: str) -> None:
    assert layer_of(name) == layer


def test_module_of() -> None:
    assert module_of("encoder.layers.0.self_attn.q.weight") == "encoder.layers.0.self_attn.q"


@pytest.mark.parametrize(
    ("kind", "zero"), [("megatron", 2), ("inferred", 2), ("data-parallel", 0), ("megatron", 3)]
)
def test_parts_are_the_evaluations_records(graph, kind: str, zero: int) -> None:
    plan = baseline(kind, zero)
    ev = evaluate(graph, plan)
    parts = breakdown(graph, plan, evaluation=ev)
    # one pricing: the breakdown holds the evaluator's records, not a second account
    assert parts.ops == ev.ops and parts.edges == ev.edges
    assert parts.valid == ev.valid and parts.errors == ev.errors == []
    assert parts.boxed_edges == ev.boxed_edges
    assert parts.fallback_ops == ev.fallback_ops
    # evaluating again (no evaluation passed) gives the same records
    again = breakdown(graph, plan)
    assert again.ops == ev.ops and again.edges == ev.edges
    close = functools.partial(math.isclose, rel_tol=1e-9, abs_tol=1e-15)
    layers = sum(parts.layer_compute_s.values()) + sum(parts.layer_comm_s.values())
    assert close(layers, ev.compute_time_s + ev.comm_time_s)
    for kind_name, t in ev.comm_time_s_per_collective.items():
        assert close(sum(v for (c, _), v in parts.comm_s.items() if c == kind_name), t)
    timeline = memory_timeline(graph, plan, evaluation=ev)
    assert timeline.activations == ev.activation_profile
    assert len(timeline.activations) == len(graph.ops)
    assert close(timeline.peak, ev.memory.total)
    assert close(timeline.activation_peak, ev.memory.activations)
    assert memory_timeline(graph, plan).activations == ev.activation_profile


def test_a_shared_memo_gives_the_same_prices(graph) -> None:
    memo = PricingMemo()
    for kind in ("megatron", "inferred"):
        plan = baseline(kind, 2)
        alone, shared = breakdown(graph, plan), breakdown(graph, plan, memo=memo)
        assert [(e.consumer, e.port, e.time_s) for e in alone.edges] == [
            (e.consumer, e.port, e.time_s) for e in shared.edges
        ]
    assert (
        memo.signatures
    )  # boxing searches are shared process-wide (autopar.runtimes.registry.boxing_search)


def test_invalid_signature_is_reported(graph) -> None:
    plan = baseline("megatron", 2)
    matmul = next(op.name for op in graph.ops if op.type == "broadcast_matmul")
    sig = plan.signatures[matmul]
    plan.signatures[matmul] = Signature(tuple(nd(S(0), S(0)) for _ in sig.inputs), sig.outputs)
    parts = breakdown(graph, plan)
    assert not parts.valid
    assert any(matmul in e and "not one its rule offers" in e for e in parts.errors)
    assert evaluate(graph, plan).valid is False


def test_zero2_gather_is_listed_and_edges_are_sorted(graph) -> None:
    parts = breakdown(graph, baseline("megatron", 2))
    gathers = [e for e in parts.edges if e.zero_gather]
    assert gathers, "ZeRO-2 gathers the updated parameters back over the data-parallel axis"
    assert all(e.producer == e.consumer and e.steps for e in gathers)
    top = parts.most_expensive_edges(10)
    assert len(top) == 10
    assert [e.time_s for e in top] == sorted((e.time_s for e in top), reverse=True)
    assert top[0].time_s == max(e.time_s for e in parts.edges)
    assert all(e.shape == tuple(graph.tensors[e.tensor].shape) for e in top)
