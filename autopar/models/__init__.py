"""Full training-step graphs (forward + backward + AdamW) of reference models.

::

    >>> from autopar.models import build, describe, MODEL_NAMES
    >>> g = build("tiny-mt5")                 # validated autopar Graph
    >>> g = build("mt5-base", batch=8)        # overrides: see below
    >>> describe(g)["ops"]

Models (:data:`MODEL_NAMES`)::

    mt5-base     HF T5 v1.1 / MT5 12+12 layers, hidden 768, 12 heads, d_kv 64, gated-GELU ffn 2048,
                 RMSNorm, relative position bias, no biases, untied LM head, vocab 250112,
                 batch 16, encoder seq 512, decoder seq 128                       (582M params)
    t5-base      Megatron / LiBai T5 12+12, hidden 768, LayerNorm, biases, GELU ffn 3072,
                 tied embeddings + LM bias, vocab 32128                            (224M)
    gpt2-medium  24 layers, hidden 1024, 16 heads, vocab 50257 -> 50304, seq 1024 (355M)
    gpt-1.3b     24 layers (layers=48 for the stress test), hidden 2048, 16 heads, seq 2048
    bert-large   24 layers, hidden 1024, 16 heads, seq 512, MLM head               (336M)
    tiny-mt5, tiny-t5, tiny-gpt, tiny-bert: 2 layers (per stack), hidden 64, 4 heads,
                 vocab 512, batch 8, seq 32 (decoder 16) -- for tests

Overrides (keyword arguments of :func:`build`): any field of the family's config
(:class:`T5Config`, :class:`GPTConfig`, :class:`BertConfig`: ``layers``,
``hidden``, ``heads``, ``ffn``, ``vocab``, ``batch``, ``seq``, ``dropout``,
``dtype`` ...), any field of :class:`OptimizerConfig` (``lr``,
``weight_decay``, ``clip_grad_max_norm`` ...) and, for T5, the aliases
``layers`` (both stacks) and ``seq`` (both sequence lengths).

Ops are OneFlow 0.9 user ops with OneFlow port and attr names; see
``docs/models.md`` for what each graph contains and its op counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from autopar.errors import ConfigError
from autopar.ir.graph import Graph, Role
from autopar.models.bert import BertConfig, build_bert
from autopar.models.builder import GraphBuilder, Param
from autopar.models.config import OptimizerConfig, apply_overrides
from autopar.models.gpt import GPTConfig, build_gpt
from autopar.models.t5 import T5Config, build_t5

__all__ = [
    "MODEL_NAMES",
    "BertConfig",
    "GPTConfig",
    "GraphBuilder",
    "OptimizerConfig",
    "Param",
    "T5Config",
    "build",
    "config_for",
    "describe",
]

ModelConfig = T5Config | GPTConfig | BertConfig


@dataclass(frozen=True)
class _Spec:
    config: ModelConfig
    build: Callable[[Any], Graph]
    aliases: MappingProxyType[str, tuple[str, ...]]


_NO_ALIASES: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({})
_T5_ALIASES: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {"layers": ("encoder_layers", "decoder_layers"), "seq": ("encoder_seq", "decoder_seq")}
)

_TINY: dict[str, Any] = {"hidden": 64, "heads": 4, "vocab": 512, "batch": 8}
"""Sizes of every tiny-* test model (per-family extras below)."""
_TINY_T5: dict[str, Any] = {
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_seq": 32,
    "decoder_seq": 16,
    **_TINY,
}
_TINY_LM: dict[str, Any] = {"layers": 2, **_TINY, "seq": 32, "max_position": 64}
_MEGATRON_T5: dict[str, Any] = {
    "style": "t5",
    "d_kv": None,
    "make_vocab_size_divisible_by": 128,
    "layer_norm_epsilon": 1e-5,
}
"""What sets a Megatron / LiBai T5 apart from the MT5 defaults of T5Config."""

_MODELS: MappingProxyType[str, _Spec] = MappingProxyType(
    {
        "mt5-base": _Spec(T5Config(name="mt5-base"), build_t5, _T5_ALIASES),
        "t5-base": _Spec(
            T5Config(name="t5-base", ffn=3072, vocab=32128, **_MEGATRON_T5),
            build_t5,
            _T5_ALIASES,
        ),
        "gpt2-medium": _Spec(GPTConfig(name="gpt2-medium"), build_gpt, _NO_ALIASES),
        "gpt-1.3b": _Spec(
            GPTConfig(name="gpt-1.3b", hidden=2048, heads=16, seq=2048), build_gpt, _NO_ALIASES
        ),
        "bert-large": _Spec(BertConfig(name="bert-large"), build_bert, _NO_ALIASES),
        "tiny-mt5": _Spec(
            T5Config(name="tiny-mt5", d_kv=16, ffn=128, relative_attention_buckets=8, **_TINY_T5),
            build_t5,
            _T5_ALIASES,
        ),
        "tiny-t5": _Spec(
            T5Config(name="tiny-t5", ffn=256, max_position=64, **_MEGATRON_T5, **_TINY_T5),
            build_t5,
            _T5_ALIASES,
        ),
        "tiny-gpt": _Spec(GPTConfig(name="tiny-gpt", **_TINY_LM), build_gpt, _NO_ALIASES),
        "tiny-bert": _Spec(BertConfig(name="tiny-bert", **_TINY_LM), build_bert, _NO_ALIASES),
    }
)

MODEL_NAMES: tuple[str, ...] = tuple(_MODELS)
"""Names accepted by :func:`build`."""


def _spec(name: str) -> _Spec:
    try:
        return _MODELS[name]
    except KeyError:
        raise ConfigError(
            "unknown_model",
            f"unknown model {name!r}; choose one of {list(MODEL_NAMES)}",
            model=name,
        ) from None


def config_for(name: str, **overrides: Any) -> ModelConfig:
    """The (validated) config :func:`build` would use for ``name`` with ``overrides``."""
    spec = _spec(name)
    return apply_overrides(spec.config, overrides, spec.aliases)


def build(name: str, **overrides: Any) -> Graph:
    """Build and validate the training-step graph of model ``name`` (see :data:`MODEL_NAMES`).

    Raises :class:`~autopar.errors.ConfigError` for an unknown model, an unknown
    override or an invalid value (the message names the field and what to do).
    """
    spec = _spec(name)
    cfg = apply_overrides(spec.config, overrides, spec.aliases)
    return spec.build(cfg).validate()


def describe(graph: Graph) -> dict[str, Any]:
    """Summary of a graph: op counts by type and role, tensors, variables, parameters.

    ``parameters`` counts elements of the variables' tensors; ``parameter_bytes``
    their bytes; ``activation_bytes`` the bytes of every forward-op output other
    than variables (an upper bound of what the forward pass materialises).
    """
    by_type = Counter(op.type for op in graph.ops)
    by_role = Counter(op.role.value for op in graph.ops)
    params = [graph.tensors[v.tensor] for v in graph.variables]
    forward_bytes = sum(
        graph.tensors[t].nbytes
        for op in graph.ops
        if op.role is Role.FORWARD and op.type != "variable"
        for t in op.outputs.values()
    )
    return {
        "name": graph.name,
        "ops": len(graph.ops),
        "tensors": len(graph.tensors),
        "variables": len(graph.variables),
        "parameters": sum(t.numel for t in params),
        "parameter_bytes": sum(t.nbytes for t in params),
        "activation_bytes": forward_bytes,
        "ops_by_role": {r.value: by_role.get(r.value, 0) for r in Role},
        "ops_by_type": dict(sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))),
    }
