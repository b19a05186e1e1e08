"""OneFlow 0.9's price of every direct boxing hop on one mesh, for all tensors at once.

On a mesh with three or more axes of size > 1, OneFlow routes every boxing
directly (its middle-node search, :mod:`autopar.runtimes.oneflow_09.pricing`, works on two
axes), so a boxing is one hop lowered by :func:`autopar.runtimes.oneflow_09.lowering.hop_rule`.
For two valid layouts of a tensor the rule does not depend on the tensor's
shape, and each axis's bytes are a term of the tensor's bytes ``T`` and element
count (:data:`autopar.runtimes.oneflow_09.lowering.Term`): ring collectives
``coef * (T / d)``, all-to-all ``peers * T / nn``, send/recv
``moved * (numel // U) * itemsize / N`` with ``moved`` the elements received over
the axis (summed over the devices) for the least tensor ``U`` both ends cut evenly.
:class:`HopTable` keeps these terms per (source, destination) in dense arrays,
one table per (mesh axes, tensor rank) shared by every tensor of every graph, and
prices a whole edge's pairs with numpy in the same floating-point operations, in
the same order, as :func:`autopar.runtimes.oneflow_09.pricing.hop_steps` (so the same
seconds, bit for bit).  One exception is flagged, not priced: a consumer's ``P``
that the source lacks is a local zero-fill, and the hop moves data to the source's
value there, which need not divide the tensor (``(S(2), S(0), S(0)) -> (S(0), S(0), P)``
moves to ``(S(0), S(0), S(0))``); OneFlow then cuts uneven slices, and
:class:`autopar.runtimes.oneflow_09.boxing.OneFlowBoxing` prices such a pair on its own.  Send/recv
counts are worked out for many pairs at once by visiting the device pairs (:meth:`HopTable.send_recv_units`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from autopar.ir.sbp import B, NdSbp, P, SbpValue, Split
from autopar.runtimes.oneflow_09.lowering import SEND_RECV, SR, Term, _flat_terms, ring_steps

if TYPE_CHECKING:
    from autopar.hardware.mesh import AxisLink

__all__ = ["HopTable", "clear_tables", "hop_table"]

_KIND = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "send_recv": "send-recv",
    "local": "local",
}
_NONE, _RING, _A2A, _SR = 0, 1, 2, 3


def _ring_coef(kind: str, n: int) -> float:
    """The factor of :func:`autopar.runtimes.oneflow_09.lowering._ring` (evaluated as it is there)."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind == "all_to_all":
        return (n - 1) / (n * n)
    return (n - 1) / n


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
        self.kept = np.tile(np.arange(n, dtype=np.int64)[:, None], (1, n))
        """the state each hop moves data to (the source's value where the consumer takes a
        ``P`` it lacks): when that is no even layout of a tensor, the hop's rule and bytes
        depend on the tensor's shape, and :meth:`price` says so"""
        self._layout()

    def _layout(self) -> None:
        """Per state: value codes per axis (``B`` 0, ``P`` 1, ``S(d)`` 2 + d); per device pair,
        where they differ and the first axis they differ on (one-hot)."""
        k, values = len(self.hierarchy), 2 + self.ndim
        self.codes = np.array(list(itertools.product(range(values), repeat=k)), dtype=np.int64).reshape(-1, k)
        self.radix = values ** np.arange(k - 1, -1, -1, dtype=np.int64)
        self.parts = np.ones((len(self.codes), self.ndim), dtype=np.int64)
        for axis, n in enumerate(self.hierarchy):
            for dim in range(self.ndim):
                self.parts[self.codes[:, axis] == 2 + dim, dim] *= n
        coords = np.array(list(itertools.product(*(range(n) for n in self.hierarchy))), dtype=np.int64)
        self._differ = coords[:, None, :] != coords[None, :, :]  # [sender, receiver, axis]
        first = np.where(self._differ.any(-1), self._differ.argmax(-1), k)
        self._first = (first[..., None] == np.arange(k)).astype(np.int64)

    def fill(self, rows: np.ndarray, cols: np.ndarray) -> None:
        """Work out the terms of the pairs ``rows x cols`` (state indices) not known yet, all at
        once: :func:`~autopar.runtimes.oneflow_09.lowering.hop_rule` on three or more axes, where every
        pair of layouts is a local zero-fill, a flat collective (both ends one value on all
        axes) or a send/recv on every axis."""
        todo = np.argwhere(~self.filled[np.ix_(rows, cols)])
        if len(todo) == 0:
            return
        i, j = rows[todo[:, 0]], cols[todo[:, 1]]
        cs, cd = self.codes[i], self.codes[j]
        kept = np.where((cd == 1) & (cs != 1), cs, cd)  # a consumer's P the source lacks: zero-fill
        k_id = kept @ self.radix
        self.kept[i, j] = k_id
        moving = k_id != i
        flat = moving & np.all(cs == cs[:, :1], axis=1) & np.all(kept == kept[:, :1], axis=1)
        a, b = cs[:, 0], kept[:, 0]
        kinds = {
            "all_reduce": flat & (a == 1) & (b == 0),
            "reduce_scatter": flat & (a == 1) & (b >= 2),
            "all_gather": flat & (a >= 2) & (b == 0),
            "all_to_all": flat & (a >= 2) & (b >= 2),
        }
        collective = np.zeros(len(i), dtype=bool)
        for kind, mask in kinds.items():
            collective |= mask
            for axis, term in _flat_terms(kind, self.hierarchy).items():
                self._set(i[mask], j[mask], axis, kind, term, None, None)
        sr = moving & ~collective
        moved, units = self.send_recv_units(i[sr], k_id[sr])
        for axis in range(len(self.hierarchy)):
            self._set(i[sr], j[sr], axis, SEND_RECV, SR, moved[:, axis], units)
        self.filled[i, j] = True

    def _set(
        self,
        i: np.ndarray,
        j: np.ndarray,
        axis: int,
        kind: str,
        term: Term,
        moved: np.ndarray | None,
        units: np.ndarray | None,
    ) -> None:
        """Store one axis's term for the pairs ``(i, j)``."""
        n = self.hierarchy[axis]
        if term[0] == "ring":
            if n <= 1:
                return
            self.ftype[i, j, axis], self.coef[i, j, axis], self.den[i, j, axis] = (
                _RING,
                _ring_coef(kind, n),
                term[3],
            )
        elif term[0] == "a2a":
            self.ftype[i, j, axis], self.coef[i, j, axis], self.den[i, j, axis] = _A2A, term[1], term[2]
        else:
            assert moved is not None and units is not None
            self.ftype[i, j, axis] = np.where(moved > 0, _SR, _NONE)
            self.moved[i, j, axis], self.den[i, j, axis] = moved, units
        step_kind = _KIND[kind]
        alpha, beta = self.links[axis].alpha_beta(step_kind)
        self.lat[i, j, axis] = ring_steps(step_kind, n) * alpha
        self.beta[i, j, axis] = beta

    def send_recv_units(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per pair of states ``src[p] -> dst[p]``, the elements received over each mesh axis
        summed over the devices (``[pairs, axes]``, int64) for the least tensor both ends cut
        evenly, and that tensor's element count ``U``: what
        :func:`autopar.runtimes.oneflow_09.lowering._send_recv` scales by ``numel // U``.  A count does
        not change when the tensor dims are renamed, so pairs are counted once per naming
        (dims numbered in order of first use), in a memo shared by every table of the
        process; new ones by :meth:`_count`, all at once."""
        k = len(self.hierarchy)
        rows = np.concatenate([self.codes[src], self.codes[dst]], axis=1).tolist()
        keys = [_canonical(row) for row in rows]
        memo = _units.setdefault(self.hierarchy, {})
        new = list(dict.fromkeys(key for key in keys if key not in memo))
        if new:
            moved, units = self._count(np.array(new, dtype=np.int64).reshape(len(new), 2 * k))
            for key, m, u in zip(new, moved.tolist(), units.tolist()):
                memo[key] = (m, u)
        out = np.array([memo[key][0] for key in keys], dtype=np.int64).reshape(len(keys), k)
        return out, np.array([memo[key][1] for key in keys], dtype=np.int64)

    def _count(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`send_recv_units` of the pairs ``codes`` (``[pair, source axes + target axes]``),
        by visiting every (sender, receiver) device pair (see
        :func:`autopar.runtimes.oneflow_09.lowering._send_recv` for what is counted)."""
        k = len(self.hierarchy)
        ndim = max(1, int(codes.max(initial=1)) - 1)
        coords = np.array(list(itertools.product(*(range(n) for n in self.hierarchy))), dtype=np.int64)
        moved = np.zeros((len(codes), k), dtype=np.int64)
        units = np.ones(len(codes), dtype=np.int64)
        for start in range(0, len(codes), 256):
            cs, cd = codes[start : start + 256, :k], codes[start : start + 256, k:]
            (parts_s, block_s), (parts_d, block_d) = (
                _blocks(c, self.hierarchy, coords, ndim) for c in (cs, cd)
            )
            unit = np.lcm(parts_s, parts_d)  # [pair, dim]
            size_s, size_d = unit // parts_s, unit // parts_d
            lo_s, lo_d = block_s * size_s[:, None, :], block_d * size_d[:, None, :]
            lo = np.maximum(lo_s[:, :, None, :], lo_d[:, None, :, :])
            hi = np.minimum(
                (lo_s + size_s[:, None, :])[:, :, None, :], (lo_d + size_d[:, None, :])[:, None, :, :]
            )
            volume = np.prod(np.maximum(hi - lo, 0), axis=-1)  # [pair, sender, receiver]
            forced = (cs == 0) | ((cs == 1) & (cd == 1))  # a receiver reads its own coordinate
            reads = ~np.any(forced[:, None, None, :] & self._differ[None], axis=-1)
            moved[start : start + len(cs)] = np.einsum("psr,sra->pa", volume * reads, self._first)
            units[start : start + len(cs)] = np.prod(unit, axis=-1)
        return moved, units

    def price(
        self, shape: Sequence[int], itemsize: int, rows: np.ndarray, cols: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Seconds, latency seconds (:func:`autopar.runtimes.boxing.step_latency` summed) and whether any
        step moves bytes, for each pair ``rows x cols`` of state indices (valid layouts of
        the tensor); and where the table does not apply (the hop moves data to a layout that
        does not divide the tensor: priced pair by pair instead, entries left 0)."""
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
        even = np.all(np.asarray(shape, dtype=np.int64) % self.parts == 0, axis=1)
        uneven = ~even[self.kept[at]]
        return time, lat, live.any(-1), uneven


def _canonical(row: list[int]) -> tuple[int, ...]:
    """Value codes with the tensor dims renumbered in order of first use."""
    names: dict[int, int] = {}
    return tuple(c if c < 2 else 2 + names.setdefault(c, len(names)) for c in row)


def _blocks(
    codes: np.ndarray, hierarchy: tuple[int, ...], coords: np.ndarray, ndim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per layout (value codes ``[layout, axis]``): the parts each dim is cut in and each
    device's block index per dim (nested even splits, mesh axis 0 outermost:
    :func:`autopar.runtimes.oneflow_09.lowering.device_slices`)."""
    parts = np.ones((len(codes), ndim), dtype=np.int64)
    block = np.zeros((len(codes), len(coords), ndim), dtype=np.int64)
    for axis, n in enumerate(hierarchy):
        for dim in range(ndim):
            m = codes[:, axis] == 2 + dim
            block[m, :, dim] = block[m, :, dim] * n + coords[None, :, axis]
            parts[m, dim] *= n
    return parts, block


_units: dict[tuple[int, ...], dict[tuple[int, ...], tuple[list[int], int]]] = {}
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
    _units.clear()
