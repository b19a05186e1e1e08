"""BERT encoder with a masked-LM head in OneFlow (post-LayerNorm, tied decoder).

``BertConfig.tiny()`` is a 2-layer model for tests; ``BertConfig.large()`` is
bert-large (24 layers, hidden 1024, 16 heads, seq up to 512).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import oneflow as flow
import oneflow.nn as nn
from oflayers import Embedding, LayerNorm, Linear, arange, read_param, zeros_param


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30528
    hidden: int = 1024
    heads: int = 16
    layers: int = 24
    intermediate: int = 4096
    max_positions: int = 512
    type_vocab_size: int = 2
    fused_layer_norm: bool = False
    """Emit OneFlow's ``layer_norm`` op (CUDA kernels only) instead of the CPU composite."""

    @classmethod
    def large(cls, **overrides: object) -> BertConfig:
        return replace(cls(), **overrides)  # type: ignore[arg-type]

    @classmethod
    def tiny(cls, **overrides: object) -> BertConfig:
        cfg = cls(vocab_size=512, hidden=64, heads=4, layers=2, intermediate=256, max_positions=64)
        return replace(cfg, **overrides)  # type: ignore[arg-type]


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig, rng) -> None:
        super().__init__()
        self.config = config
        h = config.hidden
        self.query = Linear(h, h, bias=True, rng=rng)
        self.key = Linear(h, h, bias=True, rng=rng)
        self.value = Linear(h, h, bias=True, rng=rng)

    def forward(self, x: flow.Tensor, mask: flow.Tensor) -> flow.Tensor:
        b, s, h = x.shape
        heads = self.config.heads

        def shape(t: flow.Tensor) -> flow.Tensor:
            return t.reshape(b, s, heads, h // heads).transpose(1, 2)

        q, k, v = shape(self.query(x)), shape(self.key(x)), shape(self.value(x))
        scores = flow.matmul(q, k.transpose(2, 3)) * (1.0 / (h // heads) ** 0.5) + mask
        out = flow.matmul(flow.softmax(scores, dim=-1), v)
        return out.transpose(1, 2).reshape(b, s, h)


class Layer(nn.Module):
    def __init__(self, config: BertConfig, rng) -> None:
        super().__init__()
        h = config.hidden
        self.attention = SelfAttention(config, rng)
        self.attention_output = Linear(h, h, bias=True, rng=rng)
        self.attention_norm = LayerNorm(h, 1e-12, fused=config.fused_layer_norm)
        self.intermediate = Linear(h, config.intermediate, bias=True, rng=rng)
        self.output = Linear(config.intermediate, h, bias=True, rng=rng)
        self.output_norm = LayerNorm(h, 1e-12, fused=config.fused_layer_norm)

    def forward(self, x: flow.Tensor, mask: flow.Tensor) -> flow.Tensor:
        x = self.attention_norm(x + self.attention_output(self.attention(x, mask)))
        return self.output_norm(x + self.output(flow._C.gelu(self.intermediate(x))))


class BertForMaskedLM(nn.Module):
    """Returns the mean MLM loss over every position (labels given for all tokens)."""

    def __init__(self, config: BertConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        rng = None if seed is None else np.random.default_rng(seed)
        h = config.hidden
        self.word_embeddings = Embedding(config.vocab_size, h, rng=rng)
        self.position_embeddings = Embedding(config.max_positions, h, rng=rng)
        self.token_type_embeddings = Embedding(config.type_vocab_size, h, rng=rng)
        self.embeddings_norm = LayerNorm(h, 1e-12, fused=config.fused_layer_norm)
        self.layer = nn.ModuleList([Layer(config, rng) for _ in range(config.layers)])
        self.transform = Linear(h, h, bias=True, rng=rng)
        self.transform_norm = LayerNorm(h, 1e-12, fused=config.fused_layer_norm)
        self.decoder_bias = zeros_param((config.vocab_size,))

    def forward(
        self,
        input_ids: flow.Tensor,
        token_type_ids: flow.Tensor,
        attention_mask: flow.Tensor,
        labels: flow.Tensor,
    ) -> flow.Tensor:
        b, s = input_ids.shape
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(arange(s, input_ids))
            + self.token_type_embeddings(token_type_ids)
        )
        x = self.embeddings_norm(x)
        mask = ((1.0 - attention_mask.to(flow.float32)) * -10000.0).reshape(b, 1, 1, s)
        for layer in self.layer:
            x = layer(x, mask)
        x = self.transform_norm(flow._C.gelu(self.transform(x)))
        logits = flow._C.matmul(
            x, read_param(self, self.word_embeddings.weight), transpose_a=False, transpose_b=True
        )
        logits = logits + read_param(self, self.decoder_bias)
        loss = flow._C.sparse_softmax_cross_entropy(
            logits.reshape(-1, self.config.vocab_size), labels.reshape(-1)
        )
        return loss.mean()


def example_inputs(
    config: BertConfig, batch: int, seq: int, seed: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``input_ids``, ``token_type_ids``, ``attention_mask`` (last quarter padded), ``labels``."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, size=(batch, seq), dtype=np.int64)
    types = np.zeros((batch, seq), dtype=np.int64)
    types[:, seq // 2 :] = 1
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[:, seq - seq // 4 :] = 0
    labels = rng.integers(0, config.vocab_size, size=(batch, seq), dtype=np.int64)
    return ids, types, mask, labels
