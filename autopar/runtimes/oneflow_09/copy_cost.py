"""OneFlow 0.9's copy cost of one boxing hop (``ComputeLazyCopyCostBetweenNdSbp``), Python and numpy.

Ported from ``oneflow/core/framework/sbp_infer_util.cpp`` (OneFlow v0.9.0, defaults
``SBP_INFER_RULE_TAG=1``, ``ONEFLOW_PENALTY_FOR_PARTIAL_IN_CONSUMER_POLICY=2``); used by
the emulation of OneFlow's SBP inference (:mod:`autopar.baselines.oneflow_inference`) and by the
``oneflow-0.9`` pricing's middle-node routes (:mod:`autopar.runtimes.oneflow_09.pricing`).  Imports
nothing of autopar but :mod:`autopar.ir.sbp`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from autopar.ir.sbp import B, Broadcast, NdSbp, Partial, SbpValue, Split

__all__ = [
    "PARTIAL_IN_CONSUMER_PENALTY",
    "TRANSFER_COST",
    "UNSUPPORTED_BOXING",
    "VALID_MAX_COPY_COST",
    "cheapest_middle_route",
    "cheapest_middle_route_in",
    "copy_cost_matrix",
    "lazy_copy_cost",
    "reduce_nd_sbp_dims",
    "reduce_pair",
]

UNSUPPORTED_BOXING = 3.4028234663852886e38
"""``kUnsupportedBoxing``: ``GetMaxVal<float>()``, the cost of a boxing OneFlow cannot do."""
VALID_MAX_COPY_COST = 0.8 * UNSUPPORTED_BOXING
"""``GetValidMaxCopyCost()``: costs above this are unsupported."""
TRANSFER_COST = 1.65e4
"""``GetTransferCost()`` (``sbp_infer_util.cpp``): ``ParseFloatFromEnv("AUTO_PARALLEL_TRANSFER_COST",
1.65e4)``, added to every hop.  The default is 1.65e4 in one stored version of OneFlow's source
and 1.65e8 in another; OneFlow 0.9.0 as installed (``oneflow-env.sh``) behaves as 1.65e4,
measured on a synthetic ``[4, 2]`` job (``x (S(0), B) + y (S(0), P)``, float32 ``[8, L, D]``):
its ``add_n`` takes ``(S(0), B)`` (one hop, ``T + 2 bytes``) up to 16 KiB and ``(S(0), S(2))``
(two hops, ``2 T + 1 + bytes``) from 32 KiB on, with the variable unset or set to 1.65e4, and
``(S(0), B)`` at every size with it set to 1.65e8 (the symptom: ViT's first residual
``add_n``, an evaluation job)."""
PARTIAL_IN_CONSUMER_PENALTY = 4
"""``Penalty4PartialInConsumer`` under ``kMiddle`` (default policy 2): ``4 * bytes * (n_in + n_out)``."""


def _reduce_one(
    sbp: Sequence[SbpValue], hierarchy: Sequence[int]
) -> tuple[tuple[SbpValue, ...], tuple[int, ...]]:
    """``NdSbpDimReduce``: drop size-1 axes, merge neighbouring axes with the same value."""
    values: list[SbpValue] = []
    sizes: list[int] = []
    for v, n in zip(sbp, hierarchy):
        if n == 1:
            continue
        if values and values[-1] == v:
            sizes[-1] *= n
        else:
            values.append(v)
            sizes.append(n)
    if not values:
        return (B,), (int(hierarchy[0]) if hierarchy else 1,)
    return tuple(values), tuple(sizes)


def _reduce_pair(
    src: Sequence[SbpValue], dst: Sequence[SbpValue], hierarchy: Sequence[int]
) -> tuple[tuple[SbpValue, ...], tuple[SbpValue, ...], tuple[int, ...]]:
    """``CollaborativeParallelDimReduce`` (same placement): an axis merges into the previous
    one only when both ends repeat their previous value."""
    rs: list[SbpValue] = []
    rd: list[SbpValue] = []
    sizes: list[int] = []
    for a, b, n in zip(src, dst, hierarchy):
        if n == 1:
            continue
        if rs and rs[-1] == a and rd[-1] == b:
            sizes[-1] *= n
        else:
            rs.append(a)
            rd.append(b)
            sizes.append(n)
    if not rs:
        return (src[0],), (dst[0],), (int(hierarchy[0]),)
    if len(hierarchy) == 1:
        return tuple(src), tuple(dst), tuple(int(h) for h in hierarchy)
    return tuple(rs), tuple(rd), tuple(sizes)


def _one_axis_cost(a: SbpValue, b: SbpValue, size: float, n: int) -> float:
    """``ComputCopyCostBetweenTwoDiffSbpParallel`` on the same devices (lazy mode)."""
    if isinstance(b, Partial) and isinstance(a, Split):
        return UNSUPPORTED_BOXING  # S -> P is not supported in lazy boxing
    if a == b:
        return 0.0
    if isinstance(b, Partial):
        return PARTIAL_IN_CONSUMER_PENALTY * size * (n + n)
    if isinstance(a, Broadcast):
        return 1.0  # B -> S: a local slice
    if isinstance(a, Split) and isinstance(b, Split):
        return size * (n - 1) / n
    if isinstance(a, Split) or isinstance(b, Split):
        return size * (n - 1)  # P -> S, S -> B
    return 2 * size * (n - 1)  # P -> B


def _two_axes_cost(
    src: Sequence[SbpValue], dst: Sequence[SbpValue], size: float, hierarchy: Sequence[int]
) -> float:
    """``ComputCopyCostBetweenTwoNdSbp``: supported only when one axis keeps its value."""
    for same in (0, 1):
        if src[same] != dst[same]:
            continue
        if not isinstance(src[same], Split):
            size *= hierarchy[same]
        diff = 1 - same
        all_same_split = any(len(set(x)) == 1 and isinstance(x[0], Split) for x in (src, dst))
        if diff == 0 and src[0] != dst[0] and all_same_split:
            return UNSUPPORTED_BOXING
        return _one_axis_cost(src[diff], dst[diff], size, hierarchy[diff])
    return UNSUPPORTED_BOXING


def lazy_copy_cost(nbytes: float, src: NdSbp, dst: NdSbp, hierarchy: Sequence[int]) -> float:
    """OneFlow 0.9's cost of one boxing hop on one placement (``ComputeLazyCopyCostBetweenNdSbp``).

    ``nbytes``: the logical tensor's bytes.  Unitless (bytes plus
    :data:`TRANSFER_COST` per hop); :data:`UNSUPPORTED_BOXING` when OneFlow
    cannot box it directly.
    """
    rs, rd, sizes = _reduce_pair(src.values, dst.values, hierarchy)
    if len(sizes) >= 3:
        return UNSUPPORTED_BOXING
    if rs == rd:
        return 0.0
    if len(sizes) == 1:
        n = sizes[0]
        if isinstance(rd[0], Partial) and isinstance(rs[0], Split):
            return UNSUPPORTED_BOXING
        if isinstance(rd[0], Partial):
            return TRANSFER_COST + PARTIAL_IN_CONSUMER_PENALTY * nbytes * (n + n)
        return TRANSFER_COST + _one_axis_cost(rs[0], rd[0], nbytes, n)
    return TRANSFER_COST + _two_axes_cost(rs, rd, nbytes, sizes)


def cheapest_middle_route(
    nbytes: float,
    hierarchy: Sequence[int],
    states: Sequence[NdSbp],
    first: Mapping[NdSbp, float],
    last: Mapping[NdSbp, float],
) -> tuple[float, tuple[NdSbp, ...] | None]:
    """The cheapest route through one middle N-D SBP of ``states``, else through two
    (``BoxingCollector`` via ``ComputeCopyCostWithMiddleNodes``), and its copy cost.

    ``first[m]`` / ``last[m]``: :func:`lazy_copy_cost` from the source to ``m`` / from
    ``m`` to the destination, for every ``m`` of ``states``.  The cost is ``inf`` when
    ``states`` is empty; above :data:`VALID_MAX_COPY_COST` when OneFlow has no route.
    """
    best: float = math.inf
    route: tuple[NdSbp, ...] | None = None
    for m in states:
        c = first[m] + last[m]
        if c < best:
            best, route = c, (m,)
    if best <= VALID_MAX_COPY_COST:
        return best, route
    for m, k in itertools.product(states, repeat=2):
        if first[m] > VALID_MAX_COPY_COST or last[k] > VALID_MAX_COPY_COST:
            continue
        c = first[m] + lazy_copy_cost(nbytes, m, k, hierarchy) + last[k]
        if c < best:
            best, route = c, (m, k)
    return best, route


def copy_cost_matrix(nbytes: float, states: Sequence[NdSbp], hierarchy: Sequence[int]) -> np.ndarray:
    """:func:`lazy_copy_cost` from each of ``states`` (rows) to each (columns), float64.

    Same units as :func:`lazy_copy_cost` (bytes plus :data:`TRANSFER_COST` per hop,
    :data:`UNSUPPORTED_BOXING` where OneFlow cannot box directly); each entry is that
    function's value, so routes priced from the matrix tie and compare exactly as
    :func:`cheapest_middle_route` does.
    """
    n = len(states)
    return np.array(
        [lazy_copy_cost(nbytes, a, b, hierarchy) for a in states for b in states], dtype=np.float64
    ).reshape(n, n)


def cheapest_middle_route_in(costs: np.ndarray, src: int, dst: int) -> tuple[float, tuple[int, ...] | None]:
    """:func:`cheapest_middle_route` on a :func:`copy_cost_matrix`: ``src`` and ``dst`` are
    indices of its states, the route's middle states come back as indices.

    The same sums in the same order (``first + middle + last``, float64 as Python
    floats) and the same ties (the first least in state order, ``(m, k)`` in
    row-major order), so the same route and cost, all pairs of middles at once.
    """
    n = costs.shape[0]
    if n == 0:
        return math.inf, None
    first, last = costs[src], costs[:, dst]
    one = first + last
    m = int(np.argmin(one))
    best = float(one[m])
    route: tuple[int, ...] = (m,)
    if best <= VALID_MAX_COPY_COST:
        return best, route
    two = (first[:, None] + costs) + last[None, :]
    two[(first > VALID_MAX_COPY_COST)[:, None] | (last > VALID_MAX_COPY_COST)[None, :]] = math.inf
    flat = int(np.argmin(two))
    if float(two.flat[flat]) < best:
        mid, k = divmod(flat, n)
        best, route = float(two.flat[flat]), (mid, k)
    return best, route


reduce_nd_sbp_dims = _reduce_one
reduce_pair = _reduce_pair
