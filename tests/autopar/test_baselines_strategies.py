"""The baselines as strategies behind one interface (issue 23)."""

from __future__ import annotations

import pytest

from autopar.baselines.plans import STRATEGIES, baseline_plan
from autopar.baselines.problem import BASELINES, Baseline, BaselineKind
from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
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


# ---------------------------------------------------------- Megatron-LM as it runs, by hand (issue 33)


@pytest.mark.parametrize(
    ("stage", "max_position"),
    [
        (0, 64),
        (1, 64),
        (0, 1024),  # a large tp-replicated table: reduced within the dp group, no detour over tp
        (1, 1024),
    ],
)
def test_megatron_lm_reduces_gradients_and_gathers_parameters_once_per_step(stage: int, max_position: int):
    """Megatron-LM at K = 8 (``megatron-lm`` runtime): DDP (ZeRO-0) all-reduces every
    gradient once per optimizer step, the distributed optimizer (ZeRO-1) reduce-scatters
    them once and all-gathers the fp16 parameters once -- the same ``2 (dp-1)/dp x Psi_tp x 2``
    bytes per device on the data-parallel axis, where ``Psi_tp`` is what one tensor-parallel
    rank holds, counted from the configuration (``megatron_parameter_elements``), not from
    the baseline (Megatron-LM ``megatron/core/distributed/param_and_grad_buffer.py``,
    ``megatron/core/optimizer/distrib_optimizer.py``)."""
    from autopar.cost.evaluate import evaluate
    from autopar.ir.training import TrainingConfig
    from benchmarks.model_truth import hand_count_dp_bytes

    g = build("gpt2-medium", layers=2, hidden=256, heads=4, vocab=4096, seq=64, max_position=max_position)
    plan = baseline_plan("megatron", g, MESH, stage, runtime="megatron-lm")
    ev = evaluate(g, plan, training=TrainingConfig(8, "full"))
    on_dp = [e for e in ev.edges if any(s.axis == 0 for s in e.steps) and (e.gradient or e.zero_gather)]
    assert on_dp and all((e.per_micro_batch, e.per_step) == (0, 1) for e in on_dp)
    got = sum(s.bytes_per_device for e in on_dp for s in e.steps if s.axis == 0)
    assert got == pytest.approx(hand_count_dp_bytes(g, MESH), rel=0.02)
    if stage == 1:
        gathers = [e for e in on_dp if e.zero_gather]
        assert gathers and {e.dtype for e in gathers} == {"float16"}  # the training dtype
