"""MT5 (HF T5 v1.1 style) in OneFlow, for training jobs that autopar plans.

What makes it MT5 rather than the original T5: RMSNorm (T5 layer norm: no mean,
no bias), relative position bias (bucketed relative positions looked up in an
embedding in the first layer of each stack, shared by the later layers and added
to the attention scores), gated-GELU feed-forward (``wo(gelu_tanh(wi_0 x) * wi_1 x)``),
no biases anywhere, an untied LM head, and no ``1/sqrt(d)`` attention scaling.

Module and parameter names follow HuggingFace's ``MT5ForConditionalGeneration``
(``encoder.block.0.layer.0.SelfAttention.q.weight`` ...), so OneFlow's op names
in the exported job read like the HF model.

``fused_cross_kv=True`` builds each decoder cross-attention's key and value as one
``EncDecAttention.key_value`` linear ``[2 * inner, d_model]`` laid out head-first, as
LiBai does (``libai/layers/attention.py``, ``MultiheadAttention`` with
``is_cross_attention``: view to ``[b, s, heads, 2 * d_kv]``, permute, ``flow.chunk(2,
dim=-1)``) and Megatron-LM's ``key_value``; a column-parallel split of it is a split
by heads.  The default keeps HF's separate ``k`` and ``v``.

Sizes: :meth:`MT5Config.base` is mt5-base (12+12 layers, hidden 768, 12 heads,
d_kv 64, d_ff 2048, vocab 250112); :meth:`MT5Config.tiny` is a 2+2-layer model
for tests.  Build with ``MT5ForConditionalGeneration(config, seed=0)``;
``seed=None`` leaves parameters uninitialised (enough to build and export a job).

Run ``python mt5.py --size tiny`` to build the training job on one CPU rank and
print its op count.

Why this model is written twice (here and in ``autopar/models/t5.py``, ``style="mt5"``):
they are one structure in two languages, and neither can import the other.  This file is
a OneFlow ``nn.Module`` that OneFlow traces into a job (the OneFlow venv, Python 3.10,
numpy 1.x); ``autopar/models/t5.py`` writes the same step's op graph directly, without
OneFlow (the core, which must not need it).  They differ where a OneFlow job differs from
a hand-written graph: OneFlow adds its own ops (``repeat``/``acc`` under
accumulation, ZeRO casts, the optimizer's ``adam_update``), names ops after the module
path, and builds the loss through its own ``sparse_softmax_cross_entropy``; the relative
position bias's bucket ids are an input in both.  A change to the structure belongs in both
files; no test ties them yet.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

import numpy as np
import oneflow as flow
import oneflow.nn as nn
from oflayers import Embedding, Linear, RMSNorm, arange, causal_mask


@dataclass(frozen=True)
class MT5Config:
    """MT5 sizes.  ``dropout_rate`` defaults to 0 so runs are deterministic."""

    vocab_size: int = 250112
    d_model: int = 768
    d_kv: int = 64
    num_heads: int = 12
    d_ff: int = 2048
    num_layers: int = 12
    num_decoder_layers: int = 12
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.0
    layer_norm_epsilon: float = 1e-6
    fused_rms_norm: bool = False
    """Emit OneFlow's fused ``rms_norm`` (CUDA kernels only) instead of the CPU composite."""
    fused_cross_kv: bool = False
    """Cross-attention key and value as one head-first ``key_value`` linear (LiBai's layout)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "d_kv", "num_heads", "d_ff", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"MT5Config.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.d_kv

    @classmethod
    def base(cls, **overrides: object) -> MT5Config:
        return replace(cls(), **overrides)  # type: ignore[arg-type]

    @classmethod
    def tiny(cls, **overrides: object) -> MT5Config:
        cfg = cls(
            vocab_size=512,
            d_model=64,
            d_kv=16,
            num_heads=4,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=32,
        )
        return replace(cfg, **overrides)  # type: ignore[arg-type]


def relative_position_bucket(
    relative_position: flow.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> flow.Tensor:
    """HF T5's bucketing of ``key - query`` positions (int64 tensor in, bucket ids out).

    Small distances get their own bucket, larger ones share log-spaced buckets up
    to ``max_distance``.  The distance is clamped to >= 1 before the log (HF takes
    ``log(0)`` and discards it with ``where``; the result is the same).
    """
    buckets: flow.Tensor | None = None
    if bidirectional:
        num_buckets //= 2
        buckets = (relative_position > 0).to(flow.int64) * num_buckets
        relative_position = flow.abs(relative_position)
    else:
        relative_position = flow.clamp(relative_position, max=0) * -1
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    scaled = flow.log(flow.clamp(relative_position.to(flow.float32), min=1.0) / max_exact)
    scaled = scaled / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    if_large = flow.clamp(max_exact + scaled.to(flow.int64), max=num_buckets - 1)
    chosen = flow.where(is_small, relative_position, if_large)
    return chosen if buckets is None else buckets + chosen


class T5Attention(nn.Module):
    """Multi-head attention without scaling or biases; optional relative position bias.

    ``fused_kv``: key and value from one head-first ``key_value`` linear (see the module
    docstring) instead of ``k`` and ``v``.
    """

    def __init__(
        self,
        config: MT5Config,
        *,
        has_relative_attention_bias: bool,
        is_decoder: bool,
        rng: np.random.Generator | None,
        fused_kv: bool = False,
    ) -> None:
        super().__init__()
        self.config = config
        self.is_decoder = is_decoder
        self.has_relative_attention_bias = has_relative_attention_bias
        self.fused_kv = fused_kv
        inner, d = config.inner_dim, config.d_model
        self.q = Linear(d, inner, rng=rng, std=(d * config.d_kv) ** -0.5)
        if fused_kv:
            self.key_value = Linear(d, 2 * inner, rng=rng, std=d**-0.5)
        else:
            self.k = Linear(d, inner, rng=rng, std=d**-0.5)
            self.v = Linear(d, inner, rng=rng, std=d**-0.5)
        self.o = Linear(inner, d, rng=rng, std=inner**-0.5)
        if has_relative_attention_bias:
            self.relative_attention_bias = Embedding(
                config.relative_attention_num_buckets, config.num_heads, rng=rng, std=d**-0.5
            )

    def compute_bias(self, query_length: int, key_length: int, ref: flow.Tensor) -> flow.Tensor:
        """Position bias ``[1, heads, q, k]`` from bucketed relative positions."""
        context = arange(query_length, ref).reshape(query_length, 1)
        memory = arange(key_length, ref).reshape(1, key_length)
        buckets = relative_position_bucket(
            memory - context,
            bidirectional=not self.is_decoder,
            num_buckets=self.config.relative_attention_num_buckets,
            max_distance=self.config.relative_attention_max_distance,
        )
        values = self.relative_attention_bias(buckets)  # [q, k, heads]
        return values.permute(2, 0, 1).unsqueeze(0)

    def _shape(self, x: flow.Tensor, batch: int) -> flow.Tensor:
        return x.reshape(batch, -1, self.config.num_heads, self.config.d_kv).transpose(1, 2)

    def forward(
        self,
        hidden: flow.Tensor,
        key_value: flow.Tensor | None = None,
        position_bias: flow.Tensor | None = None,
    ) -> tuple[flow.Tensor, flow.Tensor | None]:
        batch, q_len = hidden.shape[0], hidden.shape[1]
        source = hidden if key_value is None else key_value
        q = self._shape(self.q(hidden), batch)
        if self.fused_kv:
            # [b, s, heads, 2 * d_kv] -> [b, heads, s, 2 * d_kv], then each head's key | value
            kv = self.key_value(source).reshape(batch, -1, self.config.num_heads, 2 * self.config.d_kv)
            k, v = flow.chunk(kv.permute(0, 2, 1, 3), chunks=2, dim=-1)
        else:
            k = self._shape(self.k(source), batch)
            v = self._shape(self.v(source), batch)
        scores = flow.matmul(q, k.transpose(2, 3))  # [b, h, q, k]
        if position_bias is None and self.has_relative_attention_bias:
            position_bias = self.compute_bias(q_len, source.shape[1], hidden)
            if self.is_decoder:
                position_bias = position_bias + causal_mask(q_len, source.shape[1], hidden)
        if position_bias is not None:
            scores = scores + position_bias
        weights = flow.softmax(scores, dim=-1)
        if self.config.dropout_rate > 0:
            weights = flow.nn.functional.dropout(weights, p=self.config.dropout_rate, training=self.training)
        out = flow.matmul(weights, v).transpose(1, 2).reshape(batch, q_len, self.config.inner_dim)
        return self.o(out), position_bias


class T5LayerSelfAttention(nn.Module):
    def __init__(
        self, config: MT5Config, *, has_relative_attention_bias: bool, is_decoder: bool, rng
    ) -> None:
        super().__init__()
        self.SelfAttention = T5Attention(
            config, has_relative_attention_bias=has_relative_attention_bias, is_decoder=is_decoder, rng=rng
        )
        self.layer_norm = RMSNorm(config.d_model, config.layer_norm_epsilon, fused=config.fused_rms_norm)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, hidden: flow.Tensor, position_bias: flow.Tensor | None):
        out, position_bias = self.SelfAttention(self.layer_norm(hidden), position_bias=position_bias)
        return hidden + self.dropout(out), position_bias


class T5LayerCrossAttention(nn.Module):
    def __init__(self, config: MT5Config, rng) -> None:
        super().__init__()
        self.EncDecAttention = T5Attention(
            config,
            has_relative_attention_bias=False,
            is_decoder=True,
            rng=rng,
            fused_kv=config.fused_cross_kv,
        )
        self.layer_norm = RMSNorm(config.d_model, config.layer_norm_epsilon, fused=config.fused_rms_norm)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, hidden: flow.Tensor, encoder_hidden: flow.Tensor) -> flow.Tensor:
        out, _ = self.EncDecAttention(self.layer_norm(hidden), key_value=encoder_hidden)
        return hidden + self.dropout(out)


class T5DenseGatedActDense(nn.Module):
    """``wo(gelu_tanh(wi_0 x) * wi_1 x)``: MT5's gated-GELU FFN."""

    def __init__(self, config: MT5Config, rng) -> None:
        super().__init__()
        d, f = config.d_model, config.d_ff
        self.wi_0 = Linear(d, f, rng=rng, std=d**-0.5)
        self.wi_1 = Linear(d, f, rng=rng, std=d**-0.5)
        self.wo = Linear(f, d, rng=rng, std=f**-0.5)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        hidden = flow._C.fast_gelu(self.wi_0(x)) * self.wi_1(x)
        return self.wo(self.dropout(hidden))


class T5LayerFF(nn.Module):
    def __init__(self, config: MT5Config, rng) -> None:
        super().__init__()
        self.DenseReluDense = T5DenseGatedActDense(config, rng)
        self.layer_norm = RMSNorm(config.d_model, config.layer_norm_epsilon, fused=config.fused_rms_norm)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, hidden: flow.Tensor) -> flow.Tensor:
        return hidden + self.dropout(self.DenseReluDense(self.layer_norm(hidden)))


class T5Block(nn.Module):
    def __init__(self, config: MT5Config, *, is_decoder: bool, first: bool, rng) -> None:
        super().__init__()
        self.is_decoder = is_decoder
        layers: list[nn.Module] = [
            T5LayerSelfAttention(config, has_relative_attention_bias=first, is_decoder=is_decoder, rng=rng)
        ]
        if is_decoder:
            layers.append(T5LayerCrossAttention(config, rng))
        layers.append(T5LayerFF(config, rng))
        self.layer = nn.ModuleList(layers)

    def forward(self, hidden, position_bias=None, encoder_hidden=None):
        hidden, position_bias = self.layer[0](hidden, position_bias)
        if self.is_decoder:
            hidden = self.layer[1](hidden, encoder_hidden)
        return self.layer[-1](hidden), position_bias


class T5Stack(nn.Module):
    def __init__(self, config: MT5Config, embed_tokens: Embedding, *, is_decoder: bool, rng) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        n = config.num_decoder_layers if is_decoder else config.num_layers
        self.block = nn.ModuleList(
            [T5Block(config, is_decoder=is_decoder, first=i == 0, rng=rng) for i in range(n)]
        )
        self.final_layer_norm = RMSNorm(
            config.d_model, config.layer_norm_epsilon, fused=config.fused_rms_norm
        )
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, input_ids: flow.Tensor, encoder_hidden: flow.Tensor | None = None) -> flow.Tensor:
        hidden = self.dropout(self.embed_tokens(input_ids))
        position_bias = None
        for block in self.block:
            hidden, position_bias = block(hidden, position_bias, encoder_hidden)
        return self.dropout(self.final_layer_norm(hidden))


class MT5ForConditionalGeneration(nn.Module):
    """Encoder-decoder with a shared input embedding and an untied LM head; returns the mean loss."""

    def __init__(self, config: MT5Config, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        rng = None if seed is None else np.random.default_rng(seed)
        self.shared = Embedding(config.vocab_size, config.d_model, rng=rng, std=1.0)
        self.encoder = T5Stack(config, self.shared, is_decoder=False, rng=rng)
        self.decoder = T5Stack(config, self.shared, is_decoder=True, rng=rng)
        self.lm_head = Linear(config.d_model, config.vocab_size, rng=rng, std=config.d_model**-0.5)

    def forward(
        self, input_ids: flow.Tensor, decoder_input_ids: flow.Tensor, labels: flow.Tensor
    ) -> flow.Tensor:
        encoder_hidden = self.encoder(input_ids)
        sequence = self.decoder(decoder_input_ids, encoder_hidden)
        logits = self.lm_head(sequence)
        vocab = self.config.vocab_size
        loss = flow._C.sparse_softmax_cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
        return loss.mean()


def example_inputs(
    config: MT5Config, batch: int, enc_len: int, dec_len: int, seed: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deterministic ids: ``input_ids [b, enc]``, ``decoder_input_ids [b, dec]``, ``labels [b, dec]``."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, size=(batch, enc_len), dtype=np.int64)
    dec = rng.integers(0, config.vocab_size, size=(batch, dec_len), dtype=np.int64)
    labels = np.concatenate([dec[:, 1:], rng.integers(0, config.vocab_size, (batch, 1))], axis=1)
    return ids, dec, labels.astype(np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["tiny", "base"], default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--enc-len", type=int, default=32)
    parser.add_argument("--dec-len", type=int, default=16)
    parser.add_argument(
        "--fused-cross-kv", action="store_true", help="one head-first key_value linear per cross-attention"
    )
    args = parser.parse_args()

    from autopar.bridges.oneflow import make_train_graph

    options = {"fused_cross_kv": args.fused_cross_kv}
    config = MT5Config.tiny(**options) if args.size == "tiny" else MT5Config.base(**options)
    model = MT5ForConditionalGeneration(config, seed=0 if args.size == "tiny" else None)
    placement = flow.placement("cpu", ranks=[0])
    model = model.to_global(placement, flow.sbp.broadcast)
    inputs = [
        flow.tensor(a).to_global(placement, flow.sbp.broadcast)
        for a in example_inputs(config, args.batch, args.enc_len, args.dec_len)
    ]
    graph = make_train_graph(model, flow.optim.AdamW(model.parameters(), lr=1e-3))
    graph.build_graph(*inputs)
    print(f"MT5 ({args.size}): {len(graph._full_job_proto.net.op)} ops in the training job")


if __name__ == "__main__":
    main()
