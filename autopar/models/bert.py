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
from autopar.models.layers import LayerStyle, linear_params, norm, transformer_layer

__all__ = ["BertConfig", "build_bert"]


@dataclass(frozen=True)
class BertConfig:
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

    def __post_init__(self) -> None:
        for f in (
            "layers",
            "hidden",
            "heads",
            "vocab",
            "make_vocab_size_divisible_by",
            "type_vocab",
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


def build_bert(cfg: BertConfig) -> Graph:
    """The training-step graph (forward, backward, AdamW) of ``cfg``; not yet validated."""
    b = GraphBuilder(cfg.name, compute_dtype=cfg.dtype)
    style = cfg.style_of_layers()
    bsz, seq, h = cfg.batch, cfg.seq, cfg.hidden
    wd = cfg.optimizer.weight_decay

    ids = b.input("input_ids", (bsz, seq), "int64")
    position_ids = b.input("position_ids", (bsz, seq), "int64")
    token_types = b.input("token_type_ids", (bsz, seq), "int64")
    labels = b.input("labels", (bsz, seq), "int64")
    loss_mask = b.input("loss_mask", (bsz, seq), "float32")
    padding = b.input("attention_bias", (bsz, 1, 1, seq), cfg.dtype)

    with b.scope("embedding"):
        word = b.param("word_embeddings.weight", (cfg.padded_vocab, h), weight_decay=wd)
        pos = b.param("position_embeddings.weight", (cfg.positions, h), weight_decay=wd)
        types = b.param("tokentype_embeddings.weight", (cfg.type_vocab, h), weight_decay=wd)
        x = b.add(
            b.gather(b.use(word), ids, name="word"),
            b.gather(b.use(pos), position_ids, name="position"),
            b.gather(b.use(types), token_types, name="tokentype"),
            name="add",
        )
        x = b.dropout(x, cfg.dropout, name="dropout")
    for i in range(cfg.layers):
        x = transformer_layer(b, x, style, name=f"layers.{i}", self_mask=padding)
    x = norm(b, x, style, name="final_norm")

    with b.scope("lm_head"):
        w, bias = linear_params(b, "dense", h, h, bias=True, weight_decay=wd)
        x = b.gelu(b.linear(x, w, bias, name="dense"), name="act")
        x = norm(b, x, style, name="norm")
        out_bias = b.param("bias", (cfg.padded_vocab,), weight_decay=0.0)
        logits = b.broadcast_matmul(x, b.use(word), transpose_b=True, name="matmul")
        logits = b.broadcast_add(logits, b.use(out_bias), name="bias_add")
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
            "family": "bert",
            "config": asdict(cfg),
            "padded_vocab": cfg.padded_vocab,
            "parameters": sum(p.numel for p in b.params),
            "loss": loss,
        }
    )
