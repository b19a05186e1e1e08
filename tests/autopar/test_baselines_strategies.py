"""The baselines as strategies behind one interface (issue 23)."""

from __future__ import annotations

import pytest

from autopar.baselines import BASELINES, STRATEGIES, Baseline, BaselineKind, baseline_plan
from autopar.cluster import Cluster, Mesh
from autopar.errors import ConfigError
from autopar.models import build

MESH = Mesh(Cluster.parse("2x4"), (4, 2))


def test_every_baseline_has_one_strategy():
    assert sorted(k.value for k in STRATEGIES) == sorted(BASELINES)
    for kind, strategy in STRATEGIES.items():
        assert isinstance(strategy, Baseline)
        assert strategy.kind is kind


def test_unknown_baseline_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        baseline_plan("zero-bubble", build("tiny-gpt"), MESH)
    assert err.value.code == "unknown_baseline"


@pytest.mark.parametrize("kind", BASELINES)
def test_each_strategy_plans_every_op(kind: str):
    g = build("tiny-gpt")
    plan = baseline_plan(kind, g, MESH, 2)
    assert set(plan.signatures) == {op.name for op in g.ops}
    assert plan.source == f"baseline:{BaselineKind(kind).value}"
