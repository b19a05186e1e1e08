"""The pin reaches the op OneFlow builds in place of the plan's (plain vs ``_ms`` cross entropy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import launch

pytestmark = pytest.mark.oneflow


def test_a_plan_with_the_ms_cross_entropy_pins_the_plain_op_oneflow_built_instead(
    tmp_path: Path, flow
) -> None:
    launch(4, Path(__file__).with_name("_pin_variant.py"), str(tmp_path), timeout=600)
    result = json.loads((tmp_path / "result.json").read_text())

    # build B has the plain ops, laid out as the plan's _ms gradient, not as OneFlow inferred ((S(0), B))
    grad = result["layouts"]["sparse_softmax_cross_entropy_grad"]
    assert set(grad) == {"prob_0", "label_0", "dy_0", "prediction_diff_0"}
    assert set(grad.values()) == {"(B, S(0))"}, grad
    forward = result["layouts"]["sparse_softmax_cross_entropy"]
    assert forward["prob_0"] == "(B, S(0))", forward  # no boxing between the forward and its gradient
    assert not result["rejected"]

    # the _ms gradient is matched and compiled as planned; the _ms softmax's ten ops have no counterpart
    assert result["plan_grad"] not in result["missing"]
    assert result["plan_grad"] not in result["mismatched_ops"]
    assert len(result["missing"]) == 10 and all(
        "sparse_softmax_cross_entropy_ms" in m for m in result["missing"]
    )
