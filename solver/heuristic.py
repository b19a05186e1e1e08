"""Fast complete assignment: memory-aware greedy, penalty repair, then local search.

::

    greedy   nodes in the given order (topological): each takes the choice that
             minimises its cost plus edge costs to already-assigned neighbours,
             among choices that keep every memory row within budget (rows count
             unassigned nodes at their smallest term); when none fits, the choice
             with the least overflow
    repair   if a row still overflows: rerun the greedy with a Lagrangian penalty
             lambda_r * bytes on each overflowing row, doubling lambda_r
    improve  iterated conditional modes: re-pick each node's best choice given its
             neighbours, keeping every row within budget, until no gain or time out

Cost: greedy and one improvement sweep are O(sum over edges of choices_u x
choices_v) array work; 10k nodes x 40 choices runs in well under a second per pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from solver.problem import Problem, evaluate, memory_fits

__all__ = ["HeuristicResult", "greedy_assignment", "improve", "solve_heuristic"]

_REPAIR_ROUNDS = 24


@dataclass
class HeuristicResult:
    """A complete assignment and its evaluation on the problem it was built for."""

    choices: list[int]
    cost: float
    """Seconds (``inf`` when a forbidden choice or pair is used)."""
    memory: list[float]
    """Bytes per memory row."""
    feasible: bool
    stats: dict[str, float] = field(default_factory=dict)


class _Index:
    """Adjacency and memory terms per node, oriented for fast local evaluation."""

    def __init__(self, problem: Problem) -> None:
        n = problem.num_nodes
        self.problem = problem
        self.costs = problem.node_costs
        self.nbrs: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
        for u, v, matrix in problem.edges:
            if u == v:
                self.nbrs[u].append((u, matrix))  # handled specially: diagonal
                continue
            self.nbrs[u].append((v, matrix))
            self.nbrs[v].append((u, matrix.T))
        self.budget = problem.budget_bytes
        rows = problem.memory_rows if self.budget is not None else []
        self.num_rows = len(rows)
        self.constant = np.array([r.constant for r in rows], dtype=np.float64)
        # Per node: row ids and a (rows x choices) matrix of bytes.
        row_ids: list[list[int]] = [[] for _ in range(n)]
        row_terms: list[list[np.ndarray]] = [[] for _ in range(n)]
        for r, row in enumerate(rows):
            for i, t in row.terms.items():
                row_ids[i].append(r)
                row_terms[i].append(t)
        self.mem_rows = [np.array(ids, dtype=np.int64) for ids in row_ids]
        self.mem = [
            np.vstack(t) if t else np.zeros((0, len(problem.node_costs[i])))
            for i, t in enumerate(row_terms)
        ]
        # Pairwise memory terms: per node, (row, neighbour, matrix oriented [mine, theirs]).
        self.edge_mem: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in range(n)]
        self.edge_mem_min = np.zeros(self.num_rows)
        for r, row in enumerate(rows):
            for e, t in row.edge_terms.items():
                u, v, _ = problem.edges[e]
                self.edge_mem[u].append((r, v, t))
                if u != v:
                    self.edge_mem[v].append((r, u, t.T))
                self.edge_mem_min[r] += float(t.min())

    def local_cost(self, i: int, choices: Sequence[int]) -> np.ndarray:
        """Cost of each choice of ``i`` given the assigned neighbours (``-1`` = unassigned)."""
        total = self.costs[i].copy()
        for j, matrix in self.nbrs[i]:
            if j == i:
                total += np.diag(matrix)
            elif choices[j] >= 0:
                total += matrix[:, choices[j]]
        return total

    def mem_delta(self, i: int, choices: Sequence[int], current: int) -> np.ndarray:
        """Bytes each row gains, per choice of ``i``, relative to ``current``.

        ``current = -1`` means "relative to the row's optimistic lower bound"
        (the node's smallest term; pairwise terms at their minimum until both
        ends are assigned).  Shape: (num_rows, choices) dense in rows touched.
        """
        k = len(self.costs[i])
        delta = np.zeros((self.num_rows, k))
        if self.mem[i].shape[0]:
            base = self.mem[i].min(axis=1) if current < 0 else self.mem[i][:, current]
            delta[self.mem_rows[i]] += self.mem[i] - base[:, None]
        for r, j, t in self.edge_mem[i]:
            if j == i:
                diag = np.diag(t)
                delta[r] += diag - (t.min() if current < 0 else diag[current])
            elif choices[j] >= 0:
                col = t[:, choices[j]]
                delta[r] += col - (t.min() if current < 0 else col[current])
        return delta


def _lower_usage(index: _Index) -> np.ndarray:
    usage = index.constant.copy() + index.edge_mem_min
    for i in range(len(index.costs)):
        if index.mem[i].shape[0]:
            np.add.at(usage, index.mem_rows[i], index.mem[i].min(axis=1))
    return usage


def greedy_assignment(
    problem: Problem,
    order: Sequence[int] | None = None,
    fixed: Sequence[int | None] | None = None,
    penalty: np.ndarray | None = None,
) -> list[int]:
    """One greedy pass (see the module docstring); ``fixed`` pre-assigns some nodes.

    ``penalty[r]`` (seconds per byte) adds ``penalty[r] * bytes`` of row ``r`` to
    each choice's score.
    """
    index = _Index(problem)
    return _greedy(index, order, fixed, penalty)


def _greedy(
    index: _Index,
    order: Sequence[int] | None,
    fixed: Sequence[int | None] | None,
    penalty: np.ndarray | None,
) -> list[int]:
    n = len(index.costs)
    order = range(n) if order is None else order
    choices = [-1] * n
    usage = _lower_usage(index)
    budget = index.budget
    # Pre-assign fixed nodes (their rows move from the lower bound to the real value).
    if fixed is not None:
        for i, c in enumerate(fixed):
            if c is not None:
                if index.num_rows:
                    usage += index.mem_delta(i, choices, -1)[:, c]
                choices[i] = c
    for i in order:
        if choices[i] >= 0:
            continue
        score = index.local_cost(i, choices)
        if index.num_rows and budget is not None:
            delta = index.mem_delta(i, choices, -1)
            if penalty is not None:
                score = score + penalty @ delta
            after = usage[:, None] + delta
            overflow = np.maximum(after - budget, 0.0).sum(axis=0)
            finite = np.isfinite(score)
            fits = (overflow == 0) & finite
            if fits.any():
                pick = int(np.argmin(np.where(fits, score, np.inf)))
            else:
                # Least overflow among finite choices (any choice if none is finite).
                pool = finite if finite.any() else np.ones_like(finite)
                least = np.where(pool, overflow, np.inf)
                tied = least == least.min()
                pick = int(np.argmin(np.where(tied, np.where(finite, score, 0.0), np.inf)))
            usage += delta[:, pick]
        else:
            pick = int(np.argmin(score))
        choices[i] = pick
    return choices


def improve(
    problem: Problem,
    choices: Sequence[int],
    order: Sequence[int] | None = None,
    time_budget_s: float = 1.0,
    max_sweeps: int = 50,
) -> list[int]:
    """Iterated conditional modes from ``choices``; never leaves the memory budget.

    When ``choices`` overflows some row, a move is accepted only if it does not
    increase any row's overflow.
    """
    return _improve(_Index(problem), list(choices), order, time_budget_s, max_sweeps)


def _usage(index: _Index, choices: Sequence[int]) -> np.ndarray:
    usage = index.constant.copy()
    for i, c in enumerate(choices):
        if index.mem[i].shape[0]:
            np.add.at(usage, index.mem_rows[i], index.mem[i][:, c])
    problem = index.problem
    if index.budget is not None:
        for r, row in enumerate(problem.memory_rows):
            for e, t in row.edge_terms.items():
                u, v, _ = problem.edges[e]
                usage[r] += t[choices[u], choices[v]]
    return usage


def _improve(
    index: _Index,
    choices: list[int],
    order: Sequence[int] | None,
    time_budget_s: float,
    max_sweeps: int,
) -> list[int]:
    n = len(index.costs)
    order = list(range(n)) if order is None else list(order)
    deadline = time.perf_counter() + time_budget_s
    budget = index.budget
    usage = _usage(index, choices) if index.num_rows else np.zeros(0)
    for _ in range(max_sweeps):
        gained = False
        for i in order:
            if len(index.costs[i]) == 1:
                continue
            local = index.local_cost(i, choices)
            current = choices[i]
            if index.num_rows and budget is not None:
                delta = index.mem_delta(i, choices, current)
                after = usage[:, None] + delta
                limit = np.maximum(usage, budget)[:, None]  # never increase an overflow
                allowed = (after <= limit).all(axis=0)
                local = np.where(allowed, local, np.inf)
            else:
                delta = None
            pick = int(np.argmin(local))
            now = float(local[current])
            if math.isfinite(now):
                better = local[pick] < now - 1e-12 * max(1.0, abs(now))
            else:
                better = bool(math.isfinite(local[pick]))
            if better:
                choices[i] = pick
                if delta is not None:
                    usage += delta[:, pick]
                gained = True
            if time.perf_counter() > deadline:
                return choices
        if not gained:
            break
    return choices


def solve_heuristic(
    problem: Problem,
    order: Sequence[int] | None = None,
    start: Sequence[int | None] | None = None,
    time_budget_s: float = 2.0,
) -> HeuristicResult:
    """Greedy + repair + improvement.  ``start`` (complete or partial) seeds the greedy."""
    t0 = time.perf_counter()
    index = _Index(problem)
    budget = problem.budget_bytes
    choices = _greedy(index, order, start, None)
    stats: dict[str, float] = {"repair_rounds": 0.0}
    cost, memory = evaluate(problem, choices)
    fits = memory_fits(budget, memory)
    if not fits and budget is not None and index.num_rows:
        penalty = np.zeros(index.num_rows)
        scale = _penalty_scale(index)
        for round_ in range(_REPAIR_ROUNDS):
            over = np.array(memory) > budget
            penalty = np.where(over, np.maximum(2 * penalty, scale), penalty)
            choices = _greedy(index, order, start if round_ < 2 else None, penalty)
            cost, memory = evaluate(problem, choices)
            stats["repair_rounds"] = round_ + 1.0
            if memory_fits(budget, memory):
                break
    stats["greedy_s"] = time.perf_counter() - t0
    stats["greedy_cost"] = cost
    remaining = max(0.0, time_budget_s - (time.perf_counter() - t0))
    choices = _improve(index, choices, order, remaining, 50)
    cost, memory = evaluate(problem, choices)
    stats["improve_s"] = time.perf_counter() - t0 - stats["greedy_s"]
    feasible = math.isfinite(cost) and memory_fits(budget, memory)
    return HeuristicResult(choices, cost, memory, feasible, stats)


def _penalty_scale(index: _Index) -> float:
    """Seconds per byte that makes memory matter as much as time, order of magnitude."""
    spreads = [float(np.ptp(c[np.isfinite(c)])) for c in index.costs if np.isfinite(c).sum() > 1]
    mem_spreads = [
        float(np.ptp(m, axis=1).max()) for m in index.mem if m.shape[0] and m.shape[1] > 1
    ]
    cost_scale = float(np.median(spreads)) if spreads else 1.0
    mem_scale = float(np.median(mem_spreads)) if mem_spreads else 1.0
    return max(cost_scale, 1e-30) / max(mem_scale, 1.0)
