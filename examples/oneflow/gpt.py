"""GPT-2 style decoder-only language model in OneFlow (pre-LayerNorm, tied LM head).

``GPTConfig.tiny()`` is a 2-layer model for tests; ``GPTConfig.medium()`` is
gpt2-medium (24 layers, hidden 1024, 16 heads, vocab padded to 50304).

The fused ``c_attn`` output is laid out head-first by default (``qkv_layout="heads"``):
``[b, s, heads, 3 * head_dim]``, each head's q, k, v side by side, as Megatron-LM's
``query_key_value`` (``ParallelAttention``: view to ``[s, b, heads, 3 * head_dim]``, then
``split_tensor_along_last_dim``) and LiBai's ``MultiheadAttention`` (view to
``[b, s, heads, 3 * head_size]``, permute, ``flow.chunk(3, dim=-1)``) lay it out.  A
column-parallel split of the weight's output dimension is then a split by heads.
``qkv_layout="hf"`` is Hugging Face GPT-2's ``[q | k | v]`` (each a ``[heads, head_dim]``
block): there a split of the output dimension gives a rank q's heads but another rank's
k and v, so the head split attention needs is an all-to-all away from it, and Megatron's
scheme (no communication between the QKV projection and the attention output) has no
SBP on that graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import oneflow as flow
import oneflow.nn as nn
from oflayers import Embedding, LayerNorm, Linear, arange, causal_mask, read_param


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50304
    hidden: int = 1024
    heads: int = 16
    layers: int = 24
    max_positions: int = 1024
    dropout_rate: float = 0.0
    fused_layer_norm: bool = False
    """Emit OneFlow's ``layer_norm`` op (CUDA kernels only) instead of the CPU composite."""
    qkv_layout: Literal["heads", "hf"] = "heads"
    """The fused QKV output's layout: head-first as Megatron-LM and LiBai, or HF's [q | k | v]."""

    @classmethod
    def medium(cls, **overrides: object) -> GPTConfig:
        return replace(cls(), **overrides)  # type: ignore[arg-type]

    @classmethod
    def tiny(cls, **overrides: object) -> GPTConfig:
        return replace(cls(vocab_size=512, hidden=64, heads=4, layers=2, max_positions=64), **overrides)  # type: ignore[arg-type]


class Attention(nn.Module):
    def __init__(self, config: GPTConfig, rng) -> None:
        super().__init__()
        self.config = config
        self.c_attn = Linear(config.hidden, 3 * config.hidden, bias=True, rng=rng)
        self.c_proj = Linear(config.hidden, config.hidden, bias=True, rng=rng)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        b, s, h = x.shape
        heads = self.config.heads
        head_dim = h // heads
        if self.config.qkv_layout == "heads":
            # [b, s, heads, 3 * head_dim] -> [b, heads, s, 3 * head_dim], then q | k | v per head
            qkv = self.c_attn(x).reshape(b, s, heads, 3 * head_dim).permute(0, 2, 1, 3)
            q, k, v = flow.chunk(qkv, chunks=3, dim=-1)
        else:
            qkv = self.c_attn(x).reshape(b, s, 3, heads, head_dim)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        scores = flow.matmul(q, k.transpose(2, 3)) * (1.0 / head_dim**0.5)
        weights = flow.softmax(scores + causal_mask(s, s, x), dim=-1)
        out = flow.matmul(weights, v).transpose(1, 2).reshape(b, s, h)
        return self.c_proj(out)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig, rng) -> None:
        super().__init__()
        self.c_fc = Linear(config.hidden, 4 * config.hidden, bias=True, rng=rng)
        self.c_proj = Linear(4 * config.hidden, config.hidden, bias=True, rng=rng)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        return self.c_proj(flow._C.fast_gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, rng) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.hidden, fused=config.fused_layer_norm)
        self.attn = Attention(config, rng)
        self.ln_2 = LayerNorm(config.hidden, fused=config.fused_layer_norm)
        self.mlp = MLP(config, rng)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTLMHeadModel(nn.Module):
    """Returns the mean next-token loss; the LM head reuses ``wte`` (tied)."""

    def __init__(self, config: GPTConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        rng = None if seed is None else np.random.default_rng(seed)
        self.wte = Embedding(config.vocab_size, config.hidden, rng=rng)
        self.wpe = Embedding(config.max_positions, config.hidden, rng=rng)
        self.h = nn.ModuleList([Block(config, rng) for _ in range(config.layers)])
        self.ln_f = LayerNorm(config.hidden, fused=config.fused_layer_norm)

    def forward(self, input_ids: flow.Tensor, labels: flow.Tensor) -> flow.Tensor:
        s = input_ids.shape[1]
        x = self.wte(input_ids) + self.wpe(arange(s, input_ids))
        for block in self.h:
            x = block(x)
        logits = flow._C.matmul(
            self.ln_f(x), read_param(self, self.wte.weight), transpose_a=False, transpose_b=True
        )
        loss = flow._C.sparse_softmax_cross_entropy(
            logits.reshape(-1, self.config.vocab_size), labels.reshape(-1)
        )
        return loss.mean()


def example_inputs(config: GPTConfig, batch: int, seq: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, size=(batch, seq + 1), dtype=np.int64)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()
