"""OneFlow 0.9's price of every direct boxing hop on one mesh, for all tensors at once.

On a mesh with three or more axes of size > 1, OneFlow routes every boxing
directly (its middle-node search, :mod:`autopar.oneflow.pricing`, works on two
axes), so a boxing is one hop lowered by :func:`autopar.oneflow.lowering.hop_rule`.
For two valid layouts of a tensor the rule does not depend on the tensor's
shape, and each axis's bytes are a term of the tensor's bytes ``T`` and element
count (:data:`autopar.oneflow.lowering.Term`): ring collectives
``coef * (T / d)``, all-to-all ``peers * T / nn``, send/recv
``moved * (numel // U) * itemsize / N`` with ``moved`` the elements received over
the axis (summed over the devices) for the least tensor ``U`` both ends cut evenly.
:class:`HopTable` keeps these terms per (source, destination) in dense arrays,
one table per (mesh axes, tensor rank) shared by every tensor of every graph, and
prices a whole edge's pairs with numpy in the same floating-point operations, in
the same order, as :func:`autopar.oneflow.pricing.hop_steps` (so the same
seconds, bit for bit).  Send/recv counts are worked out for many pairs at once by
visiting the device pairs (:func:`send_recv_units`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from autopar.oneflow.lowering import SEND_RECV, hop_rule
from autopar.sbp import B, Broadcast, NdSbp, P, Partial, SbpValue, Split

if TYPE_CHECKING:
    from autopar.cluster import AxisLink

__all__ = ["HopTable", "hop_table", "send_recv_units"]

_KIND = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "send_recv": "send-recv",
    "local": "local",
}
_NONE, _RING, _A2A, _SR = 0, 1, 2, 3


def _ring_steps(kind: str, n: int) -> int:
    """Latency steps of a collective on ``n`` devices (as :mod:`autopar.oneflow.pricing`)."""
    if kind == "send-recv":
        return 1
    if kind == "local" or n <= 1:
        return 0
    return 2 * (n - 1) if kind == "all-reduce" else n - 1


def _ring_coef(kind: str, n: int) -> float:
    """The factor of :func:`autopar.oneflow.lowering._ring` (evaluated as it is there)."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind == "all_to_all":
        return (n - 1) / (n * n)
    return (n - 1) / n


def send_recv_units(
    pairs: Sequence[tuple[NdSbp, NdSbp]], hierarchy: tuple[int, ...], ndim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per pair of layouts, the elements received over each mesh axis summed over the devices
    (``[pairs, axes]``, int64) for the least tensor both ends cut evenly, and that tensor's
    element count ``U`` (``[pairs]``): what :func:`autopar.oneflow.lowering._send_recv` scales
    by ``numel // U``.  Counted by visiting every (sender, receiver) device pair (see that
    function for what is counted), all pairs of layouts at once."""
    k = len(hierarchy)
    coords = np.array(list(itertools.product(*(range(n) for n in hierarchy))), dtype=np.int64).reshape(-1, k)
    n_dev = coords.shape[0]
    same = coords[:, None, :] == coords[None, :, :]  # [s, r, axis]
    differ = ~same
    first = np.where(differ.any(-1), differ.argmax(-1), k)  # first axis where s and r differ
    onehot = (first[..., None] == np.arange(k)).astype(np.int64)  # [s, r, axis]
    moved = np.zeros((len(pairs), k), dtype=np.int64)
    units = np.ones(len(pairs), dtype=np.int64)
    for start in range(0, len(pairs), 512):
        chunk = pairs[start : start + 512]
        lo_s, hi_s, lo_d, hi_d, unit = _unit_boxes(chunk, hierarchy, ndim, coords)
        lo = np.maximum(lo_s[:, :, None, :], lo_d[:, None, :, :])
        hi = np.minimum(hi_s[:, :, None, :], hi_d[:, None, :, :])
        volume = np.prod(np.maximum(hi - lo, 0), axis=-1)  # [pair, s, r]
        forced = np.array([[_forced(a, b) for a, b in zip(src, dst)] for src, dst in chunk], dtype=bool)
        reads = ~np.any(forced[:, None, None, :] & differ[None], axis=-1)  # forced axes: own coordinate
        moved[start : start + len(chunk)] = np.einsum("psr,sra->pa", volume * reads, onehot)
        units[start : start + len(chunk)] = np.prod(unit, axis=-1)
    assert n_dev == math.prod(hierarchy)
    return moved, units


def _forced(src: SbpValue, dst: SbpValue) -> bool:
    """An axis on which a receiver reads its own coordinate only (a ``B`` source; a ``P`` kept)."""
    return isinstance(src, Broadcast) or (isinstance(src, Partial) and isinstance(dst, Partial))


def _unit_boxes(
    pairs: Sequence[tuple[NdSbp, NdSbp]], hierarchy: tuple[int, ...], ndim: int, coords: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each device's ``[lo, hi)`` per dim under each end (``[pair, device, dim]``) on the least
    tensor both ends cut evenly (``unit``, ``[pair, dim]``); nested even splits, mesh axis 0
    outermost (:func:`autopar.oneflow.lowering.device_slices`)."""
    n_pairs, n_dev = len(pairs), coords.shape[0]
    block = np.zeros((2, n_pairs, n_dev, ndim), dtype=np.int64)
    parts = np.ones((2, n_pairs, ndim), dtype=np.int64)
    for p, ends in enumerate(pairs):
        for side, sbp in enumerate(ends):
            for axis, value in enumerate(sbp):
                if isinstance(value, Split):
                    block[side, p, :, value.dim] = (
                        block[side, p, :, value.dim] * hierarchy[axis] + coords[:, axis]
                    )
                    parts[side, p, value.dim] *= hierarchy[axis]
    unit = np.lcm(parts[0], parts[1])
    size = unit[None] // parts  # [side, pair, dim]
    lo = block * size[:, :, None, :]
    hi = lo + size[:, :, None, :]
    return lo[0], hi[0], lo[1], hi[1], unit


class HopTable:
    """Shape-free terms of every direct hop between layouts of rank-``ndim`` tensors on the
    mesh axes ``hierarchy`` (sizes > 1) with links ``links``, filled as pairs are asked for."""

    def __init__(self, hierarchy: tuple[int, ...], links: tuple[AxisLink, ...], ndim: int) -> None:
        self.hierarchy = hierarchy
        self.links = links
        self.ndim = ndim
        values: list[SbpValue] = [B, P, *(Split(d) for d in range(ndim))]
        self.states = [NdSbp(c) for c in itertools.product(values, repeat=len(hierarchy))]
        self.index = {s: i for i, s in enumerate(self.states)}
        n, k = len(self.states), len(hierarchy)
        self.filled = np.eye(n, dtype=bool)  # a state to itself: no step
        self.ftype = np.zeros((n, n, k), dtype=np.int8)
        self.coef = np.zeros((n, n, k), dtype=np.float64)
        self.den = np.ones((n, n, k), dtype=np.int64)
        self.moved = np.zeros((n, n, k), dtype=np.int64)
        self.lat = np.zeros((n, n, k), dtype=np.float64)
        self.beta = np.ones((n, n, k), dtype=np.float64)

    def fill(self, rows: np.ndarray, cols: np.ndarray) -> None:
        """Work out the terms of the pairs ``rows x cols`` (state indices) not known yet."""
        todo = np.argwhere(~self.filled[np.ix_(rows, cols)])
        if len(todo) == 0:
            return
        pairs = [(int(rows[i]), int(cols[j])) for i, j in todo]
        probe = (math.prod(self.hierarchy),) * self.ndim  # every split of a layout divides it
        rules = [hop_rule(probe, self.states[i], self.states[j], self.hierarchy) for i, j in pairs]
        sr_at = [t for t, r in enumerate(rules) if any(term[0] == "sr" for term in r.terms.values())]
        moved, units = send_recv_units(
            [
                (self.states[pairs[t][0]], _moved_to(self.states[pairs[t][0]], self.states[pairs[t][1]]))
                for t in sr_at
            ],
            self.hierarchy,
            self.ndim,
        )
        sr_of = {t: n for n, t in enumerate(sr_at)}
        for t, ((i, j), rule) in enumerate(zip(pairs, rules)):
            kind = _KIND[SEND_RECV if rule.kind == "P kept" else rule.kind]
            for axis, term in rule.terms.items():
                self._set_term(
                    i, j, axis, kind, term, moved[sr_of[t], axis] if t in sr_of else 0, units, sr_of.get(t)
                )
            self.filled[i, j] = True

    def _set_term(
        self, i: int, j: int, axis: int, kind: str, term: tuple, moved: int, units: np.ndarray, at: int | None
    ) -> None:
        n = self.hierarchy[axis]
        if term[0] == "ring" and term[2] > 1:
            self.ftype[i, j, axis], self.coef[i, j, axis], self.den[i, j, axis] = (
                _RING,
                _ring_coef(term[1], term[2]),
                term[3],
            )
        elif term[0] == "a2a":
            self.ftype[i, j, axis], self.coef[i, j, axis], self.den[i, j, axis] = _A2A, term[1], term[2]
        elif term[0] == "sr" and at is not None and moved > 0:
            self.ftype[i, j, axis], self.moved[i, j, axis], self.den[i, j, axis] = _SR, moved, units[at]
        else:
            return
        alpha, beta = self.links[axis].alpha_beta(kind)
        self.lat[i, j, axis] = _ring_steps(kind, n) * alpha
        self.beta[i, j, axis] = beta

    def price(
        self, shape: Sequence[int], itemsize: int, rows: np.ndarray, cols: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seconds, latency seconds (:func:`autopar.costs.step_latency` summed) and whether any
        step moves bytes, for each pair ``rows x cols`` of state indices."""
        self.fill(rows, cols)
        at = np.ix_(rows, cols)
        numel = math.prod(int(d) for d in shape)
        total = float(numel * itemsize)
        ftype, den, beta = self.ftype[at], self.den[at], self.beta[at]
        with np.errstate(divide="ignore", invalid="ignore"):
            ring = self.coef[at] * (total / den)
            a2a = (self.coef[at] * total) / den
            sr = (self.moved[at] * (numel // den) * itemsize).astype(np.float64) / math.prod(self.hierarchy)
        nbytes = np.where(ftype == _RING, ring, np.where(ftype == _A2A, a2a, np.where(ftype == _SR, sr, 0.0)))
        live = (ftype != _NONE) & (nbytes > 0)
        over_beta = nbytes / beta
        seconds = self.lat[at] + over_beta
        latency = np.maximum(0.0, seconds - over_beta)
        time = np.zeros(ftype.shape[:2], dtype=np.float64)
        lat = np.zeros(ftype.shape[:2], dtype=np.float64)
        for axis in range(len(self.hierarchy)):
            time = time + np.where(live[..., axis], seconds[..., axis], 0.0)
            lat = lat + np.where(live[..., axis], latency[..., axis], 0.0)
        return time, lat, live.any(-1)


def _moved_to(src: NdSbp, dst: NdSbp) -> NdSbp:
    """What a hop moves data to: the source's value where the consumer takes a ``P`` it lacks."""
    return NdSbp(
        tuple(s if isinstance(d, Partial) and not isinstance(s, Partial) else d for s, d in zip(src, dst))
    )


_tables: dict[tuple[tuple[int, ...], tuple[AxisLink, ...], int], HopTable] = {}


def hop_table(hierarchy: tuple[int, ...], links: tuple[AxisLink, ...], ndim: int) -> HopTable:
    """The process's :class:`HopTable` of these mesh axes and tensor rank (shared by all graphs)."""
    key = (hierarchy, links, ndim)
    table = _tables.get(key)
    if table is None:
        if len(_tables) >= 64:
            _tables.pop(next(iter(_tables)))
        table = _tables[key] = HopTable(hierarchy, links, ndim)
    return table


def clear_tables() -> None:
    """Forget every table (e.g. to time a cold build)."""
    _tables.clear()
