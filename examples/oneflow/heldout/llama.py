"""A LLaMA-style causal language model as a OneFlow 0.9 training job (held-out: evaluation).

Written from the public description (Touvron et al. 2023, "LLaMA: Open and
Efficient Foundation Language Models", section 2.2; Hugging Face's
``LlamaForCausalLM``), not from autopar's graph builders or examples:

* pre-normalisation with RMSNorm (Zhang & Sennrich 2019): ``x * rsqrt(mean(x^2) + eps) * g``,
  computed as its composite ops, no bias;
* SwiGLU feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))``, three separate
  bias-free projections;
* rotary position embeddings (Su et al. 2021) on queries and keys, HF's
  ``rotate_half`` form: ``q * cos + cat(-q2, q1) * sin``;
* separate, bias-free ``q``, ``k``, ``v``, ``o`` projections; causal mask from ``tril``;
* an untied LM head; the loss is the shifted next-token cross-entropy.

``LIBAI_LAYOUT`` says how LiBai's ``Linear1D`` / ``VocabEmbedding`` lay each
parameter out on the tensor-parallel axis (``libai/models/llama.py``): q, k, v,
gate, up and the head column-parallel, o and down row-parallel, the embedding
vocab-parallel, norms replicated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import oneflow as flow
import oneflow.nn as nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0


LIBAI_LAYOUT = {
    "embed_tokens.weight": "vocab",
    "q_proj.weight": "col",
    "k_proj.weight": "col",
    "v_proj.weight": "col",
    "o_proj.weight": "row",
    "gate_proj.weight": "col",
    "up_proj.weight": "col",
    "down_proj.weight": "row",
    "lm_head.weight": "col",
}
"""Parameter name suffix -> LiBai's tensor-parallel style; anything else replicated."""


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(flow.ones(hidden_size))
        self.eps = eps

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * flow.rsqrt(variance + self.eps))


def _rotate_half(x: flow.Tensor) -> flow.Tensor:
    half = x.shape[-1] // 2
    return flow.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotary(seq: int, head_dim: int, theta: float, ref: flow.Tensor) -> tuple[flow.Tensor, flow.Tensor]:
    """cos, sin of shape [seq, head_dim] (frequencies repeated over both halves)."""
    place = {"placement": ref.placement, "sbp": [flow.sbp.broadcast] * len(ref.sbp)}
    inv_freq = 1.0 / (theta ** (flow.arange(0, head_dim, 2, dtype=flow.float32, **place) / head_dim))
    positions = flow.arange(seq, dtype=flow.float32, **place)
    freqs = positions.reshape(seq, 1) * inv_freq.reshape(1, head_dim // 2)
    emb = flow.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.head_dim = h // config.num_attention_heads
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)

    def forward(self, x: flow.Tensor, cos: flow.Tensor, sin: flow.Tensor, mask: flow.Tensor) -> flow.Tensor:
        b, s, h = x.shape
        heads = self.config.num_attention_heads

        def split_heads(t: flow.Tensor) -> flow.Tensor:
            return t.view(b, s, heads, self.head_dim).transpose(1, 2)

        q, k, v = split_heads(self.q_proj(x)), split_heads(self.k_proj(x)), split_heads(self.v_proj(x))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        scores = flow.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        probs = flow.softmax(scores, dim=-1)
        out = flow.matmul(probs, v).transpose(1, 2).reshape(b, s, h)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        return self.down_proj(flow.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: flow.Tensor, cos: flow.Tensor, sin: flow.Tensor, mask: flow.Tensor) -> flow.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """``forward(input_ids, labels)`` returns the mean next-token loss."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: flow.Tensor, labels: flow.Tensor) -> flow.Tensor:
        _, s = input_ids.shape
        cfg = self.config
        x = self.embed_tokens(input_ids)
        cos, sin = _rotary(s, cfg.hidden_size // cfg.num_attention_heads, cfg.rope_theta, x)
        place = {"placement": x.placement, "sbp": [flow.sbp.broadcast] * len(x.sbp)}
        mask = (1.0 - flow.ones(s, s, **place).tril()) * -1e9
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))
        shift_logits = logits[:, :-1, :].reshape(-1, cfg.vocab_size)
        shift_labels = labels[:, 1:].reshape(-1)
        return flow.nn.functional.cross_entropy(shift_logits, shift_labels)


def build(batch: int = 8, seq: int = 32, **overrides: int) -> tuple[nn.Module, list[np.ndarray]]:
    """The tiny model and deterministic ``input_ids``, ``labels``."""
    config = LlamaConfig(**overrides)  # type: ignore[arg-type]
    rng = np.random.default_rng(1)
    ids = rng.integers(0, config.vocab_size, size=(batch, seq), dtype=np.int64)
    return LlamaForCausalLM(config), [ids, ids.copy()]
