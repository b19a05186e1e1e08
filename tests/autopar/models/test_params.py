"""Parameter counts of every model against hand-computed formulas."""

from __future__ import annotations

import math

import pytest

from autopar.models import build, describe


def param_count(name: str, **overrides: object) -> int:
    g = build(name, **overrides)
    n = sum(math.prod(g.tensors[v.tensor].shape) for v in g.variables)
    assert n == describe(g)["parameters"] == g.meta["parameters"]
    return n


def mt5(v: int, h: int, inner: int, f: int, le: int, ld: int, buckets: int, heads: int) -> int:
    """Shared embedding, untied LM head, 2 relative biases, layers (attention, gated FFN, norms)."""
    enc_layer = 4 * h * inner + 3 * h * f + 2 * h
    dec_layer = 8 * h * inner + 3 * h * f + 3 * h
    return 2 * v * h + 2 * buckets * heads + le * enc_layer + h + ld * dec_layer + h


def megatron_layer(h: int, f: int, cross: bool = False) -> int:
    """q,k,v,o with biases; fc1, fc2 with biases; LayerNorms (weight + bias)."""
    attn = 4 * h * h + 4 * h
    mlp = 2 * h * f + f + h
    ln = 2 * h
    return (2 if cross else 1) * attn + mlp + (3 if cross else 2) * ln


def test_mt5_base_is_582m() -> None:
    expected = mt5(250112, 768, 12 * 64, 2048, 12, 12, 32, 12)
    assert expected == 582_401_280
    assert param_count("mt5-base") == expected


def test_tiny_mt5_exact() -> None:
    assert param_count("tiny-mt5") == mt5(512, 64, 4 * 16, 128, 2, 2, 8, 4) == 262_976


def test_mt5_inner_width_follows_heads_times_d_kv() -> None:
    assert param_count("tiny-mt5", heads=2, d_kv=8) == mt5(512, 64, 16, 128, 2, 2, 8, 2)


def test_t5_base_megatron_style() -> None:
    v, p, h, f = 32128, 512, 768, 3072
    encoder = 12 * megatron_layer(h, f) + 2 * h
    decoder = 12 * megatron_layer(h, f, cross=True) + 2 * h
    expected = (v + p) * h + v + encoder + decoder
    assert param_count("t5-base") == expected
    assert 220e6 < expected < 226e6


def test_tiny_t5_exact() -> None:
    v, p, h, f = 512, 64, 64, 256
    encoder = 2 * megatron_layer(h, f) + 2 * h
    decoder = 2 * megatron_layer(h, f, cross=True) + 2 * h
    expected = (v + p) * h + v + encoder + decoder
    assert param_count("tiny-t5") == expected == 271_104


def gpt(v: int, p: int, h: int, f: int, layers: int) -> int:
    return (v + p) * h + layers * megatron_layer(h, f) + 2 * h


def test_gpt2_medium_pads_the_vocab() -> None:
    g = build("gpt2-medium")
    assert g.meta["padded_vocab"] == 50304
    word = next(v for v in g.variables if v.op == "embedding.word_embeddings.weight")
    assert g.tensors[word.tensor].shape == (50304, 1024)
    assert param_count("gpt2-medium") == gpt(50304, 1024, 1024, 4096, 24)


def test_gpt_1_3b() -> None:
    n = param_count("gpt-1.3b")
    assert n == gpt(50304, 2048, 2048, 8192, 24)
    assert 1.3e9 < n < 1.33e9
    assert param_count("gpt-1.3b", layers=48) == gpt(50304, 2048, 2048, 8192, 48)


def test_tiny_gpt_exact() -> None:
    assert param_count("tiny-gpt") == gpt(512, 64, 64, 256, 2) == 136_960


def bert(v: int, p: int, types: int, h: int, f: int, layers: int) -> int:
    head = h * h + h + 2 * h + v  # dense, LayerNorm, output bias (decoder tied to word embeddings)
    return (v + p + types) * h + layers * megatron_layer(h, f) + 2 * h + head


def test_bert_large() -> None:
    n = param_count("bert-large")
    assert n == bert(30592, 512, 2, 1024, 4096, 24)
    assert 334e6 < n < 337e6


def test_tiny_bert_exact() -> None:
    assert param_count("tiny-bert") == bert(512, 64, 2, 64, 256, 2) == 141_888


@pytest.mark.parametrize(
    ("overrides", "formula_args"),
    [
        ({"hidden": 128}, (512, 64, 128, 512, 2)),  # ffn defaults to 4 * hidden
        ({"layers": 3}, (512, 64, 64, 256, 3)),
        ({"ffn": 96}, (512, 64, 64, 96, 2)),
        ({"vocab": 700}, (768, 64, 64, 256, 2)),  # padded to a multiple of 128
        ({"seq": 64}, (512, 64, 64, 256, 2)),  # max_position stays 64
    ],
)
def test_overrides_change_the_count_as_the_formula_says(
    overrides: dict[str, int], formula_args: tuple[int, int, int, int, int]
) -> None:
    assert param_count("tiny-gpt", **overrides) == gpt(*formula_args)
