"""Megatron-LM's rules (``autopar.rules.megatron_lm``): OneFlow's, plus the vocab-parallel
cross-entropy and the by-heads split of a fused projection, for the ``megatron`` baseline only."""

from __future__ import annotations

import pytest

from autopar.rules import default_rules, nd_signatures
from autopar.rules.megatron_lm import MEGATRON_SOURCE, megatron_lm_rules, rules_for_source
from tests.autopar.rules.helpers import make_ctx

N, V = 64, 256


def _printed(rules, ctx) -> set[str]:
    rule = rules.get(ctx.op.type)
    assert rule is not None
    return {str(s) for s in nd_signatures(rule, ctx)}


def test_log_softmax_splits_the_vocabulary_only_in_megatron_lms_rules():
    """OneFlow 0.9's log_softmax splits only the rows (log_softmax_op.cpp); Megatron-LM's
    _VocabParallelCrossEntropy keeps the vocabulary split."""
    ctx = make_ctx("log_softmax", {"in_0": (N, V)}, {"prob_0": (N, V)}, mesh=(2,))
    oneflow, megatron = _printed(default_rules(), ctx), _printed(megatron_lm_rules(), ctx)
    assert "(S(1)) -> S(1)" not in oneflow
    assert megatron == oneflow | {"(S(1)) -> S(1)"}
    grad = make_ctx("log_softmax_grad", {"prob_0": (N, V), "dy_0": (N, V)}, {"dx_0": (N, V)}, mesh=(2,))
    assert _printed(megatron_lm_rules(), grad) - _printed(default_rules(), grad) == {"(S(1), S(1)) -> S(1)"}


@pytest.mark.parametrize("projections", [2, 3])
def test_a_fused_projection_output_splits_by_heads(projections):
    """timm's qkv ``[b, n, 3*h*d]`` viewed as ``[b, n, 3, h, d]``: a column split of the fused
    output is a split by heads (Megatron-LM's query_key_value layout), both ways."""
    heads, head_dim = 4, 16
    fused = (8, 17, projections, heads, head_dim)
    merged = (8, 17, projections * heads * head_dim)
    split = make_ctx("reshape", {"in_0": merged}, {"out_0": fused}, {"shape": list(fused)}, mesh=(2,))
    merge = make_ctx("reshape", {"in_0": fused}, {"out_0": merged}, {"shape": list(merged)}, mesh=(2,))
    assert _printed(megatron_lm_rules(), split) - _printed(default_rules(), split) == {"(S(2)) -> S(3)"}
    assert _printed(megatron_lm_rules(), merge) - _printed(default_rules(), merge) == {"(S(3)) -> S(2)"}


@pytest.mark.parametrize(("start", "kept"), [(0, True), (128, True), (256, True), (64, False)])
def test_a_narrow_of_one_fused_part_keeps_the_column_split(start, kept):
    """HF GPT-2's ``flow.split(c_attn(x), h, dim=2)``: q, k and v stay split by heads."""
    ctx = make_ctx(
        "narrow",
        {"in_0": (8, 16, 384)},
        {"out_0": (8, 16, 128)},
        {"dim": 2, "start": start, "length": 128},
        mesh=(2,),
    )
    extra = _printed(megatron_lm_rules(), ctx) - _printed(default_rules(), ctx)
    assert extra == ({"(S(2)) -> S(2)"} if kept else set())
    grad = make_ctx(
        "narrow_grad",
        {"dy_0": (8, 16, 128), "like_0": (8, 16, 384)},
        {"dx_0": (8, 16, 384)},
        {"dim": 2, "start": start, "length": 128},
        mesh=(2,),
    )
    extra = _printed(megatron_lm_rules(), grad) - _printed(default_rules(), grad)
    assert extra == ({"(S(2), S(2)) -> S(2)"} if kept else set())


def test_a_plain_reshape_gets_no_heads_split():
    """A reshape that is not a fused projection (4 parts, or a different lead) is OneFlow's."""
    ctx = make_ctx("reshape", {"in_0": (8, 17, 256)}, {"out_0": (8, 17, 4, 4, 16)}, mesh=(2,))
    assert _printed(megatron_lm_rules(), ctx) == _printed(default_rules(), ctx)


def test_only_megatron_plans_get_megatron_lms_rules():
    assert rules_for_source(MEGATRON_SOURCE) is megatron_lm_rules()
    for source in ("autopar", "baseline:inferred", "oneflow"):
        assert rules_for_source(source) is default_rules()
