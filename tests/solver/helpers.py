"""Random small problems and an exhaustive reference solver for the solver tests."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import strategies as st

from autopar_solver.problem import MEMORY_RTOL, MemoryRow, Problem


def all_assignments(problem: Problem) -> np.ndarray:
    """Every assignment, one per row (shape: assignments x nodes)."""
    ranges = [range(k) for k in problem.num_choices]
    rows = list(itertools.product(*ranges))  # one empty assignment when there are no nodes
    return np.array(rows, dtype=np.int64).reshape(len(rows), problem.num_nodes)


def table(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(assignments, cost of each, memory of each per row), computed by array indexing."""
    grid = all_assignments(problem)
    cost = np.zeros(len(grid))
    for i, c in enumerate(problem.node_costs):
        cost = cost + c[grid[:, i]]
    for u, v, m in problem.edges:
        cost = cost + m[grid[:, u], grid[:, v]]
    memory = np.zeros((len(grid), len(problem.memory_rows)))
    for r, row in enumerate(problem.memory_rows):
        memory[:, r] = row.constant
        for i, t in row.terms.items():
            memory[:, r] += t[grid[:, i]]
        for e, t in row.edge_terms.items():
            u, v, _ = problem.edges[e]
            memory[:, r] += t[grid[:, u], grid[:, v]]
    return grid, cost, memory


def brute_force(problem: Problem) -> tuple[float, list[int] | None]:
    """Optimal cost and one optimal assignment (``inf, None`` when nothing fits)."""
    grid, cost, memory = table(problem)
    ok = np.isfinite(cost)
    if problem.budget_bytes is not None and memory.shape[1]:
        limit = problem.budget_bytes + MEMORY_RTOL * max(problem.budget_bytes, 1.0)
        ok &= (memory <= limit).all(axis=1)
    if not ok.any():
        return math.inf, None
    masked = np.where(ok, cost, np.inf)
    best = int(np.argmin(masked))
    return float(masked[best]), [int(c) for c in grid[best]]


def min_peak(problem: Problem) -> float:
    """Smallest largest-memory-row over assignments with finite cost (inf if none)."""
    _, cost, memory = table(problem)
    ok = np.isfinite(cost)
    if not ok.any():
        return math.inf
    if memory.shape[1] == 0:
        return 0.0
    return float(memory[ok].max(axis=1).min())


@st.composite
def problems(
    draw: st.DrawFn,
    max_nodes: int = 8,
    max_choices: int = 4,
    memory: bool = True,
    max_assignments: int = 20_000,
) -> Problem:
    """Random problem: integer costs (some inf), random and parallel edges, memory rows."""
    n = draw(st.integers(1, max_nodes))
    ks = [draw(st.integers(1, max_choices)) for _ in range(n)]
    while math.prod(ks) > max_assignments:
        ks[ks.index(max(ks))] -= 1
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    inf_rate = draw(st.sampled_from([0.0, 0.1, 0.3]))
    costs = []
    for k in ks:
        c = rng.integers(0, 20, size=k).astype(float)
        c[rng.random(k) < inf_rate / 2] = np.inf
        costs.append(c)
    edges = []
    n_edges = draw(st.integers(0, 2 * n))
    for _ in range(n_edges):
        u, v = (int(x) for x in rng.integers(0, n, size=2))
        if u == v and n > 1:
            v = (u + 1) % n
        m = rng.integers(0, 20, size=(ks[u], ks[v])).astype(float)
        if draw(st.booleans()):
            # Boxing-like structure: zero diagonal, repeated rows/columns.
            m = m[np.ix_(rng.integers(0, ks[u], ks[u]), rng.integers(0, ks[v], ks[v]))]
        m[rng.random(m.shape) < inf_rate] = np.inf
        edges.append((u, v, m))
        if rng.random() < 0.2:
            edges.append((v, u, rng.integers(0, 5, size=(ks[v], ks[u])).astype(float)))
    rows: list[MemoryRow] = []
    budget = None
    if memory and draw(st.booleans()):
        for r in range(draw(st.integers(1, 3))):
            terms = {i: rng.integers(0, 10, size=ks[i]).astype(float) for i in range(n) if rng.random() < 0.6}
            if rng.random() < 0.3:
                for i in list(terms)[:1]:
                    terms[i] = np.full(ks[i], float(rng.integers(0, 10)))  # choice-independent
            rows.append(MemoryRow(f"row{r}", float(rng.integers(0, 5)), terms))
        budget = float(draw(st.integers(0, 40)))
    return Problem([f"op{i}" for i in range(n)], costs, edges, rows, budget)
