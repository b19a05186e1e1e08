"""Memory model against hand-computed ZeRO figures (ZeRO paper, figure 1)."""

import pytest

from autopar.cost.memory import (
    FP32_ADAM,
    activation_intervals,
    activation_profile,
    model_state_bytes,
    variable_state_bytes,
)
from autopar.errors import ConfigError
from autopar.ir.graph import Graph, Op, Role, TensorSpec, Variable
from autopar.ir.sbp import B, P, S, data_parallel_axes, nd

PSI = 7.5e9  # the ZeRO paper's 7.5B-parameter example on 64 GPUs
ND = 64


def test_zero_paper_example():
    gb = 1e9
    assert sum(model_state_bytes(PSI, ND, 0)) / gb == pytest.approx(120)
    assert sum(model_state_bytes(PSI, ND, 1)) / gb == pytest.approx(31.4, rel=1e-2)
    assert sum(model_state_bytes(PSI, ND, 2)) / gb == pytest.approx(16.6, rel=1e-2)
    assert sum(model_state_bytes(PSI, ND, 3)) / gb == pytest.approx(1.9, rel=2e-2)  # paper rounds 1.875


def test_zero2_is_2psi_plus_14psi_over_nd():
    p, g, o = model_state_bytes(1000, 4, 2)
    assert (p, g, o) == (2000, 500, 3000)
    assert p + g + o == 2 * 1000 + 14 * 1000 / 4


def test_fp32_states():
    assert model_state_bytes(10, 1, 0, FP32_ADAM) == (40, 40, 80)


def test_bad_stage():
    with pytest.raises(ConfigError, match="ZeRO stage"):
        model_state_bytes(1, 1, 4)


def test_dp_axes_come_from_the_sbp():
    assert data_parallel_axes(nd(B, S(0))) == (0,)
    assert data_parallel_axes(nd(S(0), S(1))) == ()
    assert data_parallel_axes(nd(B, B)) == (0, 1)


def test_variable_state_bytes_tp_and_dp():
    # [1024, 1024] weight, column-parallel on a [4, 2] mesh: Psi = 2^20 / 2, Nd = 4
    p, g, o = variable_state_bytes((1024, 1024), nd(B, S(0)), (4, 2), 2)
    psi = 1024 * 1024 / 2
    assert p == 2 * psi and g == 2 * psi / 4 and o == 12 * psi / 4
    # fully replicated: Nd = 8
    p, g, o = variable_state_bytes((1024, 1024), nd(B, B), (4, 2), 2)
    assert g == 2 * 1024 * 1024 / 8


def _chain_graph() -> Graph:
    # x -> a -> b -> c ; b also consumed by a backward op at the end
    t = [TensorSpec(n, (4, 8), "float16") for n in ("x", "a", "b", "c", "d")]
    ops = [
        Op("in", "input", outputs={"out": "x"}),
        Op("f1", "relu", {"x_0": "x"}, {"y_0": "a"}),
        Op("f2", "relu", {"x_0": "a"}, {"y_0": "b"}),
        Op("f3", "relu", {"x_0": "b"}, {"y_0": "c"}),
        Op("g1", "relu_grad", {"dy_0": "c", "y_0": "b"}, {"dx_0": "d"}, role=Role.BACKWARD),
    ]
    return Graph("chain", t, ops).validate()


def test_activation_intervals_keep_saved_tensors_alive():
    g = _chain_graph()
    iv = activation_intervals(g)
    assert iv["b"] == (2, 4)  # produced by f2, last used by g1
    assert iv["a"] == (1, 2)


def test_activation_profile_peak_and_splits():
    g = _chain_graph()
    sbp = {t: nd(B, B) for t in g.tensors}
    prof = activation_profile(g, sbp, (4, 2))
    size = 4 * 8 * 2
    assert max(prof) == 3 * size  # at f3: b, c live (+ a ends at f2) -> position 3 holds b, c; at f2: a, b
    sbp_split = {t: nd(S(0), B) for t in g.tensors}
    assert max(activation_profile(g, sbp_split, (4, 2))) == pytest.approx(3 * size / 4)
    sbp_partial = {t: nd(P, B) for t in g.tensors}
    assert max(activation_profile(g, sbp_partial, (4, 2))) == 3 * size


def test_variables_are_model_states_not_activations():
    t = [TensorSpec("w", (4, 4), "float32"), TensorSpec("w16", (4, 4), "float16")]
    ops = [Op("w", "variable", outputs={"out": "w"}), Op("c", "cast", {"in_0": "w"}, {"out_0": "w16"})]
    g = Graph("v", t, ops, [Variable("w", "w")]).validate()
    # the ZeRO paper's policy: the fp16 working copy is the parameter's "2 Psi"
    assert activation_intervals(g, working_copy_is_state=True) == {}
    # by default it is an activation (OneFlow keeps each use's cast until backward)
    assert activation_intervals(g) == {"w16": (1, 1)}


# ------------------------------------------------------------------ ZeRO sharding per runtime


def test_oneflow_zero_shards_one_axis_as_its_pass_does():
    """OneFlow 0.9's GenerateSplitSignature: all-B -> S(0) on the last axis; else the first B
    axis next to a split axis takes that split; the ideal runtime shards every B axis."""
    from autopar.ir.sbp import parse_nd_sbp
    from autopar.rules.families.optimizer import oneflow_zero_shard, zero_shard

    mesh = (4, 2)
    shape = (64, 32)
    cases = {
        "(B, B)": "(B, S(0))",
        "(B, S(0))": "(S(0), S(0))",
        "(B, S(1))": "(S(1), S(1))",
        "(S(0), B)": "(S(0), S(0))",
        "(S(0), S(1))": "(S(0), S(1))",
    }
    for layout, want in cases.items():
        v = parse_nd_sbp(layout)
        # the geometry alone (shard_min_size=1); the 1024-element default is in tests/autopar/rules
        assert str(oneflow_zero_shard(shape, v, mesh, 1)) == want
        assert zero_shard(shape, v, mesh, "one_axis:shard_min_size=1") == oneflow_zero_shard(
            shape, v, mesh, 1
        )
    assert str(zero_shard(shape, parse_nd_sbp("(B, B)"), mesh, "all_axes")) == "(S(0), S(0))"
    # a split that does not divide keeps the layout (autopar's layouts are even)
    assert str(oneflow_zero_shard((3, 32), parse_nd_sbp("(B, B)"), mesh)) == "(B, B)"


def test_one_axis_zero_keeps_more_state_than_all_axes():
    from autopar.cost.memory import variable_state_bytes, zero_dp_size
    from autopar.ir.sbp import parse_nd_sbp

    v = parse_nd_sbp("(B, B)")
    assert zero_dp_size((64, 32), v, (4, 2), "one_axis") == 2
    assert zero_dp_size((64, 32), v, (4, 2), "all_axes") == 8
    one = sum(variable_state_bytes((64, 32), v, (4, 2), 2, FP32_ADAM, "one_axis"))
    every = sum(variable_state_bytes((64, 32), v, (4, 2), 2, FP32_ADAM, "all_axes"))
    n = 64 * 32
    assert one == 4 * n + 12 * n / 2
    assert every == 4 * n + 12 * n / 8


def test_oneflow_zero_shard_ignores_size_1_axes():
    """The planner solves size-1 axes away: the one-axis rule on (2, 1, 2) is the (2, 2) rule
    with B on the size-1 axis, so solver and verification agree."""
    from autopar.ir.sbp import parse_nd_sbp
    from autopar.rules.families.optimizer import oneflow_zero_shard

    for flat, want in {
        "(B, B)": "(B, S(0))",
        "(B, S(0))": "(S(0), S(0))",
        "(S(1), B)": "(S(1), S(1))",
    }.items():
        a, b = parse_nd_sbp(flat).values
        expanded = parse_nd_sbp(f"({a}, B, {b})")
        w0, w1 = parse_nd_sbp(want).values
        assert str(oneflow_zero_shard((64, 32), expanded, (2, 1, 2), 1)) == f"({w0}, B, {w1})"
