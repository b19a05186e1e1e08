"""T5 encoder-decoder training graphs: ``mt5`` (HF T5 v1.1 / MT5) and ``t5`` (Megatron / LiBai T5).

``style="mt5"`` (HF ``MT5ForConditionalGeneration`` / T5 v1.1):

* shared word embedding ``[vocab, hidden]`` used by encoder and decoder inputs,
  untied LM head ``[vocab, hidden]``, no biases anywhere;
* RMSNorm (``rms_norm``), attention without 1/sqrt(d) scaling and with the
  softmax in float32, gated-GELU FFN ``wo(gelu_new(wi_0 x) * wi_1 x)``
  (``fast_gelu``: the tanh approximation HF calls ``gelu_new``);
* a relative position bias per stack: layer 0 of each stack owns
  ``relative_attention_bias [buckets, heads]``; the bias is an embedding gather
  of the bucket ids ``[Sq, Sk]`` (an input: bucketing is integer-only, no grad),
  permuted to ``[1, heads, Sq, Sk]``, plus the additive mask, and added to the
  scores of every self-attention layer of that stack (HF ``compute_bias``);
* dropout after the embeddings, in attention, after each block, and at the end
  of each stack.

``style="t5"`` (Megatron / LiBai T5): learned absolute position embeddings
shared by both stacks, LayerNorm with bias, linear biases, scores scaled by
1/sqrt(d), plain GELU FFN, LM head tied to the word embedding plus a bias.

Both build the decoder cross-attention's key and value as separate ``k`` and ``v``
linears (HF's layout) unless ``fused_cross_kv``: then as one ``key_value`` linear
whose output is laid out head-first and cut into key and value (``narrow``), as LiBai
(``libai/layers/attention.py``) and Megatron-LM build it.

Both end with LiBai's masked LM loss over the decoder tokens.  Inputs (``input``
ops): token ids, labels, loss mask, additive attention masks (0 / -10000,
``[B, 1, 1, Se]`` for the encoder, causal ``[B, 1, Sd, Sd]`` for the decoder),
and either relative-position bucket ids or absolute position ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.errors import ConfigError
from autopar.ir.graph import Graph
from autopar.models.builder import GraphBuilder
from autopar.models.config import (
    OptimizerConfig,
    PaddedVocab,
    check_dtype,
    check_max_position,
    check_rate,
    check_sizes,
)
from autopar.models.layers import embedding_sum, layer_stack, tied_lm_head, training_step
from autopar.models.style import LayerStyle

__all__ = ["T5Config", "build_t5"]

STYLES = ("mt5", "t5")


@dataclass(frozen=True)
class T5Config(PaddedVocab):
    """An encoder-decoder T5.  Defaults are MT5-base (HF ``google/mt5-base``)."""

    name: str = "mt5-base"
    """Model name (graph name and error messages)."""
    style: str = "mt5"
    """``mt5``: HF T5 v1.1 / MT5; ``t5``: Megatron / LiBai T5."""
    encoder_layers: int = 12
    """Encoder layers."""
    decoder_layers: int = 12
    """Decoder layers."""
    hidden: int = 768
    """Model width (``d_model``)."""
    heads: int = 12
    """Attention heads."""
    d_kv: int | None = 64
    """Per-head width; None: hidden // heads (Megatron's kv_channels)."""
    ffn: int = 2048
    """FFN inner width (``d_ff``)."""
    vocab: int = 250112
    """Vocabulary size before padding."""
    make_vocab_size_divisible_by: int = 1
    """Pad the embedding rows to a multiple of this (Megatron pads to 128)."""
    batch: int = 16
    """Micro-batch size."""
    encoder_seq: int = 512
    """Encoder sequence length."""
    decoder_seq: int = 128
    """Decoder sequence length."""
    relative_attention_buckets: int = 32
    """Relative position buckets (``mt5`` only)."""
    max_position: int = 512
    """Rows of the absolute position embedding (``t5`` only)."""
    dropout: float = 0.1
    """Dropout rate of hidden states and attention probabilities (0: no dropout ops)."""
    layer_norm_epsilon: float = 1e-6
    """Epsilon of the norms."""
    softmax_fp32: bool = True
    """Compute the attention softmax in float32 (HF T5 does)."""
    fused_cross_kv: bool = False
    """The decoder cross-attention's key and value as one ``key_value`` linear laid out
    head-first, as LiBai and Megatron-LM build it (default: separate ``k`` and ``v``, as HF)."""
    dtype: str = "float16"
    """Compute (activation) dtype; parameters stay float32."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW settings."""

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ConfigError(
                "bad_model_config",
                f"{self.name}: style must be one of {list(STYLES)}, got {self.style!r}",
                field="style",
            )
        check_sizes(
            self,
            (
                "encoder_layers",
                "decoder_layers",
                "hidden",
                "heads",
                "ffn",
                "vocab",
                "make_vocab_size_divisible_by",
                "batch",
                "encoder_seq",
                "decoder_seq",
                "relative_attention_buckets",
                "max_position",
            ),
            optional=("d_kv",),
        )
        if self.d_kv is None and self.hidden % self.heads:
            raise ConfigError(
                "bad_model_config",
                f"{self.name}: hidden ({self.hidden}) is not divisible by heads "
                f"({self.heads}); "
                "change one of them or set d_kv explicitly",
                field="heads",
            )
        check_rate(self.name, "dropout", self.dropout)
        check_dtype(self.name, self.dtype)
        if self.style == "t5":
            longest = max(self.encoder_seq, self.decoder_seq)
            check_max_position(
                self.name, f"sequence length {longest}", longest, self.max_position, "shorter sequences"
            )

    @property
    def head_dim(self) -> int:
        return self.d_kv if self.d_kv is not None else self.hidden // self.heads

    @property
    def inner(self) -> int:
        """Width of q, k, v (heads * head_dim)."""
        return self.heads * self.head_dim

    def style_of_layers(self) -> LayerStyle:
        return LayerStyle.create(
            hf_t5=self.style == "mt5",
            heads=self.heads,
            head_dim=self.head_dim,
            ffn=self.ffn,
            norm_epsilon=self.layer_norm_epsilon,
            dropout=self.dropout,
            weight_decay=self.optimizer.weight_decay,
            softmax_fp32=self.softmax_fp32,
            fused_cross_kv=self.fused_cross_kv,
        )


def build_t5(cfg: T5Config) -> Graph:
    """The training-step graph (forward, backward, AdamW) of ``cfg``; not yet validated."""
    b = GraphBuilder(cfg.name, compute_dtype=cfg.dtype)
    style = cfg.style_of_layers()
    bsz, se, sd, h = cfg.batch, cfg.encoder_seq, cfg.decoder_seq, cfg.hidden
    wd = cfg.optimizer.weight_decay
    mt5 = cfg.style == "mt5"
    act = cfg.dtype

    enc_ids = b.input("encoder_input_ids", (bsz, se), "int64")
    dec_ids = b.input("decoder_input_ids", (bsz, sd), "int64")
    labels = b.input("labels", (bsz, sd), "int64")
    loss_mask = b.input("loss_mask", (bsz, sd), "float32")
    enc_mask = b.input("encoder_attention_bias", (bsz, 1, 1, se), act)
    dec_mask = b.input("decoder_attention_bias", (bsz, 1, sd, sd), act)

    if mt5:
        enc_buckets = b.input("encoder_position_buckets", (se, se), "int64")
        dec_buckets = b.input("decoder_position_buckets", (sd, sd), "int64")
        shared = b.param("shared.weight", (cfg.padded_vocab, h), weight_decay=wd)

        def embed(ids: str, stack: str) -> str:
            x = b.gather(b.use(shared), ids, name=f"{stack}.embed_tokens")
            return b.dropout(x, cfg.dropout, name=f"{stack}.embed_dropout")

    else:
        word = b.param("embedding.word_embeddings.weight", (cfg.padded_vocab, h), weight_decay=wd)
        pos = b.param("embedding.position_embeddings.weight", (cfg.max_position, h), weight_decay=wd)
        enc_pos = b.input("encoder_position_ids", (bsz, se), "int64")
        dec_pos = b.input("decoder_position_ids", (bsz, sd), "int64")
        positions = {"encoder": enc_pos, "decoder": dec_pos}

        def embed(ids: str, stack: str) -> str:
            with b.scope(f"{stack}.embedding"):
                return embedding_sum(
                    b, [("word", word, ids), ("position", pos, positions[stack])], cfg.dropout
                )

    def stack(name: str, layers: int, x: str, *, encoder_out: str | None) -> str:
        self_mask = enc_mask if encoder_out is None else dec_mask
        with b.scope(name):
            bias = None
            if mt5:
                with b.scope("layers.0.self_attn"):
                    buckets = enc_buckets if encoder_out is None else dec_buckets
                    bias = _position_bias(b, cfg, buckets, self_mask)
            x = layer_stack(
                b,
                x,
                style,
                layers,
                self_mask=None if mt5 else self_mask,
                self_position_bias=bias,
                encoder_out=encoder_out,
                cross_mask=enc_mask,
            )
            if mt5:
                x = b.dropout(x, cfg.dropout, name="final_dropout")
            return x

    encoder_out = stack("encoder", cfg.encoder_layers, embed(enc_ids, "encoder"), encoder_out=None)
    decoder_out = stack("decoder", cfg.decoder_layers, embed(dec_ids, "decoder"), encoder_out=encoder_out)

    if mt5:
        lm_head = b.param("lm_head.weight", (cfg.padded_vocab, h), weight_decay=wd)
        logits = b.linear(decoder_out, lm_head, name="lm_head")
    else:
        with b.scope("lm_head"):
            logits = tied_lm_head(b, decoder_out, word, bias=True)
    return training_step(b, cfg, family="t5", logits=logits, labels=labels, loss_mask=loss_mask)


def _position_bias(b: GraphBuilder, cfg: T5Config, buckets: str, mask: str) -> str:
    """HF ``compute_bias`` + mask: ``[B, heads, Sq, Sk]`` in the compute dtype."""
    sq, sk = b.shape(buckets)
    table = b.param(
        "relative_attention_bias.weight",
        (cfg.relative_attention_buckets, cfg.heads),
        weight_decay=cfg.optimizer.weight_decay,
    )
    with b.scope("position_bias"):
        values = b.gather(b.use(table), buckets, name="gather")  # [Sq, Sk, heads]
        values = b.transpose(values, (2, 0, 1), name="transpose")  # [heads, Sq, Sk]
        values = b.reshape(values, (1, cfg.heads, sq, sk), name="unsqueeze")
        return b.broadcast_add(values, mask, name="mask_add")
