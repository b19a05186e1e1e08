"""Held-out OneFlow jobs, and the frozen split of every OneFlow job into development and evaluation.

``SPLIT`` is frozen: the project's own jobs (``examples/oneflow/zoo.py``) are
``development`` (rules and baselines may be tuned on them); the held-out jobs
here, each written from its model's public description and not from
``autopar/models`` or the development jobs, are ``evaluation``: they are never
used to choose a rule.

``build(name)`` returns ``(module, [numpy arrays], layout)``: the module's forward
takes the arrays (as tensors) and returns the mean loss; ``layout(param_name,
ndim)`` is LiBai's N-D SBP text for a parameter on a ``[dp, tp]`` mesh.  The
package needs ``examples/oneflow`` on ``sys.path`` (for ``oflayers``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import numpy as np

SPLIT: MappingProxyType[str, str] = MappingProxyType(
    {
        # development: the project's own jobs (examples/oneflow/zoo.py)
        "mt5-tiny": "development",
        "mt5-base": "development",
        "gpt-tiny": "development",
        "bert-tiny": "development",
        # evaluation: held-out jobs (this package)
        "hf-t5-tiny": "evaluation",
        "hf-gpt2-tiny": "evaluation",
    }
)
"""job name -> ``development`` or ``evaluation`` (frozen; add jobs, never move one)."""

EVALUATION = tuple(name for name, split in SPLIT.items() if split == "evaluation")


def build(
    name: str, *, seed: int | None = 0, identity_reads: bool = True
) -> tuple[Any, list[np.ndarray], Callable[[str, int], str]]:
    """Module, example inputs and LiBai layout function of held-out job ``name``."""
    from oflayers import set_identity_reads

    if name == "hf-t5-tiny":
        from heldout import hf_t5

        config = hf_t5.HFT5Config.tiny()
        module: Any = hf_t5.HFT5ForConditionalGeneration(config, seed=seed)
        arrays: list[np.ndarray] = list(hf_t5.example_inputs(config))
        layout = hf_t5.libai_layout
    elif name == "hf-gpt2-tiny":
        from heldout import hf_gpt2

        gconfig = hf_gpt2.HFGPT2Config.tiny()
        module = hf_gpt2.HFGPT2LMHeadModel(gconfig, seed=seed)
        arrays = list(hf_gpt2.example_inputs(gconfig))
        layout = hf_gpt2.libai_layout
    else:
        raise ValueError(f"unknown held-out job {name!r}; choose one of {EVALUATION}")
    return set_identity_reads(module, identity_reads), arrays, layout
