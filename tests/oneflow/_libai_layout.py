"""LiBai's layout of a tiny job on a 2-D placement, shared by the OneFlow job builders.

Imported by ``_build_jobs.py``, ``_build_iteration.py`` and ``_build_heldout.py`` (scripts
run with ``oneflow.distributed.launch``, their folder first on ``sys.path``): data inputs
``(S(0), B)``; in :func:`libai_weights`, 2-D weights ``(B, S(0))`` (T5's relative-position
bias stays broadcast).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import oneflow as flow


def global_inputs(arrays: Sequence[Any], placement: Any) -> list[Any]:
    """``arrays`` as global tensors split on the batch over the first mesh axis: ``(S(0), B)``."""
    broadcast = [flow.sbp.broadcast] * 2
    batch_split = [flow.sbp.split(0), flow.sbp.broadcast]
    return [flow.tensor(a).to_global(placement, broadcast).to_global(placement, batch_split) for a in arrays]


def libai_weights(module: Any, placement: Any) -> Any:
    """``module`` global on ``placement``, its 2-D weights ``(B, S(0))`` as LiBai lays them out."""
    module = module.to_global(placement, [flow.sbp.broadcast] * 2)
    for pname, param in module.named_parameters():
        if param.ndim == 2 and "relative_attention_bias" not in pname:
            param.data = param.data.to_global(placement, [flow.sbp.broadcast, flow.sbp.split(0)])
    return module
