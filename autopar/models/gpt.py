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

import math
from dataclasses import asdict, dataclass, field

from autopar.errors import ConfigError
from autopar.graph import Graph
from autopar.models.builder import GraphBuilder
from autopar.models.config import (
    OptimizerConfig,
    check_divisible,
    check_dtype,
    check_positive_int,
    check_rate,
    padded_vocab,
)
from autopar.models.layers import LayerStyle, norm, transformer_layer

__all__ = ["GPTConfig", "build_gpt"]


@dataclass(frozen=True)
class GPTConfig:
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

    def __post_init__(self) -> None:
        for f in (
            "layers",
            "hidden",
            "heads",
            "vocab",
            "make_vocab_size_divisible_by",
            "batch",
            "seq",
        ):
            check_positive_int(self.name, f, getattr(self, f))
        for f in ("ffn", "max_position"):
            if getattr(self, f) is not None:
                check_positive_int(self.name, f, getattr(self, f))
        check_divisible(self.name, "hidden", self.hidden, self.heads, "change hidden or heads")
        check_rate(self.name, "dropout", self.dropout)
        check_dtype(self.name, self.dtype)
        if self.max_position is not None and self.seq > self.max_position:
            raise ConfigError(
                "bad_model_config",
                f"{self.name}: seq ({self.seq}) exceeds max_position ({self.max_position}); "
                f"pass max_position={self.seq} or a shorter seq",
                field="max_position",
            )

    @property
    def ffn_dim(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def positions(self) -> int:
        return self.max_position if self.max_position is not None else self.seq

    @property
    def padded_vocab(self) -> int:
        return padded_vocab(self.vocab, self.make_vocab_size_divisible_by)

    def style_of_layers(self) -> LayerStyle:
        head_dim = self.hidden // self.heads
        return LayerStyle(
            heads=self.heads,
            head_dim=head_dim,
            ffn=self.ffn_dim,
            norm="layer",
            norm_epsilon=self.layer_norm_epsilon,
            bias=True,
            gated=False,
            activation="gelu",
            alpha=1.0 / math.sqrt(head_dim),
            softmax_fp32=False,
            hidden_dropout=self.dropout,
            attention_dropout=self.dropout,
            weight_decay=self.optimizer.weight_decay,
        )


def build_gpt(cfg: GPTConfig) -> Graph:
    """The training-step graph (forward, backward, AdamW) of ``cfg``; not yet validated."""
    b = GraphBuilder(cfg.name, compute_dtype=cfg.dtype)
    style = cfg.style_of_layers()
    bsz, seq, h = cfg.batch, cfg.seq, cfg.hidden
    wd = cfg.optimizer.weight_decay

    ids = b.input("input_ids", (bsz, seq), "int64")
    position_ids = b.input("position_ids", (bsz, seq), "int64")
    labels = b.input("labels", (bsz, seq), "int64")
    loss_mask = b.input("loss_mask", (bsz, seq), "float32")
    causal = b.input("attention_bias", (bsz, 1, seq, seq), cfg.dtype)

    with b.scope("embedding"):
        word = b.param("word_embeddings.weight", (cfg.padded_vocab, h), weight_decay=wd)
        pos = b.param("position_embeddings.weight", (cfg.positions, h), weight_decay=wd)
        x = b.add(
            b.gather(b.use(word), ids, name="word"),
            b.gather(b.use(pos), position_ids, name="position"),
            name="add",
        )
        x = b.dropout(x, cfg.dropout, name="dropout")
    for i in range(cfg.layers):
        x = transformer_layer(b, x, style, name=f"layers.{i}", self_mask=causal)
    x = norm(b, x, style, name="final_norm")
    logits = b.broadcast_matmul(x, b.use(word), transpose_b=True, name="lm_head.matmul")
    loss = b.lm_loss(logits, labels, loss_mask, name="loss")

    b.backward(loss)
    opt = cfg.optimizer
    b.optimizer(
        lr=opt.lr,
        beta1=opt.beta1,
        beta2=opt.beta2,
        epsilon=opt.epsilon,
        clip_grad_max_norm=opt.clip_grad_max_norm,
        clip_grad_norm_type=opt.clip_grad_norm_type,
    )
    return b.build(
        meta={
            "model": cfg.name,
            "family": "gpt",
            "config": asdict(cfg),
            "padded_vocab": cfg.padded_vocab,
            "parameters": sum(p.numel for p in b.params),
            "loss": loss,
        }
    )
