"""Public surface of autopar.models: names, overrides, errors, describe, JSON, sizes, timing."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

import autopar.models as models
from autopar.errors import ConfigError
from autopar.ir.graph import Graph, Role
from autopar.models import MODEL_NAMES, T5Config, build, config_for, describe


def test_model_names_and_exports() -> None:
    assert MODEL_NAMES == (
        "mt5-base",
        "t5-base",
        "gpt2-medium",
        "gpt-1.3b",
        "bert-large",
        "tiny-mt5",
        "tiny-t5",
        "tiny-gpt",
        "tiny-bert",
    )
    for name in models.__all__:
        assert hasattr(models, name), name


def test_importing_models_needs_only_numpy() -> None:
    code = (
        "import sys, autopar.models; "
        "heavy = [m for m in ('ortools', 'fastapi', 'redis', 'google.protobuf') "
        "if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mt5_base_op_count_in_range() -> None:
    g = build("mt5-base")
    assert 4000 <= len(g.ops) <= 5500, len(g.ops)


def test_gpt_1_3b_stress_size_grows_linearly_with_layers() -> None:
    g24 = build("gpt-1.3b")
    g48 = build("gpt-1.3b", layers=48)
    g25 = build("gpt-1.3b", layers=25)
    per_layer = len(g25.ops) - len(g24.ops)
    assert 150 <= per_layer <= 250
    # clipping's add_n tree grows by ~1/7 op per parameter, so allow a few ops of slack
    assert abs(len(g48.ops) - len(g24.ops) - 24 * per_layer) <= 24
    assert len(g48.ops) > 8000


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("tiny-mt5", 600, 1000),
        ("tiny-t5", 800, 1300),
        ("tiny-gpt", 300, 600),
        ("tiny-bert", 350, 650),
    ],
)
def test_tiny_op_counts(name: str, low: int, high: int) -> None:
    assert low <= len(build(name).ops) <= high


def test_json_round_trip_is_equal() -> None:
    for name in ("tiny-mt5", "tiny-bert", "mt5-base"):
        g = build(name)
        back = Graph.from_json(g.to_json())
        assert back.to_dict() == g.to_dict()
        assert back.content_hash() == g.content_hash()
        assert back.validate().variables == g.variables


def test_describe_counts() -> None:
    g = build("tiny-gpt")
    d = describe(g)
    assert d["name"] == "tiny-gpt"
    assert d["ops"] == len(g.ops) == sum(d["ops_by_type"].values())
    assert d["ops"] == sum(d["ops_by_role"].values())
    assert d["ops_by_role"]["optimizer"] == d["variables"] == len(g.variables)
    assert d["ops_by_type"]["adam_update"] == d["variables"]
    assert d["tensors"] == len(g.tensors)
    assert d["parameter_bytes"] == 4 * d["parameters"]
    assert list(d["ops_by_type"].values()) == sorted(d["ops_by_type"].values(), reverse=True)
    assert d["activation_bytes"] > 0


def test_t5_aliases_and_explicit_fields() -> None:
    cfg = config_for("mt5-base", layers=3)
    assert isinstance(cfg, T5Config)
    assert (cfg.encoder_layers, cfg.decoder_layers) == (3, 3)
    cfg = config_for("mt5-base", layers=3, decoder_layers=5)
    assert isinstance(cfg, T5Config)
    assert (cfg.encoder_layers, cfg.decoder_layers) == (3, 5)
    cfg = config_for("tiny-mt5", seq=24)
    assert isinstance(cfg, T5Config)
    assert (cfg.encoder_seq, cfg.decoder_seq) == (24, 24)
    g = build("tiny-mt5", encoder_layers=1, decoder_layers=3)
    layers = {tuple(v.op.split(".")[:3]) for v in g.variables if ".layers." in v.op}
    assert sorted(layers) == [
        ("decoder", "layers", "0"),
        ("decoder", "layers", "1"),
        ("decoder", "layers", "2"),
        ("encoder", "layers", "0"),
    ]


def test_shape_overrides_reach_the_tensors() -> None:
    g = build("tiny-mt5", batch=4, encoder_seq=12, decoder_seq=6, hidden=48, heads=3)
    assert g.tensors["encoder_input_ids/out"].shape == (4, 12)
    assert g.tensors["decoder_attention_bias/out"].shape == (4, 1, 6, 6)
    scores = next(op for op in g.ops if op.name == "decoder.layers.0.cross_attn.scores")
    assert g.tensors[scores.outputs["out_0"]].shape == (4, 3, 6, 12)
    q = next(v for v in g.variables if v.op == "encoder.layers.0.self_attn.q.weight")
    assert g.tensors[q.tensor].shape == (3 * 16, 48)


def test_optimizer_overrides_and_attrs() -> None:
    g = build("tiny-gpt", lr=3e-4, weight_decay=0.1, beta2=0.95)
    opt = g.op_by_name["layers.0.mlp.fc1.weight.adam_update"]
    assert opt.attrs["learning_rate_val"] == 3e-4
    assert opt.attrs["weight_decay"] == 0.1
    assert opt.attrs["beta2"] == 0.95
    assert opt.attrs["do_bias_correction"] is True


def test_float32_has_no_casts() -> None:
    g = build("tiny-gpt", dtype="float32")
    assert not any(op.type == "cast" for op in g.ops)
    assert all(t.dtype != "float16" for t in g.tensors.values())


def test_no_dropout_ops_when_dropout_is_zero() -> None:
    n = Counter(op.type for op in build("tiny-mt5", dropout=0.0).ops)
    assert n["dropout"] == n["dropout_grad"] == 0
    assert Counter(op.type for op in build("tiny-mt5").ops)["dropout"] > 0


def test_clipping_can_be_disabled() -> None:
    g = build("tiny-bert", clip_grad_max_norm=None)
    types = {op.type for op in g.ops}
    assert not types & {"scalar_mul_by_tensor", "multi_reduce_sum_pow_abs", "clip_by_scalar_max"}
    for v in g.variables:
        assert v.grad is not None
        assert g.op_by_name[g.producer[v.grad][0]].role is Role.BACKWARD
    with_clip = build("tiny-bert")
    assert len(with_clip.ops) - len(g.ops) >= 2 * len(g.variables)


@pytest.mark.parametrize(
    ("name", "overrides", "code", "fragment"),
    [
        ("gpt-9", {}, "unknown_model", "choose one of"),
        ("tiny-gpt", {"encoder_layers": 2}, "unknown_override", "valid overrides"),
        ("tiny-gpt", {"hidden": 66}, "bad_model_config", "not divisible by 4"),
        ("tiny-gpt", {"layers": 0}, "bad_model_config", "positive integer"),
        ("tiny-gpt", {"layers": True}, "bad_model_config", "positive integer"),
        ("tiny-gpt", {"dropout": 1.0}, "bad_model_config", "[0, 1)"),
        ("tiny-gpt", {"dtype": "int8"}, "bad_model_config", "dtype"),
        ("tiny-gpt", {"seq": 128}, "bad_model_config", "max_position=128"),
        ("tiny-bert", {"seq": 100}, "bad_model_config", "exceeds max_position"),
        ("tiny-t5", {"encoder_seq": 65}, "bad_model_config", "max_position"),
        ("tiny-t5", {"heads": 3}, "bad_model_config", "not divisible by heads"),
        ("tiny-mt5", {"style": "bart"}, "bad_model_config", "style"),
        ("tiny-mt5", {"lr": -1.0}, "bad_model_config", "lr"),
        ("tiny-mt5", {"clip_grad_max_norm": 0}, "bad_model_config", "clip_grad_max_norm"),
    ],
)
def test_config_errors(name: str, overrides: dict[str, object], code: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(name, **overrides)
    assert info.value.code == code
    assert fragment in info.value.message


def test_mt5_allows_any_heads_because_d_kv_is_explicit() -> None:
    g = build("tiny-mt5", heads=3)
    assert g.validate() is g
