"""BERT training graphs (Megatron / LiBai BERT style) with the masked-LM head.

* word ``[padded vocab, hidden]``, position ``[max_position, hidden]`` and
  token-type ``[type_vocab, hidden]`` embeddings (three gathers summed by
  ``add_n``), dropout;
* pre-LN layers as in GPT but with a padding mask ``[B, 1, 1, S]``;
* final LayerNorm;
* MLM head: ``dense`` (hidden -> hidden, bias), GELU, LayerNorm, logits tied to
  the word embedding plus an output bias ``[padded vocab]``;
* LiBai's masked LM loss over all positions (the loss mask selects the masked
  tokens).  No pooler / next-sentence head.

``bert-large``: 24 layers, hidden 1024, 16 heads, seq 512, vocab 30522 padded to 30592.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.ir.graph import Graph
from autopar.models.builder import GraphBuilder
from autopar.models.config import OptimizerConfig, TransformerLMConfig
from autopar.models.layers import dense, lm_trunk, norm, tied_lm_head, training_step

__all__ = ["BertConfig", "build_bert"]


@dataclass(frozen=True)
class BertConfig(TransformerLMConfig):
    """A BERT encoder with the MLM head.  Defaults are BERT-large (336M)."""

    name: str = "bert-large"
    """Model name (graph name and error messages)."""
    layers: int = 24
    """Transformer layers."""
    hidden: int = 1024
    """Model width."""
    heads: int = 16
    """Attention heads (hidden must divide by heads)."""
    ffn: int | None = None
    """MLP inner width; None: 4 * hidden."""
    vocab: int = 30522
    """Vocabulary size before padding."""
    make_vocab_size_divisible_by: int = 128
    """Pad the embedding rows to a multiple of this."""
    type_vocab: int = 2
    """Token types (segment A / B)."""
    max_position: int | None = 512
    """Rows of the position embedding; None: seq."""
    batch: int = 16
    """Micro-batch size."""
    seq: int = 512
    """Sequence length."""
    dropout: float = 0.1
    """Hidden and attention dropout (0: no dropout ops)."""
    layer_norm_epsilon: float = 1e-12
    """LayerNorm epsilon (BERT uses 1e-12)."""
    dtype: str = "float16"
    """Compute (activation) dtype; parameters stay float32."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW settings."""


def build_bert(cfg: BertConfig) -> Graph:
    """The training-step graph (forward, backward, AdamW) of ``cfg``; not yet validated."""
    b = GraphBuilder(cfg.name, compute_dtype=cfg.dtype)
    style = cfg.style_of_layers()
    wd = cfg.optimizer.weight_decay
    trunk = lm_trunk(b, cfg, causal=False, type_vocab=cfg.type_vocab)
    with b.scope("lm_head"):
        x = b.gelu(dense(b, trunk.hidden, "dense", cfg.hidden, bias=True, weight_decay=wd), name="act")
        x = norm(b, x, style, name="norm")
        logits = tied_lm_head(b, x, trunk.word, bias=True)
    return training_step(b, cfg, family="bert", logits=logits, labels=trunk.labels, loss_mask=trunk.loss_mask)
