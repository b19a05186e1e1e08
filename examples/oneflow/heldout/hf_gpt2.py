"""Held-out job: Hugging Face GPT-2 (``GPT2LMHeadModel``) in OneFlow 0.9.

Written from the public description of HF's ``modeling_gpt2.py``, not from
autopar's own models:

* ``Conv1D`` layers: weight ``[in, out]``, ``y = x.view(-1, in) @ weight + bias``
  viewed back (HF's ``addmm``), every projection with a bias;
* the fused ``c_attn`` projects to ``[q | k | v]`` (HF's ``split(split_size, dim=2)``),
  each split into heads; scores scaled by ``1/sqrt(head_dim)``, causal mask;
* pre-LayerNorm blocks (``ln_1``, ``ln_2``) with weight and bias, a final ``ln_f``;
* the MLP ``c_proj(gelu_new(c_fc(x)))`` (``gelu_new``: the tanh approximation);
* learned position embeddings ``wpe``; the LM head tied to ``wte`` as HF ties it
  (``tie_word_embeddings=True``; ``tied=False`` gives an untied ``lm_head``);
  the loss is the mean next-token cross entropy.

:func:`libai_layout` gives each parameter LiBai's layout on a ``[dp, tp]`` mesh.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import oneflow as flow
import oneflow.nn as nn
from oflayers import factory_kwargs, make_param, read_param


@dataclass(frozen=True)
class HFGPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    tied: bool = True

    @classmethod
    def tiny(cls, **overrides: object) -> HFGPT2Config:
        return replace(cls(vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=4), **overrides)  # type: ignore[arg-type]


class Conv1D(nn.Module):
    """HF's ``Conv1D``: ``[in, out]`` weight, bias, computed on the flattened tokens."""

    def __init__(self, nf: int, nx: int, rng: np.random.Generator | None) -> None:
        super().__init__()
        self.nf = nf
        self.weight = make_param((nx, nf), rng, 0.02)
        self.bias = nn.Parameter(flow.zeros(nf, dtype=flow.float32))

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        *lead, nx = x.shape
        flat = flow.matmul(x.reshape(-1, nx), read_param(self, self.weight)) + read_param(self, self.bias)
        return flat.reshape(*lead, self.nf)


class GPT2LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.d = d
        self.eps = eps
        self.weight = nn.Parameter(flow.ones(d, dtype=flow.float32))
        self.bias = nn.Parameter(flow.zeros(d, dtype=flow.float32))

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        return flow.nn.functional.layer_norm(
            x, (self.d,), read_param(self, self.weight), read_param(self, self.bias), self.eps
        )


class GPT2Attention(nn.Module):
    def __init__(self, config: HFGPT2Config, rng) -> None:
        super().__init__()
        self.config = config
        self.c_attn = Conv1D(3 * config.n_embd, config.n_embd, rng)
        self.c_proj = Conv1D(config.n_embd, config.n_embd, rng)

    def _heads(self, x: flow.Tensor) -> flow.Tensor:
        b, s, _ = x.shape
        return x.reshape(b, s, self.config.n_head, -1).permute(0, 2, 1, 3)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        b, s, h = x.shape
        q, k, v = flow.split(self.c_attn(x), h, dim=2)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        scores = flow.matmul(q, k.transpose(-1, -2)) / float(v.shape[-1]) ** 0.5
        kw = factory_kwargs(x)
        rows = flow.arange(s, dtype=flow.int64, **kw).reshape(s, 1)
        cols = flow.arange(s, dtype=flow.int64, **kw).reshape(1, s)
        scores = scores + ((cols > rows).to(flow.float32) * -1e9).reshape(1, 1, s, s)
        out = flow.matmul(flow.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(b, s, h)
        return self.c_proj(out)


class GPT2MLP(nn.Module):
    def __init__(self, config: HFGPT2Config, rng) -> None:
        super().__init__()
        self.c_fc = Conv1D(4 * config.n_embd, config.n_embd, rng)
        self.c_proj = Conv1D(config.n_embd, 4 * config.n_embd, rng)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        return self.c_proj(flow.nn.functional.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, config: HFGPT2Config, rng) -> None:
        super().__init__()
        self.ln_1 = GPT2LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, rng)
        self.ln_2 = GPT2LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.mlp = GPT2MLP(config, rng)

    def forward(self, x: flow.Tensor) -> flow.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class HFGPT2LMHeadModel(nn.Module):
    """``forward(input_ids, labels)`` returns the mean next-token loss."""

    def __init__(self, config: HFGPT2Config, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        rng = None if seed is None else np.random.default_rng(seed)
        self.wte = make_param((config.vocab_size, config.n_embd), rng, 0.02)
        self.wpe = make_param((config.n_positions, config.n_embd), rng, 0.01)
        self.h = nn.ModuleList([GPT2Block(config, rng) for _ in range(config.n_layer)])
        self.ln_f = GPT2LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.lm_head = None if config.tied else make_param((config.vocab_size, config.n_embd), rng, 0.02)

    def forward(self, input_ids: flow.Tensor, labels: flow.Tensor) -> flow.Tensor:
        s = input_ids.shape[1]
        positions = flow.arange(s, dtype=flow.int64, **factory_kwargs(input_ids))
        x = flow._C.gather(read_param(self, self.wte), input_ids, axis=0)
        x = x + flow._C.gather(read_param(self, self.wpe), positions, axis=0)
        for block in self.h:
            x = block(x)
        head = read_param(self, self.wte if self.lm_head is None else self.lm_head)
        logits = flow._C.matmul(self.ln_f(x), head, transpose_a=False, transpose_b=True)
        loss = flow._C.sparse_softmax_cross_entropy(
            logits.reshape(-1, self.config.vocab_size), labels.reshape(-1)
        )
        return loss.mean()


def libai_layout(name: str, ndim: int) -> str:
    """LiBai's layout of parameter ``name`` on a ``[dp, tp]`` mesh, as N-D SBP text.

    Conv1D weights are ``[in, out]``: column-parallel ``c_attn`` / ``c_fc`` split
    ``out`` (``(B, S(1))``, their biases ``(B, S(0))``), row-parallel ``c_proj``
    splits ``in`` (``(B, S(0))``, its bias ``B``); the vocab-parallel ``wte`` (and an
    untied ``lm_head``) splits the vocabulary; LayerNorms and ``wpe`` are ``B``.
    """
    del ndim
    if name in ("wte", "lm_head"):
        return "(B, S(0))"
    if name.endswith(("c_attn.weight", "c_fc.weight")):
        return "(B, S(1))"
    if name.endswith(("c_attn.bias", "c_fc.bias", "c_proj.weight")):
        return "(B, S(0))"
    return "(B, B)"


def example_inputs(
    config: HFGPT2Config, batch: int = 8, seq: int = 16, seed: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, size=(batch, seq + 1), dtype=np.int64)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()
