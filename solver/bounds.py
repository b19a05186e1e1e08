"""Lower bounds for problems too large for CP-SAT's own bound.

Min-sum diffusion (Schlesinger; Werner, "A linear programming approach to
max-sum problem: a review", TPAMI 2007, section 6) reparametrises the problem
without changing any assignment's cost: for node ``i`` with incident edges
``e``, let ``m_e(a) = min_b theta_e(a, b)``; replace ``theta_i`` and each
``m_e`` by their average.  After any number of such steps::

    lower bound = sum_i min_a theta_i(a) + sum_e min_ab theta_e(a, b)     (seconds)

is a valid bound on every assignment's cost, and it never decreases (block
coordinate ascent on the dual of the local-polytope LP).

Memory rows enter by Lagrangian relaxation: for prices ``lambda_r >= 0`` (seconds
per byte), every assignment that fits costs at least
``min_x [cost(x) + sum_r lambda_r (bytes_r(x) - budget)]``, itself bounded by the
diffusion bound of the priced problem minus ``sum_r lambda_r (budget - constant_r)``.
"""

from __future__ import annotations

import math
import time

import numpy as np

from autopar_solver.problem import MemoryRow, Problem

__all__ = ["DiffusionBound", "diffusion_bound", "reparametrized"]

_CONVERGED_RTOL = 1e-9
"""A sweep that raises the bound by less than this (relative) ends the run."""


class DiffusionBound:
    """Resumable min-sum diffusion on one (possibly memory-priced) problem.

    ``price[r]`` (seconds per byte, >= 0) relaxes memory row ``r``; without
    prices the memory rows are ignored (still a valid bound).
    """

    def __init__(self, problem: Problem, price: np.ndarray | None = None) -> None:
        self.problem = problem
        self.theta = [c.copy() for c in problem.node_costs]
        self.constant = 0.0
        self.edges: list[np.ndarray] = []
        self.incident: list[list[tuple[int, bool]]] = [[] for _ in range(problem.num_nodes)]
        self.edge_ids: list[int] = []
        """Index in ``problem.edges`` of each entry of ``edges`` (self-loops are folded)."""
        self.position: dict[int, int] = {}
        for e, (u, v, matrix) in enumerate(problem.edges):
            if u == v:
                self.theta[u] = self.theta[u] + np.diag(matrix)
                continue
            self.position[e] = len(self.edges)
            self.incident[u].append((len(self.edges), True))
            self.incident[v].append((len(self.edges), False))
            self.edges.append(matrix.copy())
            self.edge_ids.append(e)
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
                self.theta[i] = self.theta[i] + d * t
            for e, t in row.edge_terms.items():
                if e in self.position:
                    self.edges[self.position[e]] += d * t
                else:
                    u = problem.edges[e][0]
                    self.theta[u] = self.theta[u] + d * np.diag(t)
        self.price = self.price + delta

    def reprice(self, price: np.ndarray) -> None:
        """Move to new memory prices (each >= 0); the best bound so far is kept."""
        if self.problem.budget_bytes is None:
            return
        self._add_price(np.maximum(np.asarray(price, dtype=np.float64), 0.0) - self.price)
        self.current = self._bound()
        self.value = max(self.value, self.current)
        self.converged = not math.isfinite(self.current)

    def _bound(self) -> float:
        parts = [self.constant]
        parts.extend(float(t.min()) for t in self.theta)
        parts.extend(float(m.min()) for m in self.edges)
        return math.fsum(parts)

    def run(self, max_sweeps: int, deadline: float = math.inf) -> float:
        """Up to ``max_sweeps`` more sweeps (stop at ``deadline`` or when a sweep
        gains less than :data:`_CONVERGED_RTOL` relative); returns the best bound."""
        theta, edges = self.theta, self.edges
        for _ in range(max_sweeps):
            if self.converged or time.perf_counter() > deadline:
                break
            cut = False
            for i, around in enumerate(self.incident):
                if not around:
                    continue
                if i % 256 == 255 and time.perf_counter() > deadline:
                    # each node's update keeps the problem equivalent, so a sweep cut
                    # short still leaves a valid reparametrisation (and bound)
                    cut = True
                    break
                mins = [edges[e].min(axis=1) if first else edges[e].min(axis=0) for e, first in around]
                average = (theta[i] + sum(mins)) / (len(around) + 1)
                for (e, first), m in zip(around, mins, strict=True):
                    # A forbidden choice (inf) keeps its rows as they are.
                    ok = np.isfinite(m) & np.isfinite(average)
                    shift = np.zeros_like(average)
                    np.subtract(average, m, out=shift, where=ok)
                    if first:
                        edges[e] += shift[:, None]
                    else:
                        edges[e] += shift[None, :]
                theta[i] = average
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
