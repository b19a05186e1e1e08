"""The layout of a :class:`~autopar_solver.bounds.DiffusionBound`: which node each kept edge
joins, each node's level, and the order of the (node, edge) ends in a pass, from which the
bound copies its edge matrices into contiguous segments (``DiffusionBound._layout``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopar_solver.problem import Problem

__all__ = ["Skeleton", "Slots", "runs", "skeleton", "slots"]


@dataclass
class Skeleton:
    """The kept edges of a :class:`DiffusionBound` and its nodes' levels (see ``DiffusionBound._layout``)."""

    ends: np.ndarray
    """(m, 2) nodes of each kept edge."""
    shapes: np.ndarray
    """(m, 2) matrix shape of each kept edge."""
    level: np.ndarray
    incident: list[list[int]]
    """Node -> its kept edges."""
    n_later: np.ndarray
    """Node -> its edges toward later nodes."""
    n_earlier: np.ndarray
    weight: np.ndarray
    """Node -> ``1 / max(#later, #earlier)``."""


@dataclass
class Slots:
    """The (node, edge) ends in pass order and where their segments start (see ``DiffusionBound._layout``)."""

    ahead: list[tuple[int, int]]
    """Ends toward a later node (the bound's region)."""
    parts: list[tuple[np.ndarray, int, int, int, int]]
    """Per level: its nodes and its slot ranges behind and ahead."""
    first_ahead: int
    slot_node: np.ndarray
    slot_edge: np.ndarray
    seg_first: np.ndarray
    seg_second: np.ndarray
    slot_segment: np.ndarray
    count: int
    """Segments in all."""


def runs(sorted_values: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal values."""
    if not len(sorted_values):
        return []
    cuts = np.flatnonzero(np.diff(sorted_values)) + 1
    return list(itertools.pairwise([0, *cuts.tolist(), len(sorted_values)]))


def skeleton(problem: Problem, edge_ids: Sequence[int]) -> Skeleton:
    """The kept edges' ends and shapes, each node's level (longest path from a source
    along edges toward later nodes) and its edges' share of its cost."""
    n, m = problem.num_nodes, len(edge_ids)
    ends = np.array([problem.edges[e][:2] for e in edge_ids], dtype=np.int64).reshape(m, 2)
    shapes = np.array([problem.edges[e][2].shape for e in edge_ids], dtype=np.int64).reshape(m, 2)
    lo, hi = ends.min(axis=1), ends.max(axis=1)
    level = np.zeros(n, dtype=np.int64)
    later: list[list[int]] = [[] for _ in range(n)]
    incident: list[list[int]] = [[] for _ in range(n)]
    for k, (a, b, u, v) in enumerate(zip(lo.tolist(), hi.tolist(), ends[:, 0].tolist(), ends[:, 1].tolist())):
        later[a].append(b)
        incident[u].append(k)
        incident[v].append(k)
    for i in range(n):
        here = level[i] + 1
        for j in later[i]:
            if level[j] < here:
                level[j] = here
    n_later = np.bincount(lo, minlength=n) if m else np.zeros(n, dtype=np.int64)
    n_earlier = np.bincount(hi, minlength=n) if m else np.zeros(n, dtype=np.int64)
    weight = 1.0 / np.maximum(np.maximum(n_later, n_earlier), 1)
    return Skeleton(ends, shapes, level, incident, n_later, n_earlier, weight)


def slots(sk: Skeleton) -> Slots:
    """The (node, edge) ends in pass order and the segment each starts.

    First every end of an edge toward an earlier node, by level and node, then every
    end toward a later node, the same way (so each level's two parts are contiguous,
    and every edge has exactly one end in the second region: the bound reads that
    region only)."""
    ends, m = sk.ends, len(sk.ends)
    linked = (sk.n_later + sk.n_earlier) > 0
    order = [int(i) for i in np.argsort(sk.level, kind="stable") if linked[i]]
    behind: list[tuple[int, int]] = []
    ahead: list[tuple[int, int]] = []
    parts: list[tuple[np.ndarray, int, int, int, int]] = []  # nodes, slot ranges behind/ahead
    for start, end in runs(sk.level[order]):
        members = order[start:end]
        b0, a0 = len(behind), len(ahead)
        for i in members:
            for k in sk.incident[i]:
                (ahead if int(ends[k].sum()) - i > i else behind).append((i, k))
        parts.append((np.array(members, dtype=np.int64), b0, len(behind), a0, len(ahead)))
    slots = behind + ahead
    seg_first = np.zeros(m, dtype=np.int64)
    seg_second = np.zeros(m, dtype=np.int64)
    slot_segment = np.zeros(len(slots) + 1, dtype=np.int64)
    count = 0
    for n_slot, (i, k) in enumerate(slots):
        slot_segment[n_slot] = count
        if ends[k, 0] == i:
            seg_first[k] = count
            count += int(sk.shapes[k, 0])
        else:
            seg_second[k] = count
            count += int(sk.shapes[k, 1])
    slot_segment[len(slots)] = count
    slot_node = np.array([i for i, _ in slots], dtype=np.int64)
    slot_edge = np.array([k for _, k in slots], dtype=np.int64)
    return Slots(ahead, parts, len(behind), slot_node, slot_edge, seg_first, seg_second, slot_segment, count)
