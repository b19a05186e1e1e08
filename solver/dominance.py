"""Dominated choices of one node, compiled (numba): the inner loop of the dominance reduction.

A choice ``a`` of a node is *dominated* when another choice ``b`` is at most as bad in
every feature (its own cost, its row of every incident edge matrix, its bytes in every
memory row) and strictly better in one, or is an identical twin with a lower index (so
that exactly one of each group of twins survives).  Some optimal assignment then avoids
``a``: swapping ``a`` for ``b`` changes no constraint for the worse and no cost upward.

:func:`pareto_best` is the other side, for the folds: the choices best in cost and in every
memory row at once (Pareto-dominant), for each choice of the neighbours.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["dominated_choices", "pareto_best"]


@njit(cache=True, nogil=True)
def dominated_choices(features: np.ndarray) -> np.ndarray:
    """``out[a]`` is True when some other row of ``features`` (one row per choice, lower
    is better) dominates row ``a`` (module doc).

    Rows already found dominated are not tried as dominators: whatever one of them
    dominates, the row that dominates it dominates too (the relation is transitive,
    twins broken by index), and that row is tried.  Each test stops at the first
    feature that refutes it."""
    k, width = features.shape
    out = np.zeros(k, dtype=np.bool_)
    for a in range(k):
        for b in range(k):
            if b == a or out[b]:
                continue
            strict = False
            ok = True
            for f in range(width):
                fb = features[b, f]
                fa = features[a, f]
                if fb > fa or fb != fb or fa != fa:  # worse, or not comparable (NaN)
                    ok = False
                    break
                if fb < fa:
                    strict = True
            if ok and (strict or b < a):
                out[a] = True
                break
    return out


def pareto_best(total: np.ndarray, mems: list[np.ndarray]) -> np.ndarray:
    """``ok[..., b]``: choice b is finite and best in cost and in every memory row.

    ``total`` and each of ``mems`` have the eliminated node's choices on the
    last axis (other axes broadcast: choices of the neighbours).
    """
    finite = np.isfinite(total)
    best = total.min(axis=-1, keepdims=True)
    ok = finite & (total == best)
    for mem in mems:
        mem = np.broadcast_to(mem, total.shape)
        lowest = np.where(finite, mem, np.inf).min(axis=-1, keepdims=True)
        ok &= mem == lowest
    return ok
