"""How one transformer layer is built (:class:`LayerStyle`): the HF T5 v1.1 / MT5 style or the
Megatron / LiBai one (:mod:`autopar.models.layers` builds both)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LayerStyle"]


@dataclass(frozen=True)
class LayerStyle:
    """How one transformer layer is built."""

    heads: int
    head_dim: int
    ffn: int
    norm: str  # "rms" | "layer"
    norm_epsilon: float
    bias: bool
    gated: bool
    activation: str  # "gelu" | "fast_gelu"
    alpha: float
    softmax_fp32: bool
    hidden_dropout: float
    attention_dropout: float
    weight_decay: float
    fused_cross_kv: bool = False
    """Cross-attention key and value as one head-first ``key_value`` linear (LiBai's layout)."""

    @classmethod
    def create(
        cls,
        *,
        hf_t5: bool,
        heads: int,
        head_dim: int,
        ffn: int,
        norm_epsilon: float,
        dropout: float,
        weight_decay: float,
        softmax_fp32: bool = False,
        fused_cross_kv: bool = False,
    ) -> LayerStyle:
        """The HF T5 v1.1 / MT5 style (``hf_t5``) or the Megatron / LiBai one.

        ``softmax_fp32`` applies to the HF style only; Megatron scales scores by 1/sqrt(head_dim).
        ``fused_cross_kv``: see :func:`attention` (``fused_kv``).
        """
        return cls(
            heads=heads,
            head_dim=head_dim,
            ffn=ffn,
            norm="rms" if hf_t5 else "layer",
            norm_epsilon=norm_epsilon,
            bias=not hf_t5,
            gated=hf_t5,
            activation="fast_gelu" if hf_t5 else "gelu",
            alpha=1.0 if hf_t5 else 1.0 / math.sqrt(head_dim),
            softmax_fp32=softmax_fp32 and hf_t5,
            hidden_dropout=dropout,
            attention_dropout=dropout,
            weight_decay=weight_decay,
            fused_cross_kv=fused_cross_kv,
        )
