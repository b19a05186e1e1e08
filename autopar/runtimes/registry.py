"""The runtimes by name, and boxing priced as a runtime lowers it.

* :data:`RUNTIMES` and :func:`runtime_profile`: ``ideal`` (:mod:`autopar.runtimes.ideal`),
  ``oneflow-0.9`` and ``oneflow-0.9-shard-min-1`` (:mod:`autopar.runtimes.oneflow_09`),
  ``megatron-lm`` (:mod:`autopar.runtimes.megatron_lm`);
* :func:`boxing_plan`, :func:`boxing_time`, :func:`boxing_matrix`: the steps and seconds of an
  N-D SBP change as a lowering runs it, through one cached finder per tensor shape and mesh
  (:func:`boxing_search`): :class:`~autopar.runtimes.ideal.BoxingSearch`,
  :class:`~autopar.runtimes.megatron_lm.boxing.DirectBoxing` or
  :class:`~autopar.runtimes.oneflow_09.boxing.OneFlowBoxing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autopar.errors import ConfigError
from autopar.hardware.mesh import Mesh
from autopar.ir.sbp import NdSbp
from autopar.ir.wire import DEFAULT_RUNTIME
from autopar.runtimes.boxing import BoxingPlan
from autopar.runtimes.ideal import IDEAL, BoxingSearch
from autopar.runtimes.megatron_lm.boxing import DirectBoxing
from autopar.runtimes.megatron_lm.runtime import MEGATRON_LM
from autopar.runtimes.oneflow_09.boxing import OneFlowBoxing
from autopar.runtimes.oneflow_09.runtime import ONEFLOW_0_9, ONEFLOW_0_9_SHARD_MIN_1
from autopar.runtimes.profile import RuntimeProfile

__all__ = ["RUNTIMES", "boxing_matrix", "boxing_plan", "boxing_search", "boxing_time", "runtime_profile"]


_SEARCH_CACHE_SIZE = 4096
_searches: dict[tuple[Any, ...], BoxingSearch | OneFlowBoxing] = {}


def boxing_search(
    shape: Sequence[int], itemsize: int, mesh: Mesh, lowering: str = "ideal"
) -> BoxingSearch | OneFlowBoxing:
    """The (cached) boxing finder of a tensor shape and item size on ``mesh`` for ``lowering``
    (``"ideal"``: :class:`BoxingSearch`; ``"oneflow-0.9"``: :class:`OneFlowBoxing`;
    ``"direct"``: :class:`DirectBoxing`).

    Cached per (shape, item size, mesh content, lowering) in this process, the most
    recent :data:`_SEARCH_CACHE_SIZE` kept, so identical tensors share their searches.
    """
    if lowering not in ("ideal", "oneflow-0.9", "direct"):
        raise ValueError(f"unknown lowering {lowering!r}")
    key = (tuple(shape), itemsize, mesh.shape, mesh.axes, lowering)
    search = _searches.get(key)
    if search is None:
        if len(_searches) >= _SEARCH_CACHE_SIZE:
            _searches.pop(next(iter(_searches)))
        if lowering == "oneflow-0.9":
            search = _searches[key] = OneFlowBoxing(shape, itemsize, mesh)
        else:
            finder = DirectBoxing if lowering == "direct" else BoxingSearch
            search = _searches[key] = finder(shape, itemsize, mesh)
    return search


def boxing_matrix(
    shape: Sequence[int],
    itemsize: int,
    srcs: Sequence[NdSbp],
    dsts: Sequence[NdSbp],
    mesh: Mesh,
    lowering: str = "ideal",
) -> np.ndarray:
    """Boxing seconds from each of ``srcs`` (rows) to each of ``dsts`` (columns), ``inf`` where
    impossible: the one place every boxing matrix of the cost tables is priced."""
    return boxing_search(shape, itemsize, mesh, lowering).matrix(srcs, dsts)


def boxing_plan(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh, lowering: str = "ideal"
) -> BoxingPlan:
    """The steps turning ``src`` into ``dst`` on ``mesh`` as ``lowering`` runs them."""
    if src == dst:
        return BoxingPlan(src, dst, (), 0.0)
    return boxing_search(shape, itemsize, mesh, lowering).plan(src, dst)


def boxing_time(
    shape: Sequence[int], itemsize: int, src: NdSbp, dst: NdSbp, mesh: Mesh, lowering: str = "ideal"
) -> float:
    """Seconds to box ``src`` into ``dst`` (``inf`` when impossible)."""
    return boxing_plan(shape, itemsize, src, dst, mesh, lowering).time_s


RUNTIMES: dict[str, RuntimeProfile] = {
    runtime.name: runtime for runtime in (IDEAL, ONEFLOW_0_9, MEGATRON_LM, ONEFLOW_0_9_SHARD_MIN_1)
}
"""Every runtime a plan may be priced for, by name (``--runtime``)."""


def runtime_profile(name: str | RuntimeProfile | None = None) -> RuntimeProfile:
    """The profile called ``name`` (default :data:`DEFAULT_RUNTIME`)."""
    if isinstance(name, RuntimeProfile):
        return name
    name = name or DEFAULT_RUNTIME
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ConfigError(
            "unknown_runtime", f"unknown runtime profile {name!r}; choose one of {sorted(RUNTIMES)}"
        ) from None
