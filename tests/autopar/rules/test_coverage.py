"""Every op type of the MT5 / LiBai training job has a rule, and each rule behaves on a
representative MT5-shaped op (dp4 x mp2 mesh): signatures fit, replicated is offered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autopar.rules import default_rules
from tests.autopar.rules.helpers import assert_all_fit, make_ctx, replicated

# The list, plus what a real OneFlow 0.9 job of a T5 block contains
# (probed with nn.Graph.build_graph: log_softmax / nll from cross_entropy, var from
# LayerNorm on CPU, the optimizer's bias correction, schedules, assigns).
REQUIRED = [
    "matmul",
    "broadcast_matmul",
    "broadcast_matmul_grad_b",
    "batch_matmul",
    "fused_matmul_bias",
    "broadcast_add",
    "scalar_mul",
    "gelu",
    "gelu_grad",
    "fast_gelu",
    "fast_gelu_grad",
    "rms_norm",
    "rms_norm_grad",
    "rms_norm_param_grad",
    "layer_norm",
    "layer_norm_grad",
    "layer_norm_param_grad",
    "softmax",
    "softmax_grad",
    "dropout",
    "dropout_grad",
    "fused_scale_mask_softmax",
    "fused_scale_mask_softmax_grad",
    "fused_scale_mask_softmax_dropout",
    "fused_scale_mask_softmax_dropout_grad",
    "reduce_sum",
    "reduce_mean",
    "reduce_sum_like",
    "broadcast_like",
    "gather",
    "unsorted_segment_sum_like",
    "sparse_softmax_cross_entropy",
    "sparse_softmax_cross_entropy_grad",
    "sparse_softmax_cross_entropy_ms",
    "sparse_softmax_cross_entropy_ms_grad",
    "cast",
    "where",
    "clip_by_scalar",
    "clip_by_scalar_grad",
    "arange",
    "ones_like",
    "zeros_like",
    "zero_like",
    "add_n",
    "transpose",
    "reshape",
    "reshape_like",
    "expand_dims",
    "squeeze",
    "flatten",
    "adam_update",
    "identity",
    "amp_white_identity",
    "scalar_pow",
    "scalar_pow_grad",
    "rsqrt",
    "rsqrt_grad",
    "log",
    "log_grad",
    "floor",
    "floor_grad",
    "square",
    "square_grad",
    "sqrt",
    "sqrt_grad",
    "tanh",
    "tanh_grad",
    "relu",
    "relu_grad",
    "scalar_add",
    "scalar_div",
    "broadcast_sub",
    "broadcast_mul",
    "broadcast_div",
    "broadcast_div_grad",
    "broadcast_pow",
    "pow",
    "pow_x_grad",
    "pow_y_grad",
    "multiply",
    "square_sum",
    "elementwise_minimum",
    "elementwise_minimum_backward",
    "variable",
    "input",
    "output",
    "log_softmax",
    "log_softmax_grad",
    "nll",
    "nll_grad",
    "var",
    "adam_bias_correction_factor",
    "assign",
    "bias_add",
    "concat",
    "constant",
    "expand",
    "exp",
    "exp_grad",
    "narrow",
    "narrow_grad",
    "slice",
    "slice_grad",
    "split_like",
    "normal",
    "uniform_int",
    "random_mask_like",
    "sigmoid",
    "sigmoid_grad",
    "silu",
    "silu_grad",
    "scalar_logical_greater",
    "learning_rate_schedule",
    "sgd_update",
    "embedding",
    "embedding_grad",
    "one_hot",
    "hierarchical_parallel_cast",
    "reduce_max_device_stage",
    "reduce_max_global_stage",
]


def test_every_required_op_type_has_a_rule():
    rules = default_rules()
    missing = sorted(t for t in REQUIRED if t not in rules)
    assert not missing, f"ops that would fall back to all-B: {missing}"


def test_docs_table_lists_every_registered_op_type():
    doc = Path(__file__).resolve().parents[3] / "docs" / "op-rules.md"
    text = doc.read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))
    registered = set(default_rules().rules)
    assert registered - listed == set(), f"undocumented: {sorted(registered - listed)}"
    stale = sorted(listed - registered)
    assert not stale, f"documented but unregistered: {stale}"


# ------------------------------------------------------------------ MT5-shaped catalogue

Bt, St, Hd, Ff, Hn, Vc = 16, 64, 512, 1024, 8, 32128  # batch, seq, hidden, ffn, heads, vocab
X = (Bt, St, Hd)
SC = (Bt, Hn, St, St)
T = (Bt * St,)
I64 = "int64"

CATALOGUE = [
    ("variable", {}, {"out": (Hd, Ff)}, {}),
    ("input", {}, {"out": ((Bt, St), I64)}, {}),
    ("output", {"in": (1,)}, {"out": (1,)}, {}),
    ("gather", {"in_0": (Vc, Hd), "indices_0": ((Bt, St), I64)}, {"out_0": X}, {"axis": 0}),
    (
        "rms_norm",
        {"x_0": X, "weight_0": (Hd,)},
        {"y_0": X, "inv_rms_0": (Bt, St)},
        {"normalized_shape": [Hd], "epsilon": 1e-6},
    ),
    ("broadcast_matmul", {"a_0": X, "b_0": (3 * Hd, Hd)}, {"out_0": (Bt, St, 3 * Hd)}, {"transpose_b": True}),
    ("reshape", {"in_0": (Bt, St, Hd)}, {"out_0": (Bt, St, Hn, Hd // Hn)}, {}),
    (
        "transpose",
        {"input_0": (Bt, St, Hn, Hd // Hn)},
        {"output_0": (Bt, Hn, St, Hd // Hn)},
        {"perm": [0, 2, 1, 3]},
    ),
    (
        "batch_matmul",
        {"a_0": (Bt, Hn, St, Hd // Hn), "b_0": (Bt, Hn, St, Hd // Hn)},
        {"out_0": SC},
        {"transpose_b": True},
    ),
    ("broadcast_add", {"x_0": SC, "y_0": (1, Hn, St, St)}, {"z_0": SC}, {}),
    (
        "fused_scale_mask_softmax_dropout",
        {"x_0": SC, "mask_0": ((Bt, 1, St, St), "bool"), "dropout_mask_0": (SC, "bool")},
        {"y_0": SC, "softmax_y_0": SC},
        {},
    ),
    ("softmax", {"in_0": SC}, {"out_0": SC}, {}),
    ("dropout", {"in_0": X}, {"out_0": X, "mask_0": (X, "bool")}, {"rate": 0.1}),
    ("fast_gelu", {"in_0": (Bt, St, Ff)}, {"out_0": (Bt, St, Ff)}, {}),
    ("broadcast_mul", {"x_0": (Bt, St, Ff), "y_0": (Bt, St, Ff)}, {"z_0": (Bt, St, Ff)}, {}),
    ("fused_matmul_bias", {"x_0": X, "weight_0": (Ff, Hd), "bias_0": (Ff,)}, {"out_0": (Bt, St, Ff)}, {}),
    (
        "sparse_softmax_cross_entropy_ms",
        {"prediction_0": (Bt * St, Vc), "label_0": (T, I64)},
        {"prob_0": (Bt * St, Vc), "out_0": T},
        {"depth": Vc},
    ),
    ("reduce_mean", {"input_tensor_0": T}, {"output_tensor_0": ()}, {"axis": [0]}),
    (
        "sparse_softmax_cross_entropy_ms_grad",
        {"label_0": (T, I64), "dy_0": T, "prob_0": (Bt * St, Vc)},
        {"prediction_diff_0": (Bt * St, Vc)},
        {"depth": Vc},
    ),
    ("broadcast_matmul_grad_b", {"a_0": (Bt, St, Ff), "b_0": X}, {"out_0": (Ff, Hd)}, {}),
    ("rms_norm_grad", {"dy_0": X, "x_0": X, "inv_rms_0": (Bt, St), "weight_0": (Hd,)}, {"dx_0": X}, {}),
    ("rms_norm_param_grad", {"dy_0": X, "x_0": X, "inv_rms_0": (Bt, St)}, {"weight_grad_0": (Hd,)}, {}),
    (
        "fused_scale_mask_softmax_dropout_grad",
        {"softmax_y_0": SC, "dy_0": SC, "mask_0": ((Bt, 1, St, St), "bool"), "dropout_mask_0": (SC, "bool")},
        {"dx_0": SC},
        {},
    ),
    (
        "unsorted_segment_sum_like",
        {"data_0": X, "segment_ids_0": ((Bt, St), I64), "like_0": (Vc, Hd)},
        {"out_0": (Vc, Hd)},
        {"axis": 0},
    ),
    ("add_n", {"in_0": X, "in_1": X}, {"out_0": X}, {}),
    ("reduce_sum_like", {"x_0": (Bt, St, Ff), "like_0": (Ff,)}, {"y_0": (Ff,)}, {"axis": [0, 1]}),
    ("cast", {"in_0": ((Hd, Ff), "float32")}, {"out_0": (Hd, Ff)}, {"dtype": "float16"}),
    (
        "adam_update",
        {
            "model_0": ((Ff, Hd), "float32"),
            "model_diff_0": ((Ff, Hd), "float32"),
            "learning_rate_0": ((1,), "float32"),
            "m_0": ((Ff, Hd), "float32"),
            "v_0": ((Ff, Hd), "float32"),
        },
        {},
        {},
    ),
]


@pytest.mark.parametrize("op_type,inputs,outputs,attrs", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_mt5_ops_fit_and_offer_replicated(op_type, inputs, outputs, attrs):
    ctx = make_ctx(op_type, inputs, outputs, attrs, mesh=(4, 2), zero_stage=2)
    sigs = assert_all_fit(ctx)
    got = {str(s) for s in sigs}
    if op_type != "adam_update":  # ZeRO-2 shards the replicated parameter's gradient
        assert replicated(ctx) in got
    assert len(sigs) > 1
