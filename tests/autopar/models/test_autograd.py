"""The hand-written backward is the true gradient, and the optimizer consumes it.

Each tiny model is executed in float64 numpy (tests/autopar/models/_numpy_exec.py):
the gradient the graph's own backward ops compute for every parameter is compared
with a central finite difference of the forward loss along a random direction.
"""

from __future__ import annotations

import numpy as np
import pytest

from autopar.graph import Graph, Role
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


@pytest.mark.parametrize("name", sorted(SMALL))
def test_parameter_gradients_match_finite_differences(name: str) -> None:
    graph = build(name, clip_grad_max_norm=None, **SMALL[name])
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
    assert not failures, "\n".join(failures)


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
