"""Lower bounds for problems too large for CP-SAT's own bound.

Sequential reweighted message passing (TRW-S: Kolmogorov, "Convergent tree-reweighted
message passing for energy minimization", TPAMI 2006; in the reparametrisation form
of Kolmogorov, "A new look at reweighted message passing", TPAMI 2015) reparametrises
the problem without changing any assignment's cost.  Nodes are taken in order; node
``i`` first *pulls* every incident edge's min-marginal ``m_e(a) = min_b theta_e(a, b)``
into its own costs (``theta_i += m_e``, ``theta_e -= m_e``), then *pushes* a share
``w_i = 1 / max(#later edges, #earlier edges)`` of its costs onto each edge toward
later nodes; a backward pass does the same in reverse order.  After any number of
such steps::

    lower bound = sum_i min_a theta_i(a) + sum_e min_ab theta_e(a, b)     (seconds)

is a valid bound on every assignment's cost, and no step decreases it (block
coordinate ascent on the dual of the local-polytope LP).  Compared with min-sum
diffusion (averaging each node with its edges), a forward pass carries information
along the whole graph at once, so the bound rises in tens of sweeps, not thousands,
and greedy decoding of the reparametrised costs (:func:`reparametrized`) finds plans
close to it.

Vectorised: nodes are grouped into levels (longest path from the first node) so that
no edge joins two nodes of one level; a level is one batch of array operations.
Edges keep their original matrices and the reparametrisation lives in messages
``alpha`` (one per edge end and choice): ``theta_e(a, b) = M_e(a, b) - alpha_u(a)
- alpha_v(b)``.  Each level's entries are laid out contiguously (a row of ``M_e``
for the edge's first node, a column for its second), so a pass reads the matrices
in order and writes only node costs and messages.

Memory rows enter by Lagrangian relaxation: for prices ``lambda_r >= 0`` (seconds
per byte), every assignment that fits costs at least
``min_x [cost(x) + sum_r lambda_r (bytes_r(x) - budget)]``, itself bounded by the
diffusion bound of the priced problem minus ``sum_r lambda_r (budget - constant_r)``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autopar_solver.problem import MemoryRow, Problem

__all__ = ["DiffusionBound", "diffusion_bound", "reparametrized"]

_CONVERGED_RTOL = 1e-9
"""A sweep that raises the bound by less than this (relative) ends the run."""
_CHECK_EVERY = 64
"""Levels between two deadline checks."""


class DiffusionBound:
    """Resumable TRW-S on one (possibly memory-priced) problem (see the module doc).

    ``price[r]`` (seconds per byte, >= 0) relaxes memory row ``r``; without
    prices the memory rows are ignored (still a valid bound).  One sweep is a
    forward and a backward pass.
    """

    def __init__(self, problem: Problem, price: np.ndarray | None = None) -> None:
        self.problem = problem
        n = problem.num_nodes
        sizes = np.array([len(c) for c in problem.node_costs], dtype=np.int64)
        self.node_offset = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.node_offset[1:])
        self.flat_theta = (
            np.concatenate(problem.node_costs).astype(np.float64, copy=True) if n else np.zeros(0)
        )
        self.theta = [self.flat_theta[self.node_offset[i] : self.node_offset[i + 1]] for i in range(n)]
        """Node costs now (views into one flat array)."""
        self.constant = 0.0
        self.edge_ids: list[int] = []
        """Index in ``problem.edges`` of each edge kept here (self-loops are folded)."""
        self.position: dict[int, int] = {}
        for e, (u, v, matrix) in enumerate(problem.edges):
            if u == v:
                self.theta[u] += np.diag(matrix)
                continue
            self.position[e] = len(self.edge_ids)
            self.edge_ids.append(e)
        self._layout()
        self.price = np.zeros(len(problem.memory_rows))
        """Seconds per byte of each memory row currently folded into the costs."""
        if price is not None and problem.budget_bytes is not None:
            self._add_price(np.asarray(price, dtype=np.float64))
        self.current = self._bound()
        """Bound at the current prices, seconds."""
        self.value = self.current
        """Best bound so far (any prices), seconds."""
        self.sweeps = 0
        self.converged = not math.isfinite(self.value)
        self._fresh = True
        """True until a whole sweep has run since the last change of the edge costs."""

    # -------------------------------------------------------------- layout
    def _layout(self) -> None:
        """Levels, segments and the per-level contiguous copies of the edge matrices.

        A segment is one (edge, end, choice of that end): the matrix's row for the
        edge's first node, its column for the second.  Segments are ordered by level,
        then node, then edge; ``alpha`` holds one message per segment."""
        problem = self.problem
        n, m = problem.num_nodes, len(self.edge_ids)
        off = self.node_offset
        ends = np.array([problem.edges[e][:2] for e in self.edge_ids], dtype=np.int64).reshape(m, 2)
        shapes = np.array([problem.edges[e][2].shape for e in self.edge_ids], dtype=np.int64).reshape(m, 2)
        lo, hi = ends.min(axis=1), ends.max(axis=1)
        level = np.zeros(n, dtype=np.int64)
        later: list[list[int]] = [[] for _ in range(n)]
        incident: list[list[int]] = [[] for _ in range(n)]
        for k, (a, b, u, v) in enumerate(
            zip(lo.tolist(), hi.tolist(), ends[:, 0].tolist(), ends[:, 1].tolist())
        ):
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
        linked = (n_later + n_earlier) > 0
        order = [int(i) for i in np.argsort(level, kind="stable") if linked[i]]
        # the order of the (node, edge) ends: first every end of an edge toward an earlier
        # node, by level and node, then every end toward a later node, the same way (so
        # each level's two parts are contiguous, and every edge has exactly one end in
        # the second region: the bound reads that region only)
        behind: list[tuple[int, int]] = []
        ahead: list[tuple[int, int]] = []
        parts: list[tuple[np.ndarray, int, int, int, int]] = []  # nodes, slot ranges behind/ahead
        for start, end in _runs(level[order]):
            members = order[start:end]
            b0, a0 = len(behind), len(ahead)
            for i in members:
                for k in incident[i]:
                    (ahead if int(ends[k].sum()) - i > i else behind).append((i, k))
            parts.append((np.array(members, dtype=np.int64), b0, len(behind), a0, len(ahead)))
        slots = behind + ahead
        self._ahead_slot = len(behind)
        seg_first = np.zeros(m, dtype=np.int64)
        seg_second = np.zeros(m, dtype=np.int64)
        slot_segment = np.zeros(len(slots) + 1, dtype=np.int64)
        count = 0
        for n_slot, (i, k) in enumerate(slots):
            slot_segment[n_slot] = count
            if ends[k, 0] == i:
                seg_first[k] = count
                count += int(shapes[k, 0])
            else:
                seg_second[k] = count
                count += int(shapes[k, 1])
        slot_segment[len(slots)] = count
        self.alpha = np.zeros(count)
        seg_node_choice = np.zeros(count, dtype=np.int64)
        seg_len = np.zeros(count, dtype=np.int64)
        values: list[np.ndarray] = []
        others: list[np.ndarray] = []
        self._first_entries = np.zeros(m, dtype=np.int64)
        self._second_entries = np.zeros(m, dtype=np.int64)
        slot_entry = np.zeros(len(slots) + 1, dtype=np.int64)
        position = 0
        for n_slot, (i, k) in enumerate(slots):
            slot_entry[n_slot] = position
            rows, cols = int(shapes[k, 0]), int(shapes[k, 1])
            matrix = problem.edges[self.edge_ids[k]][2]
            if ends[k, 0] == i:
                s0, size, other0, length = int(seg_first[k]), rows, int(seg_second[k]), cols
                values.append(matrix.ravel())
                others.append(np.tile(np.arange(other0, other0 + cols), rows))
                self._first_entries[k] = position
            else:
                s0, size, other0, length = int(seg_second[k]), cols, int(seg_first[k]), rows
                values.append(matrix.T.ravel())
                others.append(np.tile(np.arange(other0, other0 + rows), cols))
                self._second_entries[k] = position
            position += rows * cols
            seg_node_choice[s0 : s0 + size] = off[i] + np.arange(size)
            seg_len[s0 : s0 + size] = length
        slot_entry[len(slots)] = position
        self._values = np.concatenate(values).astype(np.float64) if values else np.zeros(0)
        index_type = np.int32 if count < 2**31 else np.int64
        self._other = np.concatenate(others).astype(index_type) if others else np.zeros(0, dtype=index_type)
        self._seg_first, self._seg_second, self._shapes = seg_first, seg_second, shapes
        # the bound's region: one end (the lower node's) of every edge, one slot per edge
        first_ahead = self._ahead_slot
        self._bound_segments = slice(int(slot_segment[first_ahead]), count)
        self._bound_entries = slice(int(slot_entry[first_ahead]), position)
        self._bound_starts = _starts(seg_len[self._bound_segments])
        self._bound_slots = slot_segment[first_ahead:-1] - slot_segment[first_ahead]
        self._bound_edges = np.array([k for _, k in ahead], dtype=np.int64)
        # segments with a finite entry (all of them unless a row or column is all forbidden)
        seg_finite = (
            np.isfinite(np.minimum.reduceat(self._values, _starts(seg_len)))
            if count
            else np.zeros(0, dtype=bool)
        )
        self.levels: list[_Level] = []
        for nodes, b0, b1, a0, a1 in parts:
            counts = off[nodes + 1] - off[nodes]
            node_choices = np.concatenate([np.arange(off[i], off[i + 1]) for i in nodes.tolist()])
            s_lo, s_hi = int(slot_segment[b0]), int(slot_segment[b1])
            t_lo, t_hi = int(slot_segment[first_ahead + a0]), int(slot_segment[first_ahead + a1])
            clean = bool(
                np.isfinite(self.flat_theta[node_choices]).all()
                and seg_finite[s_lo:s_hi].all()
                and seg_finite[t_lo:t_hi].all()
            )
            self.levels.append(
                _Level(
                    earlier=self._part(
                        b0, b1, slot_segment, slot_entry, seg_len, seg_node_choice, node_choices
                    ),
                    later=self._part(
                        first_ahead + a0,
                        first_ahead + a1,
                        slot_segment,
                        slot_entry,
                        seg_len,
                        seg_node_choice,
                        node_choices,
                    ),
                    node_choices=node_choices,
                    weight=np.repeat(weight[nodes], counts),
                    kept_forward=np.repeat(1.0 - n_later[nodes] * weight[nodes], counts),
                    kept_backward=np.repeat(1.0 - n_earlier[nodes] * weight[nodes], counts),
                    clean=clean,
                )
            )

    @staticmethod
    def _part(
        first: int,
        last: int,
        slot_segment: np.ndarray,
        slot_entry: np.ndarray,
        seg_len: np.ndarray,
        seg_node_choice: np.ndarray,
        node_choices: np.ndarray,
    ) -> _Part:
        s_lo, s_hi = int(slot_segment[first]), int(slot_segment[last])
        e_lo, e_hi = int(slot_entry[first]), int(slot_entry[last])
        return _Part(
            slice(s_lo, s_hi),
            slice(e_lo, e_hi),
            _starts(seg_len[s_lo:s_hi]),
            # nodes of a level are in index order, so their choices are sorted
            np.searchsorted(node_choices, seg_node_choice[s_lo:s_hi]),
        )

    # -------------------------------------------------------------- edges now
    def edge_matrix(self, k: int) -> np.ndarray:
        """``theta_e`` now of edge ``k`` (a new array, row-major)."""
        rows, cols = (int(x) for x in self._shapes[k])
        start = int(self._first_entries[k])
        base = self._values[start : start + rows * cols].reshape(rows, cols)
        a = self.alpha[self._seg_first[k] : self._seg_first[k] + rows]
        b = self.alpha[self._seg_second[k] : self._seg_second[k] + cols]
        return base - a[:, None] - b[None, :]

    @property
    def edges(self) -> list[np.ndarray]:
        """Every edge's ``theta_e`` now (new arrays)."""
        return [self.edge_matrix(k) for k in range(len(self.edge_ids))]

    def _add_to_edge(self, k: int, delta: np.ndarray) -> None:
        rows, cols = (int(x) for x in self._shapes[k])
        first, second = int(self._first_entries[k]), int(self._second_entries[k])
        self._values[first : first + rows * cols] += delta.ravel()
        self._values[second : second + rows * cols] += delta.T.ravel()

    # -------------------------------------------------------------- prices
    def _add_price(self, delta: np.ndarray) -> None:
        """Fold ``delta[r]`` more seconds per byte of row ``r`` into the costs.

        Adding ``delta * bytes_r(x) - delta * budget`` to every assignment's cost keeps
        the diffusion's work: the result is a reparametrisation of the newly priced
        problem, so sweeps resume from where they were."""
        problem = self.problem
        if problem.budget_bytes is None:
            return
        for r, row in enumerate(problem.memory_rows):
            d = float(delta[r])
            if d == 0:
                continue
            self.constant += d * (row.constant - problem.budget_bytes)
            for i, t in row.terms.items():
                self.theta[i] += d * t
            for e, t in row.edge_terms.items():
                if e in self.position:
                    self._add_to_edge(self.position[e], d * t)
                else:
                    u = problem.edges[e][0]
                    self.theta[u] += d * np.diag(t)
        self.price = self.price + delta

    def reprice(self, price: np.ndarray) -> None:
        """Move to new memory prices (each >= 0); the best bound so far is kept."""
        if self.problem.budget_bytes is None:
            return
        self._add_price(np.maximum(np.asarray(price, dtype=np.float64), 0.0) - self.price)
        self._fresh = True
        self.current = self._bound()
        self.value = max(self.value, self.current)
        self.converged = not math.isfinite(self.current)

    # -------------------------------------------------------------- bound
    def node_minima(self) -> np.ndarray:
        """``min_a theta_i(a)`` of every node."""
        if not self.theta:
            return np.zeros(0)
        return np.minimum.reduceat(self.flat_theta, self.node_offset[:-1])

    def edge_minima(self) -> np.ndarray:
        """``min_ab theta_e(a, b)`` of every (non-loop) edge."""
        out = np.full(len(self.edge_ids), math.inf)
        if len(self._bound_edges):
            entries, segments = self._bound_entries, self._bound_segments
            values = self._values[entries] - self.alpha[self._other[entries]]
            rows = np.minimum.reduceat(values, self._bound_starts) - self.alpha[segments]
            out[self._bound_edges] = np.minimum.reduceat(rows, self._bound_slots)
        return out

    def _bound(self) -> float:
        return math.fsum([self.constant, *self.node_minima().tolist(), *self.edge_minima().tolist()])

    # -------------------------------------------------------------- sweeps
    def _pull(self, part: _Part, pulled: np.ndarray, blocked: np.ndarray) -> None:
        """Min-marginals of one part's segments into ``pulled`` (per node choice; the
        segments' messages take them); ``blocked`` marks choices with a forbidden row."""
        if part.segments.start == part.segments.stop:
            return
        alpha = self.alpha
        own = alpha[part.segments]
        values = self._values[part.entries] - alpha[self._other[part.entries]]
        marginal = np.minimum.reduceat(values, part.starts) - own
        finite = np.isfinite(marginal)
        if not finite.all():
            blocked |= np.bincount(part.choice, weights=~finite, minlength=len(pulled)) > 0
            marginal = np.where(finite, marginal, 0.0)
        pulled += np.bincount(part.choice, weights=marginal, minlength=len(pulled))
        alpha[part.segments] = own + marginal

    def _update(self, lev: _Level, forward: bool, full: bool) -> None:
        """One level of a pass: every node of the level pulls the min-marginals of its
        edges into its own costs, then pushes ``weight`` of them onto each edge toward
        the pass's direction (all of them when it has at least as many edges that way).

        Unless ``full``, only the edges behind the pass are pulled from: the others were
        pulled in the previous pass and nothing has touched them since."""
        theta = self.flat_theta
        behind, ahead = (lev.earlier, lev.later) if forward else (lev.later, lev.earlier)
        kept = lev.kept_forward if forward else lev.kept_backward
        if lev.clean and not full:
            # nothing forbidden here: no infinity to guard (the usual case after reductions)
            alpha = self.alpha
            costs = theta[lev.node_choices]
            part = behind
            if part.segments.start != part.segments.stop:
                own = alpha[part.segments]
                rows = np.minimum.reduceat(
                    self._values[part.entries] - alpha[self._other[part.entries]], part.starts
                )
                costs += np.bincount(part.choice, weights=rows - own, minlength=len(costs))
                alpha[part.segments] = rows
            theta[lev.node_choices] = costs * kept
            if ahead.segments.start != ahead.segments.stop:
                alpha[ahead.segments] -= (costs * lev.weight)[ahead.choice]
            return
        n_choices = len(lev.node_choices)
        pulled = np.zeros(n_choices)
        blocked = np.zeros(n_choices, dtype=bool)
        self._pull(behind, pulled, blocked)
        if full:
            self._pull(ahead, pulled, blocked)
        costs = theta[lev.node_choices] + pulled
        costs[blocked] = math.inf
        ok = np.isfinite(costs)
        finite_costs = np.where(ok, costs, 0.0)
        theta[lev.node_choices] = np.where(ok, finite_costs * kept, math.inf)
        if ahead.segments.start != ahead.segments.stop:
            # pushing s onto an edge lowers its message by s
            self.alpha[ahead.segments] -= (finite_costs * lev.weight)[ahead.choice]

    def run(
        self,
        max_sweeps: int,
        deadline: float = math.inf,
        between: Callable[[], None] | None = None,
    ) -> float:
        """Up to ``max_sweeps`` more sweeps (a forward and a backward pass each; stop at
        ``deadline`` or when a sweep gains less than :data:`_CONVERGED_RTOL` relative);
        returns the best bound.  ``between`` is called once, between the forward and
        the backward pass of the last sweep (e.g. to decode in reverse node order, which
        the state after a forward pass suits as the state after a sweep suits the
        forward order)."""
        for n in range(max_sweeps):
            if self.converged or time.perf_counter() > deadline:
                break
            # the first forward pass (and the first after new prices or a cut) pulls from
            # every edge; later passes only from the edges behind them
            full = self._fresh
            cut = not self._pass(True, full, deadline)
            if not cut and between is not None and n == max_sweeps - 1:
                between()
            cut = cut or not self._pass(False, False, deadline)
            self._fresh = cut
            current = self._bound()
            if cut:
                self.current = max(self.current, current)
                self.value = max(self.value, self.current)
                break
            self.sweeps += 1
            if current - self.current <= _CONVERGED_RTOL * abs(self.current) + 1e-300:
                self.converged = True
            self.current = max(self.current, current)
            self.value = max(self.value, self.current)
        return self.value

    def _pass(self, forward: bool, full: bool, deadline: float) -> bool:
        """One pass over the levels; False when the deadline cut it short (each level's
        update keeps the problem equivalent, so the bound stays valid)."""
        levels = self.levels if forward else self.levels[::-1]
        for k, lev in enumerate(levels):
            if k % _CHECK_EVERY == _CHECK_EVERY - 1 and time.perf_counter() > deadline:
                return False
            self._update(lev, forward, full)
        return True


@dataclass
class _Part:
    """Some of a level's segments, contiguous: their slice of ``alpha``, their entries'
    slice of the matrix copies, where each segment's run starts in it, and the position
    of each segment's node choice in the level's ``node_choices``."""

    segments: slice
    entries: slice
    starts: np.ndarray
    choice: np.ndarray


@dataclass
class _Level:
    """One level's batch: its nodes' choices and the ends of their edges, split into
    the edges toward earlier nodes and those toward later ones."""

    earlier: _Part
    later: _Part
    node_choices: np.ndarray
    weight: np.ndarray
    """Share pushed onto each edge toward the pass: ``1 / max(#later, #earlier)`` per node."""
    kept_forward: np.ndarray
    kept_backward: np.ndarray
    clean: bool
    """No forbidden choice of its nodes and no all-forbidden row or column on its edges
    (prices add finite amounts, so this stays true)."""


def _starts(lengths: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths):
        np.cumsum(lengths[:-1], out=starts[1:])
    return starts


def _runs(sorted_values: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal values."""
    if not len(sorted_values):
        return []
    cuts = np.flatnonzero(np.diff(sorted_values)) + 1
    return list(itertools.pairwise([0, *cuts.tolist(), len(sorted_values)]))


def reparametrized(run: DiffusionBound) -> Problem:
    """The problem as the diffusion sees it now: same memory rows, and for every
    assignment the same cost up to a constant (plus priced memory when ``run`` has
    prices).  Greedy decisions on it are informed by the whole problem, which is
    what makes it a good start for the heuristic ("decoding" the dual)."""
    problem = run.problem
    position = {e: k for k, e in enumerate(run.edge_ids)}
    rows = []
    for row in problem.memory_rows:
        terms = dict(row.terms)
        for e, t in row.edge_terms.items():
            if e not in position:  # self-loop: only its diagonal can be used
                u = problem.edges[e][0]
                terms[u] = terms[u] + np.diag(t) if u in terms else np.diag(t).copy()
        edge_terms = {position[e]: t for e, t in row.edge_terms.items() if e in position}
        rows.append(MemoryRow(row.name, row.constant, terms, edge_terms))
    return Problem(
        node_names=problem.node_names,
        node_costs=run.theta,
        edges=[
            (problem.edges[e][0], problem.edges[e][1], m)
            for e, m in zip(run.edge_ids, run.edges, strict=True)
        ],
        memory_rows=rows,
        budget_bytes=problem.budget_bytes,
    )


def diffusion_bound(
    problem: Problem,
    price: np.ndarray | None = None,
    *,
    max_sweeps: int = 200,
    deadline: float = math.inf,
) -> float:
    """Valid lower bound (seconds) on the cost of any assignment that fits.

    See :class:`DiffusionBound`; ``inf`` when no assignment has finite cost (a
    node or edge with every entry forbidden).
    """
    return DiffusionBound(problem, price).run(max_sweeps, deadline)
