"""Optimizer updates: N-D layouts of the parameter, ZeRO shards of gradients and states."""

from __future__ import annotations

import pytest

from autopar.ir.sbp import B, S, nd
from autopar.rules.families.optimizer import parameter_layouts, zero_shard
from tests.autopar.rules.helpers import assert_all_fit, make_ctx, rule_for, signatures

W = (1024, 512)


def _adam(shape=W, zero_stage=2, mesh=(4, 2)):
    ports = {
        "model_0": (shape, "float32"),
        "model_diff_0": (shape, "float16"),
        "learning_rate_0": ((1,), "float32"),
        "bias_correction1_0": ((1,), "float32"),
        "bias_correction2_0": ((1,), "float32"),
        "m_0": (shape, "float32"),
        "v_0": (shape, "float32"),
    }
    return make_ctx("adam_update", ports, {}, {"beta1": 0.9}, mesh=mesh, zero_stage=zero_stage)


def _by_model(ctx):
    return {str(s.inputs[0]): s for s in signatures(ctx)}


def test_adam_is_a_full_nd_rule_over_every_parameter_layout():
    assert rule_for("adam_update").nd
    ctx = _adam()
    sigs = assert_all_fit(ctx)
    # B or S(0) or S(1) on each of 2 axes, all dividing 1024 x 512
    assert len(sigs) == 9
    assert not any(p.has_partial for s in sigs for p in s.inputs)


def test_zero2_shards_gradients_and_states_over_replicated_axes():
    by_model = _by_model(_adam(zero_stage=2))
    # column-parallel weight: replicated on dp (axis 0) -> grads/states split there
    s = by_model["(B, S(0))"]
    assert str(s) == ("((B, S(0)), (S(0), S(0)), (B, B), (B, B), (B, B), (S(0), S(0)), (S(0), S(0))) -> ()")
    # fully replicated parameter: both axes shard the gradient
    s = by_model["(B, B)"]
    assert str(s.inputs[1]) == "(S(0), S(0))"
    # a parameter already split on every axis has nothing to shard
    s = by_model["(S(0), S(1))"]
    assert str(s.inputs[1]) == "(S(0), S(1))"


def test_zero0_keeps_gradients_like_the_parameter():
    for s in signatures(_adam(zero_stage=0)):
        assert s.inputs[1] == s.inputs[0] == s.inputs[5] == s.inputs[6]
        assert str(s.inputs[2]) == "(B, B)"


def test_zero_shard_skips_dims_that_do_not_divide():
    assert zero_shard((3,), nd(B, B), (4, 2)) == nd(B, B)
    assert zero_shard((6,), nd(B, B), (4, 2)) == nd(B, S(0))
    assert zero_shard((6, 8), nd(B, B), (4, 2)) == nd(S(1), S(0))
    assert zero_shard((512, 64), nd(B, S(1)), (4, 2)) == nd(S(0), S(1))
    assert zero_shard((8,), nd(B, B), (1, 2)) == nd(B, S(0))  # size-1 axes stay B


def test_parameter_layouts_follow_oneflows_storage_rule():
    layouts = {str(v) for v in parameter_layouts((6, 3), (4, 2))}
    assert "(S(0), B)" in layouts  # 6 over 4: uneven, accepted
    assert "(B, S(0))" in layouts
    assert "(B, S(1))" in layouts  # 3 over 2: 2, 1
    assert "(S(1), B)" not in layouts  # 3 < 4
    assert "(S(0), S(0))" not in layouts  # 6 // 4 = 1 < 2
    assert "(B, B)" in layouts


def test_argument_order_does_not_matter():
    ports = {
        "m_0": (W, "float32"),
        "learning_rate_0": ((1,), "float32"),
        "model_diff_0": (W, "float16"),
        "v_0": (W, "float32"),
        "model_0": (W, "float32"),
    }
    ctx = make_ctx("adam_update", ports, {}, mesh=(4, 2), zero_stage=2)
    for s in signatures(ctx):
        model, diff = s.inputs[4], s.inputs[2]
        assert diff == zero_shard(W, model, (4, 2))
        assert s.inputs[0] == diff and s.inputs[3] == diff
        assert str(s.inputs[1]) == "(B, B)"


@pytest.mark.parametrize("op_type,state", [("sgd_update", None), ("momentum_update", "momentum")])
def test_other_optimizers(op_type, state):
    ports = {"model_0": W, "model_diff_0": W, "learning_rate_0": (1,)}
    if state:
        ports[f"{state}_0"] = W
    ctx = make_ctx(op_type, ports, {}, mesh=(4, 2), zero_stage=1)
    sigs = assert_all_fit(ctx)
    assert len(sigs) == 9
    for s in sigs:
        assert s.inputs[1] == zero_shard(W, s.inputs[0], (4, 2))


def test_lamb_takes_the_replicated_layout_only():
    ports = {"model_0": W, "model_diff_0": W, "m_0": W, "v_0": W}
    sigs = signatures(make_ctx("lamb_update", ports, {}, mesh=(4, 2), zero_stage=0))
    assert [str(s) for s in sigs] == ["((B, B), (B, B), (B, B), (B, B)) -> ()"]


# ------------------------------------------------------------------ OneFlow 0.9's shard_min_size


def test_oneflow_threshold_leaves_small_variables_unsharded():
    """IsSplitValid (optimizer_placement_optimization_pass.cpp): every split of the new layout,
    floor-divided in mesh order, must keep shard_min_size elements (default 1024)."""
    from autopar.rules.families.optimizer import oneflow_shard_is_valid, oneflow_zero_shard

    mesh = (4, 2)
    # a norm weight of 768: 384 per shard < 1024 -> stays (B, B); with shard_min_size=1 it shards
    assert oneflow_zero_shard((768,), nd(B, B), mesh) == nd(B, B)
    assert oneflow_zero_shard((768,), nd(B, B), mesh, 1) == nd(B, S(0))
    assert zero_shard((768,), nd(B, B), mesh, "one_axis") == nd(B, B)
    assert zero_shard((768,), nd(B, B), mesh, "one_axis:shard_min_size=1") == nd(B, S(0))
    # exactly 1024 per shard is kept sharded
    assert oneflow_zero_shard((2048,), nd(B, B), mesh) == nd(B, S(0))
    # LiBai's column-parallel (B, S(0)) weight: the pre-existing split counts too
    assert oneflow_zero_shard((64, 64), nd(B, S(0)), mesh) == nd(B, S(0))  # 1024 / 4 / 2 = 512
    assert oneflow_zero_shard((128, 64), nd(B, S(0)), mesh) == nd(S(0), S(0))  # 8192 / 8
    # uneven splits count their smallest shard (floor division)
    assert oneflow_shard_is_valid((2049,), nd(B, S(0)), mesh, 1024)
    assert not oneflow_shard_is_valid((2047,), nd(B, S(0)), mesh, 1024)
    assert not oneflow_shard_is_valid((1000,), nd(B, B), mesh, 1024)  # the tensor itself is small


def test_adam_of_a_small_parameter_offers_the_unsharded_update():
    """OneFlow's default ZeRO leaves a bias's adam_update (B, B) for model and model_diff."""
    from autopar.rules.registry import RuleContext

    ctx = _adam(shape=(64,), zero_stage=2)
    default = RuleContext(ctx.op, ctx.inputs, ctx.outputs, ctx.mesh_shape, 2, "one_axis")
    by_model = {str(s.inputs[0]): s for s in signatures(default)}
    assert str(by_model["(B, B)"].inputs[1]) == "(B, B)"
    every = RuleContext(ctx.op, ctx.inputs, ctx.outputs, ctx.mesh_shape, 2, "one_axis:shard_min_size=1")
    by_model = {str(s.inputs[0]): s for s in signatures(every)}
    assert str(by_model["(B, B)"].inputs[1]) == "(B, S(0))"


def test_runtime_profiles_carry_the_threshold_in_their_key():
    from autopar.errors import ConfigError
    from autopar.runtimes.profile import parse_zero_sharding
    from autopar.runtimes.registry import runtime_profile

    default = runtime_profile("oneflow-0.9")
    variant = runtime_profile("oneflow-0.9-shard-min-1")
    assert default.zero_shard_min_size == 1024 and variant.zero_shard_min_size == 1
    assert default.key()["zero_shard_min_size"] == 1024
    assert default.key() != {**variant.key(), "name": default.name}
    assert parse_zero_sharding("all_axes") == ("all_axes", 1)
    with pytest.raises(ConfigError):
        parse_zero_sharding("one_axis:min=3")
