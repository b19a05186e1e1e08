"""The hand-written backward is the true gradient, and the optimizer consumes it.

Each tiny model is executed in float64 numpy (tests/autopar/models/_numpy_exec.py):
the gradient the graph's own backward ops compute for every parameter is compared
with a central finite difference of the forward loss along a random direction.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from autopar.ir.graph import Graph, Role
from autopar.models import build

from ._numpy_exec import NumpyExecutor, random_feeds, random_params

SMALL = {
    "tiny-mt5": {"batch": 2, "encoder_seq": 8, "decoder_seq": 4},
    "tiny-t5": {"batch": 2, "encoder_seq": 8, "decoder_seq": 4},
    "tiny-gpt": {"batch": 2, "seq": 8},
    "tiny-bert": {"batch": 2, "seq": 8},
}
FORWARD = frozenset({Role.FORWARD})


def _executor(graph: Graph, seed: int = 0) -> tuple[NumpyExecutor, np.random.Generator]:
    rng = np.random.default_rng(seed)
    return NumpyExecutor(graph, random_feeds(graph, rng), random_params(graph, rng, std=0.02)), rng


def _finite_difference_failures(graph: Graph) -> list[str]:
    """Every parameter's backward gradient against a central finite difference of the loss
    along a random direction; the mismatches."""
    ex, rng = _executor(graph)
    values = ex.run()
    loss = graph.meta["loss"]
    assert np.isfinite(values[loss]) and values[loss] > 0
    eps = 1e-6
    failures = []
    for v in graph.variables:
        assert v.grad is not None
        grad = values[v.grad]
        direction = rng.standard_normal(grad.shape)
        base = ex.params[v.op]
        up = ex.run(FORWARD, {v.op: base + eps * direction})[loss]
        down = ex.run(FORWARD, {v.op: base - eps * direction})[loss]
        numeric = float(up - down) / (2 * eps)
        analytic = float(np.sum(grad * direction))
        if abs(numeric - analytic) > 1e-8 + 1e-4 * abs(analytic):
            failures.append(f"{v.op}: finite difference {numeric:.8g}, backward {analytic:.8g}")
    return failures


@pytest.mark.parametrize("name", sorted(SMALL))
def test_parameter_gradients_match_finite_differences(name: str) -> None:
    graph = build(name, clip_grad_max_norm=None, **SMALL[name])
    failures = _finite_difference_failures(graph)
    assert not failures, "\n".join(failures)


T5_NAMES = ("tiny-mt5", "tiny-t5")


@pytest.mark.parametrize("name", T5_NAMES)
def test_fused_cross_kv_gradients_match_finite_differences(name: str) -> None:
    """The fused cross-attention ``key_value`` (``narrow`` into key and value, and
    ``narrow_grad`` back) differentiates correctly."""
    graph = build(name, clip_grad_max_norm=None, fused_cross_kv=True, **SMALL[name])
    assert any(v.op.endswith("cross_attn.key_value.weight") for v in graph.variables)
    failures = _finite_difference_failures(graph)
    assert not failures, "\n".join(failures)


def _head_first_key_value(k: np.ndarray, v: np.ndarray, heads: int) -> np.ndarray:
    """LiBai's ``key_value`` weight ``[2 * inner, in]`` from separate ``k`` and ``v`` weights
    ``[inner, in]`` (or biases ``[inner]``): per head, its key rows then its value rows."""
    per_head = (heads, k.shape[0] // heads, *k.shape[1:])
    return np.concatenate([k.reshape(per_head), v.reshape(per_head)], axis=1).reshape(
        2 * k.shape[0], *k.shape[1:]
    )


@pytest.mark.parametrize("name", T5_NAMES)
def test_fused_cross_kv_is_the_separate_k_and_v_laid_out_head_first(name: str) -> None:
    """With ``key_value``'s rows taken per head from ``k`` then ``v`` (LiBai's head-first
    layout), the fused graph computes the separate graph's loss and parameter gradients;
    rows laid out ``[k | v]`` (what a head-first cut must not read) do not."""
    options = {"clip_grad_max_norm": None, "dropout": 0.0, **SMALL[name]}
    separate = build(name, **options)
    fused = build(name, fused_cross_kv=True, **options)
    heads = separate.meta["config"]["heads"]
    ex, _ = _executor(separate)
    sep_values = ex.run()

    def fused_params(combine: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> dict[str, np.ndarray]:
        params = {
            k: a for k, a in ex.params.items() if ".cross_attn.k." not in k and ".cross_attn.v." not in k
        }
        for k_name in [k for k in ex.params if ".cross_attn.k." in k]:
            v_name = k_name.replace(".cross_attn.k.", ".cross_attn.v.")
            params[k_name.replace(".cross_attn.k.", ".cross_attn.key_value.")] = combine(
                ex.params[k_name], ex.params[v_name]
            )
        assert set(params) == {v.op for v in fused.variables}
        return params

    loss = separate.meta["loss"]
    head_first = NumpyExecutor(
        fused, ex.feeds, fused_params(lambda k, v: _head_first_key_value(k, v, heads))
    ).run()
    assert head_first[loss] == pytest.approx(sep_values[loss], rel=1e-12)
    grads = {v.op: v.grad for v in fused.variables if v.grad is not None}
    compared = 0
    for v in separate.variables:
        if v.op in grads and v.grad is not None:
            np.testing.assert_allclose(head_first[grads[v.op]], sep_values[v.grad], rtol=1e-9, atol=1e-15)
            compared += 1
    assert compared == sum(".cross_attn.key_value." not in v.op for v in fused.variables)
    stacked = NumpyExecutor(fused, ex.feeds, fused_params(lambda k, v: np.concatenate([k, v]))).run()
    assert stacked[loss] != pytest.approx(sep_values[loss], rel=1e-6)


def test_a_wrong_gradient_is_detected() -> None:
    """The check above can fail: scaling one weight gradient is caught."""
    graph = build("tiny-gpt", clip_grad_max_norm=None, **SMALL["tiny-gpt"])
    ex, rng = _executor(graph)
    values = ex.run()
    v = next(v for v in graph.variables if v.op.endswith("mlp.fc1.weight"))
    assert v.grad is not None
    grad = 1.01 * values[v.grad]
    direction = rng.standard_normal(grad.shape)
    eps = 1e-6
    loss = graph.meta["loss"]
    up = ex.run(FORWARD, {v.op: ex.params[v.op] + eps * direction})[loss]
    down = ex.run(FORWARD, {v.op: ex.params[v.op] - eps * direction})[loss]
    analytic = float(np.sum(grad * direction))
    assert abs(float(up - down) / (2 * eps) - analytic) > 1e-8 + 1e-4 * abs(analytic)


def test_clip_by_global_norm_scales_every_gradient() -> None:
    max_norm = 1e-3  # small enough that clipping is active
    graph = build("tiny-mt5", clip_grad_max_norm=max_norm, **SMALL["tiny-mt5"])
    ex, _ = _executor(graph, seed=1)
    values = ex.run()
    raw = {}
    for v in graph.variables:
        assert v.grad is not None
        clip_op = graph.op_by_name[graph.producer[v.grad][0]]
        assert clip_op.type == "scalar_mul_by_tensor"
        raw[v.op] = values[clip_op.inputs["x_0"]]
    norm = float(np.sqrt(sum(np.sum(g * g) for g in raw.values())))
    coeff = min(1.0, max_norm / (norm + 1e-6))
    assert coeff < 1.0
    for v in graph.variables:
        assert v.grad is not None
        np.testing.assert_allclose(values[v.grad], coeff * raw[v.op], rtol=1e-12, atol=0)


def test_unclipped_gradients_equal_clipped_when_norm_is_small() -> None:
    graph = build("tiny-gpt", clip_grad_max_norm=1e6, **SMALL["tiny-gpt"])
    ex, _ = _executor(graph)
    values = ex.run()
    for v in graph.variables:
        assert v.grad is not None
        clip_op = graph.op_by_name[graph.producer[v.grad][0]]
        np.testing.assert_allclose(values[v.grad], values[clip_op.inputs["x_0"]], rtol=1e-12)
