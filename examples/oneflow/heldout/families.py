"""The held-out families this file registers: name -> builder, and their split.

Every job here is an EVALUATION job: written from the model's public
description (each module's docstring), never read to choose a rule, a
baseline's discipline or a cost.  The integrator merges this map with the
other held-out families' (``hf_t5``, ``hf_gpt2``) into the frozen
development / evaluation split of ``examples/oneflow/heldout/__init__.py``.

A builder ``build(**overrides) -> (module, [numpy arrays])`` returns a module
whose ``forward(*arrays)`` is the training loss, at a tiny configuration that
builds in under a minute on 8 CPU ranks as ``[4, 2]``.  :func:`place_libai`
lays the parameters out as LiBai does (each module's ``LIBAI_LAYOUT``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

SPLIT: dict[str, str] = {"llama": "evaluation", "bert": "evaluation", "vit": "evaluation"}
"""Family -> "development" or "evaluation" (frozen: never move a job out of evaluation)."""

TP_STYLES = ("col", "row", "vocab")
"""LiBai's tensor-parallel styles: ``col`` splits an ``[out, in]`` weight (or a bias) on
dim 0, ``row`` an ``[out, in]`` weight on dim 1, ``vocab`` an embedding table on dim 0."""


def _module(family: str) -> Any:
    if family not in SPLIT:
        raise ValueError(f"unknown held-out family {family!r}; choose one of {sorted(SPLIT)}")
    return importlib.import_module(f"heldout.{family}")


def builder(family: str) -> Callable[..., tuple[Any, list[Any]]]:
    """The ``build`` function of ``family`` (import ``examples/oneflow`` first on ``sys.path``)."""
    build: Callable[..., tuple[Any, list[Any]]] = _module(family).build
    return build


def libai_style(family: str, parameter: str) -> str | None:
    """LiBai's tensor-parallel style of ``parameter`` (a ``named_parameters`` name), or None."""
    layout: dict[str, str] = _module(family).LIBAI_LAYOUT
    for suffix, style in layout.items():
        if parameter == suffix or parameter.endswith("." + suffix):
            return style
    return None


def place_libai(family: str, module: Any, placement: Any) -> Any:
    """``module`` made global on ``placement`` (mesh ``[dp, tp]``), each parameter ``(B, B)``
    or, per :func:`libai_style`, ``(B, S(0))`` (col, vocab) / ``(B, S(1))`` (row)."""
    import oneflow as flow

    ndim = len(placement.ranks.shape) if hasattr(placement.ranks, "shape") else 2
    broadcast = [flow.sbp.broadcast] * ndim
    module = module.to_global(placement, broadcast)
    for name, param in module.named_parameters():
        style = libai_style(family, name)
        if style is None:
            continue
        dim = 1 if style == "row" else 0
        sbp = [*broadcast[:-1], flow.sbp.split(dim)]
        param.data = param.data.to_global(placement, sbp)
    return module
