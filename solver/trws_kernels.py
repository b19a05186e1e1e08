"""Compiled inner loops of the TRW-S bound (:mod:`autopar_solver.bounds`).

The data layout is :class:`~autopar_solver.bounds.DiffusionBound`'s: a *segment* is one
(edge, end, choice of that end), ``alpha[s]`` its message, and its entries
``values[seg_entry[s]:seg_entry[s + 1]]`` the matrix's row (first end) or column
(second end) of that choice; its ``b``-th entry meets the other end's choice ``b``,
whose segment is ``seg_other[s] + b``.  So the reparametrised edge cost of that entry
is ``values[seg_entry[s] + b] - alpha[s] - alpha[seg_other[s] + b]``.

Each function is compiled once by numba (``cache=True`` keeps the machine code next to
this file, so only a fresh install pays the compile) and runs the loops the NumPy
version ran as ``reduceat`` / ``bincount`` over a level at a time.  Within a level no
edge joins two of its nodes, so visiting its segments one after another computes
exactly what the level-at-once version did.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["decode_greedy", "descend_icm", "edge_minima", "lay_out_entries", "levels_pass"]


@njit(cache=True, nogil=True, inline="always")
def _segment_min(alpha: np.ndarray, values: np.ndarray, start: int, stop: int, other: int) -> float:
    """``min_b values[start + b] - alpha[other + b]`` over the segment's entries."""
    m = math.inf
    for b in range(stop - start):
        v = values[start + b] - alpha[other + b]
        if v < m:
            m = v
    return m


@njit(cache=True, nogil=True)
def levels_pass(
    theta: np.ndarray,
    alpha: np.ndarray,
    values: np.ndarray,
    seg_entry: np.ndarray,
    seg_other: np.ndarray,
    seg_choice: np.ndarray,
    level_choice_start: np.ndarray,
    level_choices: np.ndarray,
    behind_start: np.ndarray,
    behind_stop: np.ndarray,
    ahead_start: np.ndarray,
    ahead_stop: np.ndarray,
    weight: np.ndarray,
    kept: np.ndarray,
    levels: np.ndarray,
    full: bool,
    work: np.ndarray,
    blocked: np.ndarray,
) -> None:
    """Update the levels ``levels`` (indices, in the pass's order), each as one TRW-S step.

    For level ``k``: every node choice ``c`` of it pulls the min-marginal of each segment
    behind the pass, ``[behind_start[k], behind_stop[k])`` (and of those ahead,
    ``[ahead_start[k], ahead_stop[k])``, when ``full``)::

        m_s = min_b (values[seg_entry[s] + b] - alpha[seg_other[s] + b])
        theta[c] += m_s - alpha[s];   alpha[s] = m_s

    (a segment with no finite entry blocks ``c``: ``theta[c] = inf``); then keeps
    ``kept[c]`` of its cost and pushes ``weight[c]`` of it onto each segment ahead
    (``alpha[s] -= weight[c] * theta_before[c]``).
    ``work`` and ``blocked`` are scratch arrays, one entry per node choice.  Seconds.
    """
    for q in range(levels.shape[0]):
        k = levels[q]
        c0 = level_choice_start[k]
        c1 = level_choice_start[k + 1]
        for p in range(c0, c1):
            c = level_choices[p]
            work[c] = theta[c]
            blocked[c] = False
        for region in range(2):
            if region == 0:
                s0 = behind_start[k]
                s1 = behind_stop[k]
            elif full:
                s0 = ahead_start[k]
                s1 = ahead_stop[k]
            else:
                break
            for s in range(s0, s1):
                m = _segment_min(alpha, values, seg_entry[s], seg_entry[s + 1], seg_other[s])
                c = seg_choice[s]
                if math.isfinite(m):
                    work[c] += m - alpha[s]
                    alpha[s] = m
                else:
                    blocked[c] = True
        for p in range(c0, c1):
            c = level_choices[p]
            cost = work[c]
            if blocked[c] or not math.isfinite(cost):
                theta[c] = math.inf
                work[c] = 0.0
            else:
                theta[c] = cost * kept[c]
        for s in range(ahead_start[k], ahead_stop[k]):
            c = seg_choice[s]
            alpha[s] -= work[c] * weight[c]


@njit(cache=True, nogil=True)
def edge_minima(
    alpha: np.ndarray,
    values: np.ndarray,
    seg_entry: np.ndarray,
    seg_other: np.ndarray,
    slot_segment: np.ndarray,
    out: np.ndarray,
) -> None:
    """``out[t] = min over segments s of slot t, entries b of s of theta_e``, the entry's
    reparametrised cost (module doc):
    the least reparametrised cost of the edge that slot ``t`` (one end of it) stands for.
    Slot ``t`` covers segments ``[slot_segment[t], slot_segment[t + 1])``.  Seconds."""
    for t in range(out.shape[0]):
        best = math.inf
        for s in range(slot_segment[t], slot_segment[t + 1]):
            m = _segment_min(alpha, values, seg_entry[s], seg_entry[s + 1], seg_other[s]) - alpha[s]
            if m < best:
                best = m
        out[t] = best


@njit(cache=True, nogil=True)
def lay_out_entries(
    slot_node: np.ndarray,
    slot_edge: np.ndarray,
    edge_first_node: np.ndarray,
    shapes: np.ndarray,
    node_offset: np.ndarray,
    seg_first: np.ndarray,
    seg_second: np.ndarray,
    seg_other: np.ndarray,
    seg_choice: np.ndarray,
    seg_len: np.ndarray,
    slot_entry: np.ndarray,
    first_entries: np.ndarray,
    second_entries: np.ndarray,
) -> None:
    """Where every edge matrix goes in the slot order: slot ``t`` is edge ``slot_edge[t]`` seen
    from node ``slot_node[t]``, its rows when that node is the edge's first end (entries
    row-major), its columns otherwise (the transpose, row-major).  ``seg_first[k]`` /
    ``seg_second[k]`` is the first segment of each end of edge ``k``.  Fills ``seg_other``,
    ``seg_choice``, ``seg_len`` (per segment), ``slot_entry`` (first entry of each slot, and
    the total at the end) and where each edge's two copies start; the entries themselves are
    copied by the caller (one block copy per slot)."""
    position = 0
    for t in range(slot_node.shape[0]):
        slot_entry[t] = position
        k = slot_edge[t]
        i = slot_node[t]
        rows = shapes[k, 0]
        cols = shapes[k, 1]
        # the edge's rows seen from its first end, its columns from its second
        if edge_first_node[k] == i:
            first_entries[k] = position
            s0, o0 = seg_first[k], seg_second[k]
            n_own, n_other = rows, cols
        else:
            second_entries[k] = position
            s0, o0 = seg_second[k], seg_first[k]
            n_own, n_other = cols, rows
        for a in range(n_own):
            seg_choice[s0 + a] = node_offset[i] + a
            seg_len[s0 + a] = n_other
            seg_other[s0 + a] = o0
        position += n_own * n_other
    slot_entry[slot_node.shape[0]] = position


@njit(cache=True, nogil=True)
def _local_costs(
    i: int,
    base: np.ndarray,
    alpha: np.ndarray,
    values: np.ndarray,
    seg_entry: np.ndarray,
    node_offset: np.ndarray,
    node_slot_start: np.ndarray,
    slot_own: np.ndarray,
    slot_other_node: np.ndarray,
    slot_other_seg: np.ndarray,
    choices: np.ndarray,
    with_messages: bool,
    out: np.ndarray,
) -> int:
    """``out[a]`` for each choice ``a`` of node ``i``: ``base`` (per node choice) plus its cost
    on each edge to an assigned neighbour (``choices[j] >= 0``), the matrix entry less both
    messages when ``with_messages`` (the reparametrised cost), as is otherwise (the true
    cost).  Slots ``[node_slot_start[i], node_slot_start[i + 1])`` are node ``i``'s edge
    ends: its first segment ``slot_own``, the neighbour ``slot_other_node`` and the
    neighbour's first segment ``slot_other_seg``.  Returns the number of choices."""
    first = node_offset[i]
    n = node_offset[i + 1] - first
    for a in range(n):
        out[a] = base[first + a]
    for t in range(node_slot_start[i], node_slot_start[i + 1]):
        b = choices[slot_other_node[t]]
        if b < 0:
            continue
        for a in range(n):
            s = slot_own[t] + a
            out[a] += values[seg_entry[s] + b]
            if with_messages:
                out[a] -= alpha[s] + alpha[slot_other_seg[t] + b]
    return n


@njit(cache=True, nogil=True)
def decode_greedy(
    order: np.ndarray,
    theta: np.ndarray,
    alpha: np.ndarray,
    values: np.ndarray,
    seg_entry: np.ndarray,
    node_offset: np.ndarray,
    node_slot_start: np.ndarray,
    slot_own: np.ndarray,
    slot_other_node: np.ndarray,
    slot_other_seg: np.ndarray,
    choices: np.ndarray,
) -> None:
    """Greedy decoding of the reparametrised problem: nodes in ``order`` each take the
    choice of least ``theta_i(a) + sum over assigned neighbours j of theta_ij(a, x_j)``
    (:func:`autopar_solver.heuristic.greedy_assignment` on
    :func:`~autopar_solver.bounds.reparametrized`, without memory rows; the first of equal
    ones).  ``choices`` (out, -1 = unassigned on entry) gets one choice per node."""
    local = np.empty(int(np.max(np.diff(node_offset))) if node_offset.shape[0] > 1 else 0)
    for q in range(order.shape[0]):
        i = order[q]
        n = _local_costs(
            i, theta, alpha, values, seg_entry, node_offset, node_slot_start,
            slot_own, slot_other_node, slot_other_seg, choices, True, local,
        )  # fmt: skip
        pick = 0
        for a in range(1, n):
            if local[a] < local[pick]:
                pick = a
        choices[i] = pick


@njit(cache=True, nogil=True)
def descend_icm(
    order: np.ndarray,
    node_cost: np.ndarray,
    values: np.ndarray,
    seg_entry: np.ndarray,
    node_offset: np.ndarray,
    node_slot_start: np.ndarray,
    slot_own: np.ndarray,
    slot_other_node: np.ndarray,
    slot_other_seg: np.ndarray,
    choices: np.ndarray,
    max_sweeps: int,
) -> int:
    """Iterated conditional modes on the true costs (``node_cost``, the matrices in
    ``values``), in place: each node in ``order`` moves to its best choice given its
    neighbours, until a sweep moves none or after ``max_sweeps``; returns the sweeps
    run.  No budget is checked (a caller with memory rows checks the plan after)."""
    no_messages = np.zeros(0)
    local = np.empty(int(np.max(np.diff(node_offset))) if node_offset.shape[0] > 1 else 0)
    for sweep in range(max_sweeps):
        moved = False
        for q in range(order.shape[0]):
            i = order[q]
            n = _local_costs(
                i, node_cost, no_messages, values, seg_entry, node_offset, node_slot_start,
                slot_own, slot_other_node, slot_other_seg, choices, False, local,
            )  # fmt: skip
            current = choices[i]
            now = local[current]
            # a move must gain more than float noise; any finite choice beats a forbidden one
            best = now - 1e-12 * max(1.0, abs(now)) if math.isfinite(now) else math.inf
            pick = current
            for a in range(n):
                if a != current and local[a] < best:
                    best = local[a]
                    pick = a
            if pick != current:
                choices[i] = pick
                moved = True
        if not moved:
            return sweep + 1
    return max_sweeps
