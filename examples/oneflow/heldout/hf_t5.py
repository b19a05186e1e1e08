"""Held-out job: an HF-style T5 v1.1 / MT5 encoder-decoder in OneFlow 0.9.

Written from the public description of Hugging Face ``T5ForConditionalGeneration``
with an MT5 / T5 v1.1 configuration (``modeling_t5.py`` and the T5 v1.1 / mT5
release notes), not from autopar's own models:

* every attention has separate bias-free ``q``, ``k``, ``v``, ``o`` linears
  (``[out, in]`` weights) and no ``1/sqrt(d_kv)`` scaling;
* every self-attention layer has its own relative position bias table
  ``relative_attention_bias [num_buckets, heads]`` (bidirectional buckets in the
  encoder, causal ones in the decoder, log-spaced beyond ``num_buckets / 2``);
  cross-attention has none;
* ``T5LayerNorm`` written out as HF writes it: ``weight * x * rsqrt(mean(x^2) + eps)``
  (no mean subtraction, no bias);
* the gated-GELU feed-forward ``wo(gelu_new(wi_0(x)) * wi_1(x))`` (``gelu_new``: the
  tanh approximation);
* a shared input embedding and an untied ``lm_head`` (no ``d_model ** -0.5`` rescale,
  as for untied heads); the loss is the mean token cross entropy.

``HFT5Config.tiny()`` builds in well under a minute on 8 CPU ranks.
:func:`libai_layout` gives each parameter LiBai's layout on a ``[dp, tp]`` mesh
(column-parallel ``q/k/v/wi_0/wi_1/lm_head``, row-parallel ``o/wo``, vocab-parallel
embedding, the rest replicated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import oneflow as flow
import oneflow.nn as nn
from oflayers import factory_kwargs, make_param, read_param


@dataclass(frozen=True)
class HFT5Config:
    vocab_size: int = 250112
    d_model: int = 768
    d_kv: int = 64
    num_heads: int = 12
    d_ff: int = 2048
    num_layers: int = 12
    num_decoder_layers: int = 12
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6

    @classmethod
    def tiny(cls, **overrides: object) -> HFT5Config:
        base = cls(
            vocab_size=512, d_model=128, d_kv=32, num_heads=4, d_ff=256, num_layers=2, num_decoder_layers=2
        )
        return replace(base, **overrides)  # type: ignore[arg-type]


class T5Linear(nn.Module):
    """Bias-free ``y = x @ weight.T`` (``nn.Linear(bias=False)``)."""

    def __init__(self, d_in: int, d_out: int, rng: np.random.Generator | None, std: float) -> None:
        super().__init__()
        self.weight = make_param((d_out, d_in), rng, std)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        return flow._C.matmul(x, read_param(self, self.weight), transpose_a=False, transpose_b=True)


class T5LayerNorm(nn.Module):
    """RMS norm written out as HF's ``T5LayerNorm.forward``."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(flow.ones(d, dtype=flow.float32))
        self.eps = eps

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)  # HF: hidden_states.pow(2).mean(-1, keepdim=True)
        return read_param(self, self.weight) * (x * flow.rsqrt(variance + self.eps))


def relative_position_bucket(
    relative: flow.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> flow.Tensor:
    """HF's ``_relative_position_bucket``: exact buckets for small distances, log-spaced beyond."""
    offset = None
    if bidirectional:
        num_buckets //= 2
        offset = (relative > 0).to(flow.int64) * num_buckets
        relative = flow.abs(relative)
    else:
        relative = -flow.clamp(relative, max=0)
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    scaled = flow.log(relative.to(flow.float32) / max_exact + 1e-6) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).to(flow.int64)
    large = flow.clamp(large, max=num_buckets - 1)
    buckets = flow.where(is_small, relative.to(flow.int64), large.to(flow.int64))
    return buckets if offset is None else buckets + offset


class T5Attention(nn.Module):
    def __init__(self, config: HFT5Config, rng, *, relative_bias: bool, causal: bool) -> None:
        super().__init__()
        self.config = config
        self.causal = causal
        inner = config.num_heads * config.d_kv
        d = config.d_model
        self.q = T5Linear(d, inner, rng, (d * config.d_kv) ** -0.5)
        self.k = T5Linear(d, inner, rng, d**-0.5)
        self.v = T5Linear(d, inner, rng, d**-0.5)
        self.o = T5Linear(inner, d, rng, inner**-0.5)
        self.relative_attention_bias = (
            make_param((config.relative_attention_num_buckets, config.num_heads), rng, d**-0.5)
            if relative_bias
            else None
        )

    def _shape(self, x: flow.Tensor) -> flow.Tensor:
        b, s, _ = x.shape
        return x.reshape(b, s, self.config.num_heads, self.config.d_kv).transpose(1, 2)

    def position_bias(self, q_len: int, k_len: int, ref: flow.Tensor) -> flow.Tensor:
        kw = factory_kwargs(ref)
        context = flow.arange(q_len, dtype=flow.int64, **kw).reshape(q_len, 1)
        memory = flow.arange(k_len, dtype=flow.int64, **kw).reshape(1, k_len)
        buckets = relative_position_bucket(
            memory - context,
            bidirectional=not self.causal,
            num_buckets=self.config.relative_attention_num_buckets,
            max_distance=self.config.relative_attention_max_distance,
        )
        table = read_param(self, self.relative_attention_bias)
        values = flow._C.gather(table, buckets.reshape(-1), axis=0).reshape(q_len, k_len, -1)
        return values.permute(2, 0, 1).unsqueeze(0)  # [1, heads, q, k]

    def forward(self, x: flow.Tensor, kv: flow.Tensor | None = None) -> flow.Tensor:
        b, s, _ = x.shape
        source = x if kv is None else kv
        q, k, v = self._shape(self.q(x)), self._shape(self.k(source)), self._shape(self.v(source))
        scores = flow.matmul(q, k.transpose(2, 3))
        if self.relative_attention_bias is not None:
            scores = scores + self.position_bias(s, source.shape[1], x)
        if self.causal:
            kw = factory_kwargs(x)
            rows = flow.arange(s, dtype=flow.int64, **kw).reshape(s, 1)
            cols = flow.arange(s, dtype=flow.int64, **kw).reshape(1, s)
            scores = scores + ((cols > rows).to(flow.float32) * -1e9).reshape(1, 1, s, s)
        weights = flow.softmax(scores, dim=-1)
        out = flow.matmul(weights, v).transpose(1, 2).reshape(b, s, -1)
        return self.o(out)


class T5GatedFF(nn.Module):
    def __init__(self, config: HFT5Config, rng) -> None:
        super().__init__()
        self.wi_0 = T5Linear(config.d_model, config.d_ff, rng, config.d_model**-0.5)
        self.wi_1 = T5Linear(config.d_model, config.d_ff, rng, config.d_model**-0.5)
        self.wo = T5Linear(config.d_ff, config.d_model, rng, config.d_ff**-0.5)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        gate = flow.nn.functional.gelu(self.wi_0(x), approximate="tanh")
        return self.wo(gate * self.wi_1(x))


class T5Block(nn.Module):
    def __init__(self, config: HFT5Config, rng, *, decoder: bool) -> None:
        super().__init__()
        eps = config.layer_norm_epsilon
        self.self_norm = T5LayerNorm(config.d_model, eps)
        self.self_attn = T5Attention(config, rng, relative_bias=True, causal=decoder)
        self.cross_norm = T5LayerNorm(config.d_model, eps) if decoder else None
        self.cross_attn = T5Attention(config, rng, relative_bias=False, causal=False) if decoder else None
        self.ff_norm = T5LayerNorm(config.d_model, eps)
        self.ff = T5GatedFF(config, rng)

    def forward(self, x: flow.Tensor, memory: flow.Tensor | None = None) -> flow.Tensor:
        x = x + self.self_attn(self.self_norm(x))
        if self.cross_attn is not None and self.cross_norm is not None:
            x = x + self.cross_attn(self.cross_norm(x), memory)
        return x + self.ff(self.ff_norm(x))


class HFT5ForConditionalGeneration(nn.Module):
    """``forward(input_ids, decoder_input_ids, labels)`` returns the mean token loss."""

    def __init__(self, config: HFT5Config, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        rng = None if seed is None else np.random.default_rng(seed)
        self.shared = make_param((config.vocab_size, config.d_model), rng, 1.0)
        self.encoder = nn.ModuleList([T5Block(config, rng, decoder=False) for _ in range(config.num_layers)])
        self.encoder_final_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)
        self.decoder = nn.ModuleList(
            [T5Block(config, rng, decoder=True) for _ in range(config.num_decoder_layers)]
        )
        self.decoder_final_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)
        self.lm_head = T5Linear(config.d_model, config.vocab_size, rng, config.d_model**-0.5)

    def forward(
        self, input_ids: flow.Tensor, decoder_input_ids: flow.Tensor, labels: flow.Tensor
    ) -> flow.Tensor:
        # HF calls the shared embedding once per use: one read of the table each
        x = flow._C.gather(read_param(self, self.shared), input_ids, axis=0)
        for block in self.encoder:
            x = block(x)
        memory = self.encoder_final_norm(x)
        y = flow._C.gather(read_param(self, self.shared), decoder_input_ids, axis=0)
        for block in self.decoder:
            y = block(y, memory)
        logits = self.lm_head(self.decoder_final_norm(y))
        loss = flow._C.sparse_softmax_cross_entropy(
            logits.reshape(-1, self.config.vocab_size), labels.reshape(-1)
        )
        return loss.mean()


_COLUMN = ("q.weight", "k.weight", "v.weight", "wi_0.weight", "wi_1.weight", "lm_head.weight")
_ROW = ("o.weight", "wo.weight")


def libai_layout(name: str, ndim: int) -> str:
    """LiBai's layout of parameter ``name`` on a ``[dp, tp]`` mesh, as N-D SBP text.

    Column-parallel weights ``[out, in]`` split ``out`` over ``tp`` (``(B, S(0))``),
    row-parallel ones split ``in`` (``(B, S(1))``), the vocab-parallel embedding
    splits the vocabulary (``(B, S(0))``); norms and position-bias tables are ``B``.
    """
    del ndim
    if name == "shared" or name.endswith(_COLUMN):
        return "(B, S(0))"
    if name.endswith(_ROW):
        return "(B, S(1))"
    return "(B, B)"


def example_inputs(
    config: HFT5Config, batch: int = 8, seq: int = 16, decoder_seq: int = 8, seed: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, size=(batch, seq), dtype=np.int64)
    target = rng.integers(0, config.vocab_size, size=(batch, decoder_seq + 1), dtype=np.int64)
    return ids, target[:, :-1].copy(), target[:, 1:].copy()
