"""Transformer building blocks shared by the model families, written once on the GraphBuilder.

Two styles are covered by :class:`~autopar.models.style.LayerStyle`:

* **HF T5 v1.1 / MT5**: RMSNorm, no biases, attention without 1/sqrt(d) scaling,
  softmax in float32 (``cast``, ``softmax``, ``cast``), a relative position bias
  added to the scores, a gated-GELU FFN (``wi_0``, ``wi_1``, ``wo``);
* **Megatron / LiBai** (GPT, BERT, T5): LayerNorm with bias, linear biases,
  scores scaled by 1/sqrt(d) (``alpha`` of ``batch_matmul``), an additive mask,
  a GELU FFN (``fc1``, ``fc2``).

Both are pre-norm: ``x + dropout(attn(norm(x)))`` then ``x + dropout(mlp(norm(x)))``.
Weights use OneFlow's ``[out, in]`` layout.

Model-level pieces shared by the families: :func:`embedding_sum`,
:func:`layer_stack`, :func:`tied_lm_head` and :func:`training_step` (loss,
backward, AdamW, graph metadata); :func:`lm_trunk` is the body GPT and BERT share
(inputs, Megatron embeddings, the layer stack), which they differ from only in the
attention mask, BERT's token-type embedding and BERT's MLM transform before the head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from autopar.ir.graph import Graph
from autopar.models.builder import GraphBuilder, Param
from autopar.models.config import FamilyConfig, TransformerLMConfig
from autopar.models.style import LayerStyle

__all__ = [
    "LMTrunk",
    "attention",
    "dense",
    "embedding_sum",
    "layer_stack",
    "linear_params",
    "lm_trunk",
    "mlp",
    "norm",
    "tied_lm_head",
    "training_step",
    "transformer_layer",
]


def linear_params(
    b: GraphBuilder, name: str, in_dim: int, out_dim: int, *, bias: bool, weight_decay: float
) -> tuple[Param, Param | None]:
    """``name.weight [out, in]`` (decayed) and optional ``name.bias [out]`` (not decayed)."""
    w = b.param(f"{name}.weight", (out_dim, in_dim), weight_decay=weight_decay)
    bb = b.param(f"{name}.bias", (out_dim,), weight_decay=0.0) if bias else None
    return w, bb


def dense(b: GraphBuilder, x: str, name: str, out_dim: int, *, bias: bool, weight_decay: float) -> str:
    """Parameters of :func:`linear_params`, then ``b.linear`` named ``name``."""
    w, bb = linear_params(b, name, b.shape(x)[-1], out_dim, bias=bias, weight_decay=weight_decay)
    return b.linear(x, w, bb, name=name)


def norm(b: GraphBuilder, x: str, style: LayerStyle, *, name: str) -> str:
    """RMSNorm (``name.weight``) or LayerNorm (``name.weight``, ``name.bias``) over the last dim."""
    hidden = b.shape(x)[-1]
    with b.scope(name):
        if style.norm == "rms":
            w = b.param("weight", (hidden,), weight_decay=0.0)
            return b.rms_norm(x, w, epsilon=style.norm_epsilon, name="rms_norm")
        gamma = b.param("weight", (hidden,), weight_decay=0.0)
        beta = b.param("bias", (hidden,), weight_decay=0.0)
        return b.layer_norm(x, gamma, beta, epsilon=style.norm_epsilon, name="layer_norm")


def attention(
    b: GraphBuilder,
    x_q: str,
    x_kv: str,
    style: LayerStyle,
    *,
    name: str,
    mask_bias: str | None = None,
    position_bias: str | None = None,
    fused_kv: bool = False,
) -> str:
    """Multi-head attention with ``q``, ``k``, ``v``, ``o`` projections.

    ``k`` and ``v`` are separate linears (HF T5) unless ``fused_kv``: then one
    ``key_value`` linear ``[2 * inner, hidden]`` whose output is laid out head-first,
    ``[B, Sk, heads, 2 * head_dim]`` (each head's key then value), transposed to
    ``[B, heads, Sk, 2 * head_dim]`` and cut in two along the last dim (``narrow``):
    LiBai's cross-attention ``key_value`` (``libai/layers/attention.py``: view to
    ``[bsz, -1, num_heads, 2 * head_size]``, permute, ``flow.chunk(2, dim=-1)``) and
    Megatron-LM's.  A column-parallel split of its output is then a split by heads,
    and its input gradient one sum of the key's and the value's.
    Scores ``[B, heads, Sq, Sk]`` get ``position_bias`` (same shape, ``add_n``) when
    given, else ``mask_bias`` (broadcast, ``broadcast_add``).
    """
    bsz, sq, hidden = b.shape(x_q)
    inner = style.heads * style.head_dim
    with b.scope(name):
        heads: dict[str, str] = {}
        projections = (("q", x_q),) if fused_kv else (("q", x_q), ("k", x_kv), ("v", x_kv))
        for proj, src in projections:
            seq = b.shape(src)[1]
            y = dense(b, src, proj, inner, bias=style.bias, weight_decay=style.weight_decay)
            y = b.reshape(y, (bsz, seq, style.heads, style.head_dim), name=f"{proj}.reshape")
            heads[proj] = b.transpose(y, (0, 2, 1, 3), name=f"{proj}.transpose")
        if fused_kv:
            heads.update(_fused_key_value(b, x_kv, style))
        scores = b.matmul(heads["q"], heads["k"], transpose_b=True, alpha=style.alpha, name="scores")
        if position_bias is not None:
            scores = b.add(scores, position_bias, name="position_bias_add")
        elif mask_bias is not None:
            scores = b.broadcast_add(scores, mask_bias, name="mask_add")
        if style.softmax_fp32 and b.dtype(scores) != "float32":
            probs = b.softmax(b.cast(scores, "float32", name="scores_fp32"), name="softmax")
            probs = b.cast(probs, b.dtype(scores), name="probs_cast")
        else:
            probs = b.softmax(scores, name="softmax")
        probs = b.dropout(probs, style.attention_dropout, name="attention_dropout")
        ctx = b.matmul(probs, heads["v"], name="context")
        ctx = b.transpose(ctx, (0, 2, 1, 3), name="context.transpose")
        ctx = b.reshape(ctx, (bsz, sq, inner), name="context.reshape")
        return dense(b, ctx, "o", hidden, bias=style.bias, weight_decay=style.weight_decay)


def _fused_key_value(b: GraphBuilder, x_kv: str, style: LayerStyle) -> dict[str, str]:
    """``k`` and ``v`` ``[B, heads, Sk, head_dim]`` from one head-first ``key_value`` linear
    (see :func:`attention`)."""
    bsz, seq, _ = b.shape(x_kv)
    kv = dense(
        b,
        x_kv,
        "key_value",
        2 * style.heads * style.head_dim,
        bias=style.bias,
        weight_decay=style.weight_decay,
    )
    kv = b.reshape(kv, (bsz, seq, style.heads, 2 * style.head_dim), name="key_value.reshape")
    kv = b.transpose(kv, (0, 2, 1, 3), name="key_value.transpose")
    last = len(b.shape(kv)) - 1
    return {
        proj: b.narrow(kv, last, i * style.head_dim, style.head_dim, name=f"key_value.{proj}")
        for i, proj in enumerate(("k", "v"))
    }


def mlp(b: GraphBuilder, x: str, style: LayerStyle, *, name: str) -> str:
    """Gated FFN ``wo(dropout(act(wi_0 x) * wi_1 x))`` or plain ``fc2(act(fc1 x))``."""
    hidden = b.shape(x)[-1]
    act = b.fast_gelu if style.activation == "fast_gelu" else b.gelu
    wd = style.weight_decay
    with b.scope(name):
        if style.gated:
            w0, b0 = linear_params(b, "wi_0", hidden, style.ffn, bias=style.bias, weight_decay=wd)
            w1, b1 = linear_params(b, "wi_1", hidden, style.ffn, bias=style.bias, weight_decay=wd)
            gate = act(b.linear(x, w0, b0, name="wi_0"), name="act")
            lin = b.linear(x, w1, b1, name="wi_1")
            h = b.broadcast_mul(gate, lin, name="gate_mul")
            h = b.dropout(h, style.hidden_dropout, name="dropout")
            return dense(b, h, "wo", hidden, bias=style.bias, weight_decay=wd)
        h = act(dense(b, x, "fc1", style.ffn, bias=style.bias, weight_decay=wd), name="act")
        return dense(b, h, "fc2", hidden, bias=style.bias, weight_decay=wd)


def transformer_layer(
    b: GraphBuilder,
    x: str,
    style: LayerStyle,
    *,
    name: str,
    self_mask: str | None = None,
    self_position_bias: str | None = None,
    encoder_out: str | None = None,
    cross_mask: str | None = None,
) -> str:
    """One pre-norm layer: self-attention, optional cross-attention to ``encoder_out``, FFN."""
    with b.scope(name):
        h = norm(b, x, style, name="self_attn_norm")
        a = attention(b, h, h, style, name="self_attn", mask_bias=self_mask, position_bias=self_position_bias)
        x = b.add(
            x,
            b.dropout(a, style.hidden_dropout, name="self_attn_dropout"),
            name="self_attn_residual",
        )
        if encoder_out is not None:
            h = norm(b, x, style, name="cross_attn_norm")
            a = attention(
                b,
                h,
                encoder_out,
                style,
                name="cross_attn",
                mask_bias=cross_mask,
                fused_kv=style.fused_cross_kv,
            )
            x = b.add(
                x,
                b.dropout(a, style.hidden_dropout, name="cross_attn_dropout"),
                name="cross_attn_residual",
            )
        h = norm(b, x, style, name="mlp_norm")
        m = mlp(b, h, style, name="mlp")
        return b.add(x, b.dropout(m, style.hidden_dropout, name="mlp_dropout"), name="mlp_residual")


def layer_stack(b: GraphBuilder, x: str, style: LayerStyle, layers: int, **inputs: str | None) -> str:
    """``layers`` transformer layers (``layers.{i}``) and the stack's ``final_norm``.

    ``inputs`` (masks, position bias, encoder output) go to every :func:`transformer_layer`.
    """
    for i in range(layers):
        x = transformer_layer(b, x, style, name=f"layers.{i}", **inputs)
    return norm(b, x, style, name="final_norm")


def embedding_sum(b: GraphBuilder, lookups: Sequence[tuple[str, Param, str]], rate: float) -> str:
    """Megatron embeddings: ``add_n`` of the gathers ``name: table[ids]``, then ``dropout``."""
    x = b.add(*(b.gather(b.use(table), ids, name=name) for name, table, ids in lookups), name="add")
    return b.dropout(x, rate, name="dropout")


@dataclass(frozen=True)
class LMTrunk:
    """What :func:`lm_trunk` leaves for the head and the loss."""

    hidden: str
    """The layer stack's output (after its final norm) ``[B, S, hidden]``."""
    word: Param
    """The word embedding (the head is tied to it)."""
    labels: str
    loss_mask: str


def lm_trunk(
    b: GraphBuilder, cfg: TransformerLMConfig, *, causal: bool, type_vocab: int | None = None
) -> LMTrunk:
    """The Megatron / LiBai GPT and BERT body: inputs (``input_ids``, ``position_ids``,
    ``token_type_ids`` when ``type_vocab``, ``labels``, ``loss_mask``, ``attention_bias``),
    the ``embedding`` scope (word + position (+ token type) gathers summed, dropout) and
    ``cfg.layers`` pre-LN layers.  ``attention_bias`` is a causal mask ``[B, 1, S, S]``
    (GPT) when ``causal``, else a padding mask ``[B, 1, 1, S]`` (BERT)."""
    bsz, seq, h = cfg.batch, cfg.seq, cfg.hidden
    wd = cfg.optimizer.weight_decay
    ids = b.input("input_ids", (bsz, seq), "int64")
    position_ids = b.input("position_ids", (bsz, seq), "int64")
    token_types = b.input("token_type_ids", (bsz, seq), "int64") if type_vocab is not None else None
    labels = b.input("labels", (bsz, seq), "int64")
    loss_mask = b.input("loss_mask", (bsz, seq), "float32")
    mask = b.input("attention_bias", (bsz, 1, seq if causal else 1, seq), cfg.dtype)
    with b.scope("embedding"):
        word = b.param("word_embeddings.weight", (cfg.padded_vocab, h), weight_decay=wd)
        pos = b.param("position_embeddings.weight", (cfg.positions, h), weight_decay=wd)
        lookups = [("word", word, ids), ("position", pos, position_ids)]
        if type_vocab is not None and token_types is not None:
            types = b.param("tokentype_embeddings.weight", (type_vocab, h), weight_decay=wd)
            lookups.append(("tokentype", types, token_types))
        x = embedding_sum(b, lookups, cfg.dropout)
    x = layer_stack(b, x, cfg.style_of_layers(), cfg.layers, self_mask=mask)
    return LMTrunk(x, word, labels, loss_mask)


def tied_lm_head(b: GraphBuilder, x: str, word: Param, *, bias: bool) -> str:
    """Logits ``x @ word^T`` (``matmul``), plus an output ``bias [vocab]`` (``bias_add``) if asked."""
    out_bias = b.param("bias", (word.shape[0],), weight_decay=0.0) if bias else None
    logits = b.broadcast_matmul(x, b.use(word), transpose_b=True, name="matmul")
    if out_bias is not None:
        logits = b.broadcast_add(logits, b.use(out_bias), name="bias_add")
    return logits


def training_step(
    b: GraphBuilder, cfg: FamilyConfig, *, family: str, logits: str, labels: str, loss_mask: str
) -> Graph:
    """LM loss, backward and AdamW (``cfg.optimizer``); the graph with its ``meta`` (not validated)."""
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
            "family": family,
            "config": asdict(cfg),
            "padded_vocab": cfg.padded_vocab,
            "parameters": sum(p.numel for p in b.params),
            "loss": loss,
        }
    )
