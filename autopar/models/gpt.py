"""GPT training graphs (Megatron / LiBai GPT-2 style, decoder-only).

* word embedding ``[padded vocab, hidden]`` + learned position embedding
  ``[max_position, hidden]`` (gathers of token and position ids, summed by
  ``add_n``), dropout;
* pre-LN layers: LayerNorm with bias, q/k/v/o with biases, scores scaled by
  1/sqrt(d) with an additive causal mask ``[B, 1, S, S]``, softmax, dropout;
  GELU MLP ``fc2(gelu(fc1 x))`` with ``ffn = 4 * hidden`` by default;
* final LayerNorm; LM head tied to the word embedding (no bias);
* LiBai's masked LM loss.

``gpt2-medium``: 24 layers, hidden 1024, 16 heads, vocab 50257 padded to 50304,
seq 1024.  ``gpt-1.3b``: 24 layers by default (48 for the stress test), hidden
2048, 16 heads, seq 2048.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.ir.graph import Graph
from autopar.models.builder import GraphBuilder
from autopar.models.config import OptimizerConfig, TransformerLMConfig
from autopar.models.layers import lm_trunk, tied_lm_head, training_step

__all__ = ["GPTConfig", "build_gpt"]


@dataclass(frozen=True)
class GPTConfig(TransformerLMConfig):
    """A GPT (decoder-only) model.  Defaults are GPT-2 medium (Megatron's 345M)."""

    name: str = "gpt2-medium"
    """Model name (graph name and error messages)."""
    layers: int = 24
    """Transformer layers."""
    hidden: int = 1024
    """Model width."""
    heads: int = 16
    """Attention heads (hidden must divide by heads)."""
    ffn: int | None = None
    """MLP inner width; None: 4 * hidden."""
    vocab: int = 50257
    """Vocabulary size before padding."""
    make_vocab_size_divisible_by: int = 128
    """Pad the embedding rows to a multiple of this (Megatron's default 128)."""
    max_position: int | None = None
    """Rows of the position embedding; None: seq."""
    batch: int = 8
    """Micro-batch size."""
    seq: int = 1024
    """Sequence length."""
    dropout: float = 0.1
    """Hidden and attention dropout (0: no dropout ops)."""
    layer_norm_epsilon: float = 1e-5
    """LayerNorm epsilon."""
    dtype: str = "float16"
    """Compute (activation) dtype; parameters stay float32."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW settings."""


def build_gpt(cfg: GPTConfig) -> Graph:
    """The training-step graph (forward, backward, AdamW) of ``cfg``; not yet validated."""
    b = GraphBuilder(cfg.name, compute_dtype=cfg.dtype)
    trunk = lm_trunk(b, cfg, causal=True)
    with b.scope("lm_head"):
        logits = tied_lm_head(b, trunk.hidden, trunk.word, bias=False)
    return training_step(b, cfg, family="gpt", logits=logits, labels=trunk.labels, loss_mask=trunk.loss_mask)
