"""Rules for op types OneFlow 0.9 inserts itself (layout casts, the two-stage max of the
vocab-parallel cross entropy) and signatures OneFlow refuses or adds (``reduce_sum_like``,
``rsqrt_grad`` / ``square_grad``, ``broadcast_like``)."""

from __future__ import annotations

from tests.autopar.rules.helpers import assert_all_fit, make_ctx, printed, replicated

N, V = 16, 64


# ------------------------------------------------------------------ hierarchical_parallel_cast


def test_hierarchical_parallel_cast_takes_its_nd_sbp_on_both_ports():
    ctx = make_ctx(
        "hierarchical_parallel_cast",
        {"in_0": (N, 1)},
        {"out_0": (N, 1)},
        {"nd_sbp": ["S(0)", "B"], "grad_mode": "auto", "grad_nd_sbp": []},
        mesh=(2, 2),
    )
    sigs = assert_all_fit(ctx)
    assert {str(s) for s in sigs} == {"((S(0), B)) -> (S(0), B)"}


def test_hierarchical_parallel_cast_partial_target():
    ctx = make_ctx(
        "hierarchical_parallel_cast", {"in_0": (N, V)}, {"out_0": (N, V)}, {"nd_sbp": ["B", "P"]}, mesh=(2, 2)
    )
    assert printed(ctx) == {"((B, P)) -> (B, P)"}


def test_hierarchical_parallel_cast_without_nd_sbp_is_an_identity():
    ctx = make_ctx("hierarchical_parallel_cast", {"in_0": (N, V)}, {"out_0": (N, V)}, {}, mesh=(2,))
    assert printed(ctx) == {"(S(0)) -> S(0)", "(S(1)) -> S(1)", "(B) -> B", "(P) -> P"}


def test_hierarchical_parallel_cast_like_follows_like():
    ctx = make_ctx(
        "hierarchical_parallel_cast_like",
        {"in_0": (N, V), "like_0": (N, V)},
        {"out_0": (N, V)},
        {},
        mesh=(2,),
    )
    got = printed(ctx)
    assert {"(S(1), S(1)) -> S(1)", "(B, B) -> B", "(P, P) -> P"} <= got
    assert "(S(1), B) -> S(1)" not in got


# ------------------------------------------------------------------ two-stage max


def _device_stage(stage: int, mesh: tuple[int, ...]):
    return make_ctx(
        "reduce_max_device_stage",
        {"in_0": (N, V)},
        {"out_0": (N, stage), "mask_0": ((N, V), "int8"), "count_0": ((N, stage), "int32")},
        {"axis": [1]},
        mesh=mesh,
    )


def test_device_stage_splits_the_reduced_dim_as_its_output_shape_says():
    ctx = _device_stage(2, (2, 2))
    got = {str(s) for s in assert_all_fit(ctx)}
    # OneFlow's rewrite pins the prediction's layout, e.g. (S(0), S(1)).
    assert "((S(0), S(1))) -> ((S(0), S(1)), (S(0), S(1)), (S(0), S(1)))" in got
    assert "((B, S(1))) -> ((B, S(1)), (B, S(1)), (B, S(1)))" in got
    # Two slices of the vocab: splitting it on both axes (4 slices) or on none is wrong.
    assert "((S(1), S(1))) -> ((S(1), S(1)), (S(1), S(1)), (S(1), S(1)))" not in got
    assert replicated(ctx) not in got
    assert not any("P" in s for s in got)


def test_device_stage_one_slice_is_replicated_or_row_split():
    ctx = _device_stage(1, (2,))
    got = {str(s) for s in assert_all_fit(ctx)}
    assert got == {"(B) -> (B, B, B)", "(S(0)) -> (S(0), S(0), S(0))"}


def test_device_stage_grad_splits_only_the_reduced_dim():
    ctx = make_ctx(
        "reduce_max_device_stage_grad",
        {"out_diff_0": (N, 2), "mask_0": ((N, V), "int8"), "count_0": ((N, 2), "int32")},
        {"in_diff_0": (N, V)},
        {"axis": [1]},
        mesh=(2, 2),
    )
    got = {str(s) for s in assert_all_fit(ctx)}
    assert "((B, S(1)), (B, S(1)), (B, S(1))) -> (B, S(1))" in got
    assert not any("S(0)" in s for s in got)


def test_global_stage_rows_or_replicated():
    ctx = make_ctx(
        "reduce_max_global_stage",
        {"in_0": (N, 2), "device_count_0": ((N, 2), "int32")},
        {"out_0": (N, 1), "mask_0": ((N, 2), "int8")},
        {"axis": [1], "keepdims": True},
        mesh=(2, 2),
    )
    got = {str(s) for s in assert_all_fit(ctx)}
    assert "((S(0), B), (S(0), B)) -> ((S(0), B), (S(0), B))" in got
    assert replicated(ctx) in got
    assert not any("P" in s or "S(1)" in s for s in got)


def test_global_stage_grad_is_replicated():
    ctx = make_ctx(
        "reduce_max_global_stage_grad",
        {"out_diff_0": (N, 1), "mask_0": ((N, 2), "int8"), "device_count_0": ((N, 2), "int32")},
        {"in_diff_0": (N, 2)},
        {"axis": [1], "keepdims": True},
        mesh=(2,),
    )
    assert printed(ctx) == {"(B, B, B) -> B"}


# ------------------------------------------------------------------ OneFlow-refused and -added signatures


def test_reduce_sum_like_never_takes_a_partial_x():
    ctx = make_ctx(
        "reduce_sum_like", {"x_0": (N, V), "like_0": (V,)}, {"y_0": (V,)}, {"axis": [0]}, mesh=(2, 2)
    )
    got = {str(s) for s in assert_all_fit(ctx)}
    assert "((S(0), S(0)), (B, B)) -> (P, P)" in got
    assert not any(s.startswith("((P") or s.startswith("((B, P)") or s.startswith("((S(0), P)") for s in got)
    assert "((B, P), (B, B)) -> (B, P)" not in got


def test_rsqrt_and_square_grad_take_no_partial_dy():
    for op in ("rsqrt_grad", "square_grad"):
        ctx = make_ctx(op, {"x_0": (N, V), "dy_0": (N, V)}, {"dx_0": (N, V)}, {}, mesh=(2, 2))
        got = {str(s) for s in assert_all_fit(ctx)}
        assert "((S(0), S(1)), (S(0), S(1))) -> (S(0), S(1))" in got
        assert not any("P" in s for s in got), op
    ctx = make_ctx("sqrt_grad", {"x_0": (N, V), "dy_0": (N, V)}, {"dx_0": (N, V)}, {}, mesh=(2,))
    assert "(B, P) -> P" in printed(ctx)


def test_broadcast_like_takes_a_partial_like():
    ctx = make_ctx(
        "broadcast_like", {"x_0": (V,), "like_0": (N, V)}, {"y_0": (N, V)}, {"broadcast_axes": [0]}, mesh=(2,)
    )
    got = {str(s) for s in assert_all_fit(ctx)}
    assert {"(B, P) -> B", "(P, P) -> P", "(P, B) -> P", "(B, S(0)) -> S(0)", "(S(0), S(1)) -> S(1)"} <= got
    assert "(B, P) -> P" not in got
