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

Layout: nodes are grouped into levels (longest path from the first node) so that
no edge joins two nodes of one level.  Edges keep their original matrices and the
reparametrisation lives in messages ``alpha`` (one per edge end and choice):
``theta_e(a, b) = M_e(a, b) - alpha_u(a) - alpha_v(b)``.  Each level's entries are laid
out contiguously (a row of ``M_e`` for the edge's first node, a column for its second),
so a pass reads the matrices in order and writes only node costs and messages.  The
passes and the bound run compiled (:mod:`autopar_solver.trws_kernels`, numba): the
NumPy version, a level at a time, spent about 45 ns per entry and sweep on mt5-base.

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

import numpy as np

from autopar_solver.dominance import dominated_choices
from autopar_solver.problem import MemoryRow, Problem
from autopar_solver.trws_kernels import (
    decode_greedy,
    descend_icm,
    edge_minima,
    lay_out_entries,
    levels_pass,
)
from autopar_solver.trws_layout import Skeleton, Slots, skeleton, slots

__all__ = [
    "SINGLE_ENTRIES",
    "SINGLE_ENTRIES_PER_EDGE",
    "DiffusionBound",
    "LayoutCut",
    "compile_all",
    "diffusion_bound",
    "reparametrized",
    "single_precision_allowed",
]

_CONVERGED_RTOL = 1e-9
"""Sweeps that raise the bound by less than this (relative) between two evaluations of it
end the run."""
_BOUND_EVERY = 5
"""Sweeps between two evaluations of the bound (and convergence tests) within a run; the
last sweep of a run always evaluates it.  On mt5-base the bound costs a third of a sweep."""
_CHECK_ENTRIES = 4_000_000
"""Edge entries a pass reads between two deadline checks (one compiled call: about 10 ms;
between calls another Python thread may take the interpreter)."""
SINGLE_ENTRIES = 40_000_000
SINGLE_ENTRIES_PER_EDGE = 4096
"""Problems with more edge entries than :data:`SINGLE_ENTRIES`, and more than this many per
edge on average (three-axis meshes), keep their edge matrices in single precision (when
:func:`single_precision_allowed`): half the memory, half the bytes a sweep reads
(mt5-base on [2, 2, 2]: 150.9M entries, 23k per edge, 1.2 GB for both copies instead of
2.4 GB)."""
_SINGLE_RTOL = 2.0**-24
"""Relative rounding of float64 to the nearest float32 (unit roundoff)."""
_LAYOUT_CHECK_SLOTS = 256
"""Slots copied between two deadline checks of the layout."""


class LayoutCut(Exception):
    """The layout of the edge matrices ran past its deadline (no bound to be had in time)."""


def single_precision_allowed(problem: Problem) -> bool:
    """Can the edge matrices of ``problem`` be kept in single precision with a proven bound?
    When every node cost is >= 0 (and every edge entry, checked once they are copied) and
    no memory row has edge terms (prices then never move an edge entry): rounding each
    entry to the nearest float32 changes it by at most :data:`_SINGLE_RTOL` of itself, so
    every plan ``x`` of cost ``E(x)`` costs ``E'(x) <= (1 + rtol) E(x)`` in the rounded
    problem, also once memory is priced (prices only add to node costs and the constant);
    a bound ``L'`` of the rounded problem then gives ``E(x) >= L' / (1 + rtol)`` for every
    plan that fits (:meth:`DiffusionBound._bound`)."""
    if any(row.edge_terms for row in problem.memory_rows):
        return False
    return all(float(c.min()) >= 0 for c in problem.node_costs)


class DiffusionBound:
    """Resumable TRW-S on one (possibly memory-priced) problem (see the module doc).

    ``price[r]`` (seconds per byte, >= 0) relaxes memory row ``r``; without
    prices the memory rows are ignored (still a valid bound).  One sweep is a
    forward and a backward pass.
    """

    def __init__(
        self,
        problem: Problem,
        price: np.ndarray | None = None,
        *,
        single: bool | None = None,
        deadline: float = math.inf,
    ) -> None:
        """``single``: edge matrices in single precision (None: when the problem has more
        than :data:`SINGLE_ENTRIES` edge entries, over :data:`SINGLE_ENTRIES_PER_EDGE` per
        edge, and :func:`single_precision_allowed`);
        ``deadline``: :class:`LayoutCut` is raised when laying out the matrices runs
        past it."""
        self.problem = problem
        if single is None:
            entries = sum(m.size for _, _, m in problem.edges)
            single = (
                entries > SINGLE_ENTRIES
                and entries > SINGLE_ENTRIES_PER_EDGE * len(problem.edges)
                and single_precision_allowed(problem)
            )
        elif single and not single_precision_allowed(problem):
            raise ValueError("single precision needs node costs >= 0 and no memory edge terms")
        self.single = single
        """Edge matrices kept as float32 (the bound corrected for their rounding)."""
        self._layout_deadline = deadline
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
        self._costs = self.flat_theta.copy()
        """Node costs of the (priced) problem itself, not reparametrised (self-loops folded
        in): what :meth:`descend` descends on, with the edge matrices in ``_values``."""
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
        sk = skeleton(self.problem, self.edge_ids)
        sl = slots(sk)
        slot_entry, seg_len = self._lay_out_entries(sk, sl)
        # the bound's region: one end (the lower node's) of every edge, one slot per edge
        self._seg_entry = np.zeros(sl.count + 1, dtype=np.int64)
        np.cumsum(seg_len, out=self._seg_entry[1:])
        self._bound_slot_segment = sl.slot_segment[sl.first_ahead :].copy()
        self._bound_edges = np.array([k for _, k in sl.ahead], dtype=np.int64)
        self._lay_out_levels(sl, slot_entry)
        self._lay_out_nodes(sk, sl)
        self.decode_order = np.argsort(sk.level, kind="stable").astype(np.int64)
        """Every node (isolated ones too) by level: the order of a forward pass."""
        self._work = np.zeros(len(self.flat_theta))
        self._blocked = np.zeros(len(self.flat_theta), dtype=np.bool_)

    def _lay_out_entries(self, sk: Skeleton, sl: Slots) -> tuple[np.ndarray, np.ndarray]:
        """Copy every edge matrix, twice, into per-segment contiguous runs (where they go:
        :func:`lay_out_entries`, compiled; the copies: one block copy per slot, a row-major
        matrix or its transpose); the messages ``alpha``.  Returns each slot's first entry
        and each segment's length."""
        problem, m, count = self.problem, len(self.edge_ids), sl.count
        self.alpha = np.zeros(count)
        self._seg_other = np.empty(count, dtype=np.int64)
        seg_node_choice = np.empty(count, dtype=np.int64)
        seg_len = np.empty(count, dtype=np.int64)
        slot_entry = np.empty(len(sl.slot_node) + 1, dtype=np.int64)
        self._first_entries = np.zeros(m, dtype=np.int64)
        self._second_entries = np.zeros(m, dtype=np.int64)
        first_node = sk.ends[:, 0].copy()
        lay_out_entries(
            sl.slot_node,
            sl.slot_edge,
            first_node,
            sk.shapes,
            self.node_offset,
            sl.seg_first,
            sl.seg_second,
            self._seg_other,
            seg_node_choice,
            seg_len,
            slot_entry,
            self._first_entries,
            self._second_entries,
        )
        total = 2 * int((sk.shapes[:, 0] * sk.shapes[:, 1]).sum()) if m else 0
        self._values = np.empty(total, dtype=np.float32 if self.single else np.float64)
        slots = zip(sl.slot_node.tolist(), sl.slot_edge.tolist(), slot_entry.tolist())
        for t, (i, k, start) in enumerate(slots):
            if t % _LAYOUT_CHECK_SLOTS == 0 and time.perf_counter() > self._layout_deadline:
                raise LayoutCut(f"laid out {t} of {len(sl.slot_node)} edge ends by the deadline")
            matrix = problem.edges[self.edge_ids[k]][2]
            view = matrix if first_node[k] == i else matrix.T
            self._values[start : slot_entry[t + 1]].reshape(view.shape)[...] = view
        if self.single and total and float(self._values.min()) < 0:
            # a negative entry: the rounding argument needs entries >= 0 (module doc)
            self.single = False
            return self._lay_out_entries(sk, sl)
        self._seg_first, self._seg_second, self._shapes = sl.seg_first, sl.seg_second, sk.shapes
        self._seg_choice = seg_node_choice
        return slot_entry, seg_len

    def _lay_out_levels(self, sl: Slots, slot_entry: np.ndarray) -> None:
        """Per level: its node choices, and the segments of its edges toward earlier nodes
        and toward later ones (each a contiguous range); the levels of a pass in chunks of
        about :data:`_CHECK_ENTRIES` entries (one compiled call each)."""
        off, parts, first_ahead, slot_segment = self.node_offset, sl.parts, sl.first_ahead, sl.slot_segment
        n_levels = len(parts)
        self.num_levels = n_levels
        self._level_choice_start = np.zeros(n_levels + 1, dtype=np.int64)
        self._earlier = np.zeros((2, n_levels), dtype=np.int64)
        self._later = np.zeros((2, n_levels), dtype=np.int64)
        level_choices: list[np.ndarray] = []
        for k, (nodes, b0, b1, a0, a1) in enumerate(parts):
            choices = np.concatenate([np.arange(off[i], off[i + 1]) for i in nodes.tolist()])
            level_choices.append(choices)
            self._level_choice_start[k + 1] = self._level_choice_start[k] + len(choices)
            self._earlier[:, k] = slot_segment[b0], slot_segment[b1]
            self._later[:, k] = slot_segment[first_ahead + a0], slot_segment[first_ahead + a1]
        self._level_choices = np.concatenate(level_choices) if level_choices else np.zeros(0, dtype=np.int64)
        level_entries = np.array(
            [
                slot_entry[b1] - slot_entry[b0] + slot_entry[first_ahead + a1] - slot_entry[first_ahead + a0]
                for _, b0, b1, a0, a1 in parts
            ],
            dtype=np.int64,
        )
        cuts = np.searchsorted(
            np.cumsum(level_entries),
            np.arange(_CHECK_ENTRIES, max(1, int(level_entries.sum())), _CHECK_ENTRIES),
        )
        bounds = np.unique(np.concatenate([[0], cuts + 1, [n_levels]])).clip(0, n_levels)
        levels = np.arange(n_levels, dtype=np.int64)
        self._chunks_forward = [levels[a:b] for a, b in itertools.pairwise(bounds.tolist()) if b > a]
        self._chunks_backward = [c[::-1].copy() for c in reversed(self._chunks_forward)]

    def _lay_out_nodes(self, sk: Skeleton, sl: Slots) -> None:
        """Per choice, the share of its cost pushed onto each edge; per node, its edge ends
        (slots): own first segment, the neighbour, its first segment."""
        n, off, ends = self.problem.num_nodes, self.node_offset, sk.ends
        slot_node, slot_edge = sl.slot_node, sl.slot_edge
        counts = off[1:] - off[:-1]
        self._weight = np.repeat(sk.weight, counts)
        """Share of its cost a choice pushes onto each edge toward the pass:
        ``1 / max(#later, #earlier)`` of its node."""
        self._kept_forward = np.repeat(1.0 - sk.n_later * sk.weight, counts)
        self._kept_backward = np.repeat(1.0 - sk.n_earlier * sk.weight, counts)
        by_node = np.argsort(slot_node, kind="stable")
        self._node_slot_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(
            np.bincount(slot_node, minlength=n) if len(slot_node) else np.zeros(n, np.int64),
            out=self._node_slot_start[1:],
        )
        own_first = ends[slot_edge, 0] == slot_node
        own = np.where(own_first, sl.seg_first[slot_edge], sl.seg_second[slot_edge])
        far = np.where(own_first, sl.seg_second[slot_edge], sl.seg_first[slot_edge])
        self._slot_own = own[by_node]
        self._slot_other_seg = far[by_node]
        self._slot_other_node = (ends[slot_edge].sum(axis=1) - slot_node)[by_node]
        self._neighbours = (
            self._values,
            self._seg_entry,
            off,
            self._node_slot_start,
            self._slot_own,
            self._slot_other_node,
            self._slot_other_seg,
        )
        """What the decoding kernels read of a node's edges (their argument order)."""

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

    # -------------------------------------------------------------- decoding
    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the node costs and messages now: what :meth:`decode` needs to decode
        this state while sweeps go on (in another thread)."""
        return self.flat_theta.copy(), self.alpha.copy()

    def decode(self, reverse: bool = False, state: tuple[np.ndarray, np.ndarray] | None = None) -> list[int]:
        """Greedy plan on the reparametrised costs now (or in ``state``, a :meth:`snapshot`),
        nodes in the forward pass's order (``reverse``: the backward pass's), each given the
        neighbours assigned before it; memory rows are not looked at
        (:func:`autopar_solver.trws_kernels.decode_greedy`)."""
        theta, alpha = state if state is not None else (self.flat_theta, self.alpha)
        order = self.decode_order[::-1].copy() if reverse else self.decode_order
        choices = np.full(self.problem.num_nodes, -1, dtype=np.int64)
        decode_greedy(order, theta, alpha, *self._neighbours, choices)
        return [int(c) for c in choices]

    def descend(self, choices: list[int], max_sweeps: int = 50) -> list[int]:
        """Iterated conditional modes from ``choices`` on the problem's own costs, not
        reparametrised (with a run's prices: seconds plus priced bytes, the Lagrangian; no
        budget is checked): :func:`autopar_solver.trws_kernels.descend_icm`."""
        out = np.array(choices, dtype=np.int64)
        descend_icm(self.decode_order, self._costs, *self._neighbours, out, max_sweeps)
        return [int(c) for c in out]

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
                self._costs[self.node_offset[i] : self.node_offset[i + 1]] += d * t
            for e, t in row.edge_terms.items():
                if e in self.position:
                    self._add_to_edge(self.position[e], d * t)
                else:
                    u = problem.edges[e][0]
                    self.theta[u] += d * np.diag(t)
                    self._costs[self.node_offset[u] : self.node_offset[u + 1]] += d * np.diag(t)
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
            slot_minima = np.empty(len(self._bound_edges))
            edge_minima(
                self.alpha,
                self._values,
                self._seg_entry,
                self._seg_other,
                self._bound_slot_segment,
                slot_minima,
            )
            out[self._bound_edges] = slot_minima
        return out

    def _bound(self) -> float:
        try:
            raw = math.fsum([self.constant, *self.node_minima().tolist(), *self.edge_minima().tolist()])
        except OverflowError:
            # memory prices so high that priced terms overflow (no plan fits; prices keep
            # rising): no bound at these prices, the best one so far stays
            return -math.inf
        # single precision: every plan costs at least the rounded problem's bound / (1 + rtol)
        return raw / (1.0 + _SINGLE_RTOL) if self.single else raw

    # -------------------------------------------------------------- sweeps
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
            if not cut:
                self.sweeps += 1
            if not (cut or n == max_sweeps - 1 or self.sweeps % _BOUND_EVERY == 0):
                continue
            current = self._bound()
            if cut:
                self.current = max(self.current, current)
                self.value = max(self.value, self.current)
                break
            if current - self.current <= _CONVERGED_RTOL * abs(self.current) + 1e-300:
                self.converged = True
            self.current = max(self.current, current)
            self.value = max(self.value, self.current)
        return self.value

    def _pass(self, forward: bool, full: bool, deadline: float) -> bool:
        """One pass over the levels; False when the deadline cut it short (each level's
        update keeps the problem equivalent, so the bound stays valid).

        A level's nodes pull the min-marginals of their edges behind the pass (of all
        their edges when ``full``: otherwise those ahead were pulled in the previous pass
        and nothing has touched them since) into their own costs, then push ``weight``
        of them onto each edge ahead (all of them when a node has at least as many edges
        that way): :func:`autopar_solver.trws_kernels.levels_pass`."""
        for k, chunk in enumerate(self._chunks_forward if forward else self._chunks_backward):
            if k and time.perf_counter() > deadline:
                return False
            self._step(chunk, forward, full)
        return True

    def _step(self, levels: np.ndarray, forward: bool, full: bool) -> None:
        """Update ``levels`` (level indices, in this order) as a pass in the direction
        ``forward`` does."""
        behind, ahead = (self._earlier, self._later) if forward else (self._later, self._earlier)
        levels_pass(
            self.flat_theta,
            self.alpha,
            self._values,
            self._seg_entry,
            self._seg_other,
            self._seg_choice,
            self._level_choice_start,
            self._level_choices,
            behind[0],
            behind[1],
            ahead[0],
            ahead[1],
            self._weight,
            self._kept_forward if forward else self._kept_backward,
            np.ascontiguousarray(levels, dtype=np.int64),
            full,
            self._work,
            self._blocked,
        )


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


def compile_all() -> None:
    """Compile (or load from numba's cache) every kernel of the solver for the argument
    types it passes, on a one-edge problem: the container image runs this
    (``python -m autopar_solver.bounds``) once at build time, so that no plan pays the
    compile."""
    problem = Problem(["a", "b"], [np.zeros(2), np.zeros(2)], [(0, 1, np.ones((2, 2)))], [], None)
    for single in (False, True):  # both layouts' kernels
        run = DiffusionBound(problem, single=single)
        run.run(1)
        run.descend(run.decode())
    dominated_choices(np.zeros((2, 2)))


if __name__ == "__main__":
    compile_all()
