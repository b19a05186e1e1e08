"""BERT pre-training (masked LM + next sentence) as a OneFlow 0.9 training job (held-out: evaluation).

Written from the public description (Devlin et al. 2019, "BERT: Pre-training of
Deep Bidirectional Transformers", section 3 and appendix A; Hugging Face's
``BertForPreTraining``), not from autopar's graph builders or examples:

* word + position + token-type embeddings, LayerNorm (``nn.LayerNorm``);
* post-LN encoder layers: separate biased ``query``, ``key``, ``value``, an output
  ``dense`` + residual + LayerNorm; ``intermediate`` (GELU) and ``output`` + residual
  + LayerNorm; additive padding mask from ``attention_mask``;
* the MLM head (``transform``: dense, GELU, LayerNorm; decoder tied to the word
  embeddings, with its own bias) and the NSP head (``pooler``: dense + tanh on the
  first token; ``seq_relationship``: 2 classes); loss = MLM + NSP cross-entropy.

``LIBAI_LAYOUT``: LiBai's BERT (``libai/models/bert_model.py``): query / key /
value and the intermediate dense column-parallel (with their biases), the
attention output and output dense row-parallel, the word embeddings (and so
the tied decoder) vocab-parallel, the rest replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import oneflow as flow
import oneflow.nn as nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 512
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 64
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


LIBAI_LAYOUT = {
    "word_embeddings.weight": "vocab",
    "query.weight": "col",
    "query.bias": "col",
    "key.weight": "col",
    "key.bias": "col",
    "value.weight": "col",
    "value.bias": "col",
    "attention_output.weight": "row",
    "intermediate.weight": "col",
    "intermediate.bias": "col",
    "output.weight": "row",
}
"""Parameter name suffix -> LiBai's tensor-parallel style; anything else replicated."""


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.heads = config.num_attention_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.attention_output = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(h, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, x: flow.Tensor, mask: flow.Tensor) -> flow.Tensor:
        b, s, h = x.shape
        d = h // self.heads

        def heads(t: flow.Tensor) -> flow.Tensor:
            return t.view(b, s, self.heads, d).permute(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = flow.matmul(q, k, transpose_b=True) * (d**-0.5) + mask
        context = flow.matmul(scores.softmax(dim=-1), v).permute(0, 2, 1, 3).reshape(b, s, h)
        x = self.attention_norm(self.attention_output(context) + x)
        inner = flow.nn.functional.gelu(self.intermediate(x))
        return self.output_norm(self.output(inner) + x)


class BertForPreTraining(nn.Module):
    """``forward(input_ids, token_type_ids, attention_mask, mlm_labels, nsp_labels)`` -> loss."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h)
        self.embeddings_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])
        self.pooler = nn.Linear(h, h)
        self.seq_relationship = nn.Linear(h, 2)
        self.transform = nn.Linear(h, h)
        self.transform_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.decoder_bias = nn.Parameter(flow.zeros(config.vocab_size))

    def forward(
        self,
        input_ids: flow.Tensor,
        token_type_ids: flow.Tensor,
        attention_mask: flow.Tensor,
        mlm_labels: flow.Tensor,
        nsp_labels: flow.Tensor,
    ) -> flow.Tensor:
        _, s = input_ids.shape
        place = {"placement": input_ids.placement, "sbp": [flow.sbp.broadcast] * len(input_ids.sbp)}
        positions = flow.arange(s, dtype=flow.int64, **place)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.embeddings_norm(x + self.token_type_embeddings(token_type_ids))
        mask = (1.0 - attention_mask.to(flow.float32).unsqueeze(1).unsqueeze(2)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        pooled = flow.tanh(self.pooler(x[:, 0]))
        nsp = flow.nn.functional.cross_entropy(self.seq_relationship(pooled), nsp_labels)
        t = self.transform_norm(flow.nn.functional.gelu(self.transform(x)))
        logits = flow.matmul(t, self.word_embeddings.weight, transpose_b=True) + self.decoder_bias
        mlm = flow.nn.functional.cross_entropy(logits.view(-1, self.config.vocab_size), mlm_labels.view(-1))
        return mlm + nsp


def build(batch: int = 8, seq: int = 32, **overrides: int) -> tuple[nn.Module, list[np.ndarray]]:
    """The tiny model and deterministic inputs (last quarter of each sequence padded)."""
    config = BertConfig(**overrides)  # type: ignore[arg-type]
    rng = np.random.default_rng(2)
    ids = rng.integers(0, config.vocab_size, size=(batch, seq), dtype=np.int64)
    types = (np.arange(seq)[None, :] >= seq // 2).repeat(batch, 0).astype(np.int64)
    mask = (np.arange(seq)[None, :] < seq - seq // 4).repeat(batch, 0).astype(np.int64)
    mlm = rng.integers(0, config.vocab_size, size=(batch, seq), dtype=np.int64)
    nsp = rng.integers(0, 2, size=(batch,), dtype=np.int64)
    return BertForPreTraining(config), [ids, types, mask, mlm, nsp]
