"""System ops: variables never P, inputs split or replicated, ticks replicated."""

from __future__ import annotations

from autopar.rules import CostKind
from tests.autopar.rules.helpers import assert_all_fit, make_ctx, printed, rule_for


def test_variable_any_split_or_broadcast_never_partial():
    ctx = make_ctx("variable", {}, {"out": (64, 32)}, mesh=(4, 2))
    sigs = assert_all_fit(ctx)
    assert len(sigs) == 9
    assert not any(o.has_partial for s in sigs for o in s.outputs)
    got = {str(s) for s in sigs}
    assert {"() -> (B, S(0))", "() -> (S(0), S(1))", "() -> (B, B)"} <= got


def test_variable_splits_follow_oneflows_storage_rule():
    got = printed(make_ctx("variable", {}, {"out": (6, 3)}, mesh=(4, 2)))
    assert "() -> (S(0), B)" in got  # 6 over 4: uneven, accepted
    assert "() -> (B, S(1))" in got
    assert "() -> (S(1), B)" not in got  # 3 < 4
    assert "() -> (B, S(0))" in got


def test_input_data_parallel_or_replicated():
    got = printed(make_ctx("input", {}, {"out": ((8, 16), "int64")}, mesh=(2,)))
    assert got == {"() -> B", "() -> S(0)", "() -> S(1)"}


def test_output_accepts_partial():
    got = printed(make_ctx("output", {"in": (1,)}, {"out": (1,)}, mesh=(2,)))
    assert "(P) -> P" in got and "(B) -> B" in got


def test_ticks_are_replicated_and_free():
    for t in (
        "tick",
        "sink_tick",
        "learning_rate_schedule",
        "callback_notify",
        "variable",
        "input",
        "output",
        "cast_to_tick",
    ):
        assert rule_for(t).cost is CostKind.FREE
    got = printed(
        make_ctx(
            "learning_rate_schedule", {"train_step": ((1,), "int64")}, {"out": ((1,), "float32")}, mesh=(2,)
        )
    )
    assert got == {"(B) -> B"}
    tick = printed(make_ctx("cast_to_tick", {"in_0": (8, 16)}, {"out_0": (1,)}, mesh=(2,)))
    assert tick == {"(B) -> B", "(P) -> B", "(S(0)) -> B", "(S(1)) -> B"}


def test_like_generators_follow_their_like():
    ones = printed(make_ctx("ones_like", {"like_0": (8, 16)}, {"out_0": (8, 16)}, mesh=(2,)))
    assert ones == {"(S(0)) -> S(0)", "(S(1)) -> S(1)", "(B) -> B", "(P) -> B"}
    zeros = printed(make_ctx("zero_like", {"like_0": (8, 16)}, {"out_0": (8, 16)}, mesh=(2,)))
    assert "(P) -> P" in zeros
    arange = printed(make_ctx("arange", {}, {"out_0": ((16,), "int64")}, mesh=(2,)))
    assert arange == {"() -> B", "() -> S(0)"}
    const = printed(make_ctx("constant", {}, {"out_0": (8, 16)}, mesh=(2,)))
    assert "() -> P" not in const and "() -> S(1)" in const
