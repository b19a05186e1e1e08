"""The numeric problem the solver works on, its solution, and an independent checker.

A :class:`Problem` is a pairwise cost model over discrete choices (one choice =
one SBP signature of one op)::

    minimise   sum_i node_costs[i][c_i]  +  sum_(u, v, M) in edges  M[c_u, c_v]      (seconds)
    subject to constant_r + sum_i terms_r[i][c_i]
                          + sum_e edge_terms_r[e][c_u, c_v]  <=  budget_bytes      (each row r)

``inf`` in a node cost or an edge matrix forbids that choice or that pair.
Parallel edges (several edges between the same two nodes) are allowed and add up.

``MemoryRow.edge_terms`` is an extension used by the reductions: folding a node
whose memory depends on its choice into the edge between its two neighbours
leaves a memory term that depends on a *pair* of choices.  Problems built from
graphs normally leave it empty.

This module imports only numpy: the planner in the core builds problems in an
environment without OR-Tools.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar.errors import ConfigError, PlanError

__all__ = [
    "MEMORY_RTOL",
    "STATUSES",
    "MemoryRow",
    "Problem",
    "Solution",
    "cost_spread",
    "evaluate",
    "is_feasible",
    "memory_fits",
]

STATUSES = ("optimal", "feasible", "infeasible", "unknown")
"""Values of :attr:`Solution.status`."""

MEMORY_RTOL = 1e-9
"""Relative slack allowed when re-checking a memory row in float (summation order
differs between the solver and :func:`evaluate`; byte counts that are whole
numbers below 2**53 add up exactly, so the slack only matters for fractional
bytes)."""


@dataclass
class MemoryRow:
    """One hard memory limit: ``constant + sum_i terms[i][c_i] (+ edge terms) <= budget``.

    Units: bytes per device.  A row is typically one device's peak (parameters,
    gradients and optimizer states under ZeRO, plus activations live at a point
    of the schedule).
    """

    name: str
    constant: float
    """Bytes that do not depend on any choice."""
    terms: dict[int, np.ndarray]
    """Node index -> bytes per choice of that node (each >= 0, finite)."""
    edge_terms: dict[int, np.ndarray] = field(default_factory=dict)
    """Edge index -> bytes per pair of choices ``[c_u, c_v]`` (each >= 0, finite)."""


@dataclass
class Problem:
    """Pick one choice per node to minimise modelled step time under memory rows."""

    node_names: list[str]
    """One per op that has a choice."""
    node_costs: list[np.ndarray]
    """Seconds per choice, float64; ``inf`` forbids the choice."""
    edges: list[tuple[int, int, np.ndarray]]
    """``(u, v, M)`` with ``M[c_u, c_v]`` in seconds; ``inf`` forbids the pair."""
    memory_rows: list[MemoryRow]
    """Hard limits, each checked against ``budget_bytes``."""
    budget_bytes: float | None
    """Per-device memory budget in bytes; ``None`` ignores every memory row."""
    labels: list[list[str]] | None = None
    """Printed signature of each choice (``(S(0), B) -> S(0)``), for logs and plans."""

    def __post_init__(self) -> None:
        self.node_costs = [np.asarray(c, dtype=np.float64) for c in self.node_costs]
        self.edges = [(int(u), int(v), np.asarray(m, dtype=np.float64)) for u, v, m in self.edges]
        for row in self.memory_rows:
            row.terms = {int(i): np.asarray(t, dtype=np.float64) for i, t in row.terms.items()}
            row.edge_terms = {int(e): np.asarray(t, dtype=np.float64) for e, t in row.edge_terms.items()}
        self.validate()

    @property
    def num_nodes(self) -> int:
        return len(self.node_costs)

    @property
    def num_choices(self) -> list[int]:
        """Number of choices of each node."""
        return [len(c) for c in self.node_costs]

    def validate(self) -> None:
        """Check shapes and values; raise :class:`ConfigError` naming the bad part."""
        n = len(self.node_costs)
        if len(self.node_names) != n:
            raise _bad(f"{len(self.node_names)} node names for {n} node cost vectors; give one name per node")
        for i, costs in enumerate(self.node_costs):
            if costs.ndim != 1 or costs.size == 0:
                raise _bad(
                    f"node {self._name(i)}: costs must be a non-empty 1-D array, got shape {costs.shape}"
                )
            if np.isnan(costs).any() or (costs == -np.inf).any():
                raise _bad(f"node {self._name(i)}: costs contain NaN or -inf; use +inf to forbid a choice")
        for e, (u, v, matrix) in enumerate(self.edges):
            if not (0 <= u < n and 0 <= v < n):
                raise _bad(f"edge {e}: endpoints ({u}, {v}) out of range for {n} nodes")
            want = (len(self.node_costs[u]), len(self.node_costs[v]))
            if matrix.shape != want:
                raise _bad(
                    f"edge {e} ({self._name(u)} -> {self._name(v)}): matrix shape {matrix.shape}, "
                    f"expected {want} (choices of u, choices of v)"
                )
            if np.isnan(matrix).any() or (matrix == -np.inf).any():
                raise _bad(f"edge {e}: matrix contains NaN or -inf; use +inf to forbid a pair")
        if self.budget_bytes is not None and not (
            math.isfinite(self.budget_bytes) and self.budget_bytes >= 0
        ):
            raise _bad(f"budget_bytes must be a finite number >= 0 or None, got {self.budget_bytes}")
        for r, row in enumerate(self.memory_rows):
            if not math.isfinite(row.constant):
                raise _bad(f"memory row {row.name!r}: constant must be finite, got {row.constant}")
            for i, t in row.terms.items():
                if not 0 <= i < n or t.shape != self.node_costs[i].shape:
                    raise _bad(
                        f"memory row {row.name!r} (#{r}): term for node {i} has shape {t.shape}; "
                        f"expected a node index < {n} and one value per choice"
                    )
                if not np.isfinite(t).all() or (t < 0).any():
                    raise _bad(f"memory row {row.name!r}: node {self._name(i)} term must be finite and >= 0")
            for e, t in row.edge_terms.items():
                if not 0 <= e < len(self.edges) or t.shape != self.edges[e][2].shape:
                    raise _bad(
                        f"memory row {row.name!r}: edge term {e} must name an edge and match its matrix shape"
                    )
                if not np.isfinite(t).all() or (t < 0).any():
                    raise _bad(f"memory row {row.name!r}: edge {e} term must be finite and >= 0")
        if self.labels is not None and (
            len(self.labels) != n
            or any(len(lab) != len(c) for lab, c in zip(self.labels, self.node_costs, strict=True))
        ):
            raise _bad("labels must give one string per choice of every node")

    def _name(self, i: int) -> str:
        return repr(self.node_names[i]) if i < len(self.node_names) else f"#{i}"

    def label(self, node: int, choice: int) -> str:
        """Printed form of one choice (its signature when labels are given)."""
        if self.labels is not None:
            return self.labels[node][choice]
        return f"#{choice}"


@dataclass
class Solution:
    """One choice per node of the *original* problem, with its cost and proof status."""

    choices: list[int]
    objective: float
    """Seconds, recomputed in float from the original problem by :func:`evaluate`."""
    bound: float
    """Proven lower bound on the optimum, seconds (``inf`` when infeasible)."""
    gap: float
    """``(objective - bound) / objective``; 0 when optimal or infeasible."""
    status: str
    """One of :data:`STATUSES`."""
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    """Problem sizes before and after reductions, seconds per phase, solver details."""

    @property
    def ok(self) -> bool:
        """True when ``choices`` is a complete plan that fits (optimal or feasible)."""
        return self.status in ("optimal", "feasible")


def evaluate(problem: Problem, choices: Sequence[int]) -> tuple[float, list[float]]:
    """Cost in seconds and bytes per memory row of one assignment.

    Independent of the solver: a direct sum over the original problem.  Returns
    ``inf`` cost when a forbidden choice or pair is used.  Memory rows are
    evaluated even when ``budget_bytes`` is None.
    """
    n = problem.num_nodes
    if len(choices) != n:
        raise PlanError("bad_choices", f"{len(choices)} choices for {n} nodes; give one choice per node")
    for i, c in enumerate(choices):
        if not 0 <= c < len(problem.node_costs[i]):
            raise PlanError(
                "bad_choices",
                f"node {problem.node_names[i]!r}: choice {c} out of range "
                f"(it has {len(problem.node_costs[i])} choices)",
            )
    cost = math.fsum(float(problem.node_costs[i][c]) for i, c in enumerate(choices))
    cost += math.fsum(float(m[choices[u], choices[v]]) for u, v, m in problem.edges)
    memory = []
    for row in problem.memory_rows:
        parts = [row.constant]
        parts.extend(float(t[choices[i]]) for i, t in row.terms.items())
        for e, t in row.edge_terms.items():
            u, v, _ = problem.edges[e]
            parts.append(float(t[choices[u], choices[v]]))
        memory.append(math.fsum(parts))
    return cost, memory


def cost_spread(costs: Sequence[np.ndarray]) -> float:
    """Median over the nodes with two or more finite choices of the spread (largest minus
    smallest) of their finite costs, seconds; 1.0 when no node has two.  The time scale a
    memory price (seconds per byte) is set against."""
    spreads = [float(np.ptp(c[np.isfinite(c)])) for c in costs if np.isfinite(c).sum() > 1]
    return float(np.median(spreads)) if spreads else 1.0


def trivial_bound(problem: Problem) -> float:
    """A lower bound on the cost with no search: every node and every edge at its least
    (seconds); valid for any assignment, memory rows aside."""
    return math.fsum(
        [float(c.min()) for c in problem.node_costs] + [float(m.min()) for _, _, m in problem.edges]
    )


def is_feasible(problem: Problem, choices: Sequence[int]) -> bool:
    """True when the cost is finite and every memory row fits the budget."""
    cost, memory = evaluate(problem, choices)
    if not math.isfinite(cost):
        return False
    return memory_fits(problem.budget_bytes, memory)


def memory_fits(budget: float | None, memory: Sequence[float]) -> bool:
    """True when every row value is within ``budget`` (plus :data:`MEMORY_RTOL`)."""
    if budget is None:
        return True
    limit = budget + MEMORY_RTOL * max(budget, 1.0)
    return all(m <= limit for m in memory)


def _bad(message: str) -> ConfigError:
    return ConfigError("bad_problem", message)
