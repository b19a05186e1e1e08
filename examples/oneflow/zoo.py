"""The example models by name, with deterministic example batches.

``build(name)`` returns ``(module, [numpy arrays])``: the module's forward takes
the arrays (as tensors) and returns the mean loss.  Names, as the CLI's bundled
models (``autopar model``): ``tiny-mt5``, ``mt5-base`` (12+12 layers, hidden 768;
``batch``/``seq`` default 16 / 512,128), ``tiny-gpt``, ``tiny-bert``; the older
``mt5-tiny``, ``gpt-tiny`` and ``bert-tiny`` are kept as aliases.  ``fused=True`` emits
OneFlow's fused norm ops (CUDA kernels only: build and export, do not run on CPU).  ``qkv_layout`` (GPT
only): the fused QKV output's layout, ``"heads"`` (Megatron-LM / LiBai, the
default) or ``"hf"`` (see ``gpt.py``).  ``fused_cross_kv`` (MT5 only): each
cross-attention's key and value as one head-first ``key_value`` linear, LiBai's
layout (see ``mt5.py``); the default keeps HF's separate ``k`` and ``v``.
"""

from __future__ import annotations

from typing import Any

import bert
import gpt
import mt5
import numpy as np
from oflayers import set_identity_reads

NAMES = ("tiny-mt5", "mt5-base", "tiny-gpt", "tiny-bert")
"""The models, named as the CLI's (``autopar model NAME``)."""
ALIASES = {"mt5-tiny": "tiny-mt5", "gpt-tiny": "tiny-gpt", "bert-tiny": "tiny-bert"}
"""Older names, still accepted."""
KNOWN = NAMES + tuple(ALIASES)
"""Every name :func:`build` accepts."""


def canonical(name: str) -> str:
    """``name`` as the CLI spells it (an alias mapped to its name)."""
    return ALIASES.get(name, name)


def build(
    name: str,
    *,
    seed: int | None = 0,
    batch: int | None = None,
    seq: int | None = None,
    decoder_seq: int | None = None,
    layers: int | None = None,
    fused: bool = False,
    identity_reads: bool = False,
    vocab: int | None = None,
    qkv_layout: str | None = None,
    fused_cross_kv: bool = False,
) -> tuple[Any, list[np.ndarray]]:
    """Module and example inputs of model ``name`` (``seed=None``: parameters left uninitialised).

    ``identity_reads`` reads parameters through ``identity`` ops (needed to run
    multi-rank jobs on CPU, see ``oflayers``).
    """
    module, arrays = _build(
        canonical(name), seed, batch, seq, decoder_seq, layers, fused, vocab, qkv_layout, fused_cross_kv
    )
    return set_identity_reads(module, identity_reads), arrays


def _build(
    name: str,
    seed: int | None,
    batch: int | None,
    seq: int | None,
    decoder_seq: int | None,
    layers: int | None,
    fused: bool,
    vocab: int | None = None,
    qkv_layout: str | None = None,
    fused_cross_kv: bool = False,
) -> tuple[Any, list[np.ndarray]]:
    if vocab is not None and name not in ("tiny-mt5", "mt5-base"):
        raise ValueError(f"vocab is an MT5 option; {name!r} has its own")
    if qkv_layout is not None and name != "tiny-gpt":
        raise ValueError(f"qkv_layout is a GPT option; {name!r} has separate q, k, v")
    if fused_cross_kv and name not in ("tiny-mt5", "mt5-base"):
        raise ValueError(f"fused_cross_kv is an MT5 option; {name!r} has no cross-attention")
    if name in ("tiny-mt5", "mt5-base"):
        overrides: dict[str, Any] = {"fused_rms_norm": fused, "fused_cross_kv": fused_cross_kv}
        if vocab is not None:
            overrides.update(vocab_size=vocab)
        if layers is not None:
            overrides.update(num_layers=layers, num_decoder_layers=layers)
        config = mt5.MT5Config.tiny(**overrides) if name == "tiny-mt5" else mt5.MT5Config.base(**overrides)
        small = name == "tiny-mt5"
        arrays = mt5.example_inputs(
            config,
            batch or (8 if small else 16),
            seq or (32 if small else 512),
            decoder_seq or (16 if small else 128),
        )
        return mt5.MT5ForConditionalGeneration(config, seed=seed), list(arrays)
    if name == "tiny-gpt":
        goverrides: dict[str, Any] = {"fused_layer_norm": fused}
        if layers:
            goverrides.update(layers=layers)
        if qkv_layout is not None:
            if qkv_layout not in ("heads", "hf"):
                raise ValueError(f"unknown qkv_layout {qkv_layout!r}; choose 'heads' or 'hf'")
            goverrides.update(qkv_layout=qkv_layout)
        gconfig = gpt.GPTConfig.tiny(**goverrides)
        return gpt.GPTLMHeadModel(gconfig, seed=seed), list(
            gpt.example_inputs(gconfig, batch or 8, seq or 32)
        )
    if name == "tiny-bert":
        bconfig = bert.BertConfig.tiny(fused_layer_norm=fused, **({"layers": layers} if layers else {}))
        return bert.BertForMaskedLM(bconfig, seed=seed), list(
            bert.example_inputs(bconfig, batch or 8, seq or 32)
        )
    raise ValueError(f"unknown model {name!r}; choose one of {NAMES}")
