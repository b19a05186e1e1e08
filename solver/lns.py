"""Large-neighbourhood search with CP-SAT on windows of a problem too big for one model.

::

    incumbent (heuristic) ──> pick a window: BFS from a random node until the
                              window's model would have ~``window_vars`` Booleans
                          ──> sub-problem: window nodes free, every other node fixed
                              (edges to fixed nodes become node costs; fixed bytes
                              become row constants)
                          ──> CP-SAT, hinted with the incumbent: never worse
                          ──> keep the result if the whole plan got cheaper and fits
                          ──> repeat until the time limit

Each window is solved exactly (or to its own time limit), so the plan improves
monotonically; no global bound comes out of it (see :mod:`autopar_solver.bounds`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autopar_solver.cpsat import solve_cpsat
from autopar_solver.heuristic import _Index
from autopar_solver.options import Progress, ProgressFn, SolverOptions
from autopar_solver.problem import MemoryRow, Problem, evaluate, memory_fits

__all__ = ["LnsResult", "window_search"]

WINDOW_VARS = 8_000
"""Target Booleans per window model (node choices + pair entries)."""
WINDOW_TIME_S = 2.0
"""Time limit of one window solve (deterministic units in deterministic mode)."""


@dataclass
class LnsResult:
    choices: list[int]
    cost: float
    stats: dict[str, Any] = field(default_factory=dict)


def _window(index: _Index, seed: int, budget_vars: int, rng: np.random.Generator) -> list[int]:
    """Nodes reached by a BFS from ``seed`` (neighbours shuffled) within ``budget_vars``;
    when a connected component is exhausted the BFS restarts from a random node."""
    sizes = [len(c) for c in index.costs]
    inside = {seed}
    order = [seed]
    used = sizes[seed]
    queue = deque([seed])
    restarts = iter(rng.permutation(index.n).tolist())

    def cost_of(j: int) -> int:
        return sizes[j] + sum(sizes[j] * sizes[m] for m in index.nbrs[j] if m in inside)

    while True:
        while queue:
            a = queue.popleft()
            nbrs = list(index.nbrs[a])
            rng.shuffle(nbrs)
            for j in nbrs:
                if j in inside or used + cost_of(j) > budget_vars:
                    continue
                used += cost_of(j)
                inside.add(j)
                order.append(j)
                queue.append(j)
        nxt = next((j for j in restarts if j not in inside), None)
        if nxt is None or used + cost_of(nxt) > budget_vars:
            return order
        used += cost_of(nxt)
        inside.add(nxt)
        order.append(nxt)
        queue.append(nxt)


def _sub_problem(index: _Index, window: list[int], choices: Sequence[int]) -> Problem:
    """The problem over ``window`` with every other node fixed to ``choices``."""
    local = {node: k for k, node in enumerate(window)}
    costs = []
    edges = []
    for node in window:
        c = index.costs[node].copy()
        for j, matrix in index.nbrs[node].items():
            if j not in local:
                c = c + matrix[:, choices[j]]
            elif local[j] > local[node]:
                edges.append((local[node], local[j], matrix))
        costs.append(c)
    rows: list[MemoryRow] = []
    budget = index.budget
    if budget is not None and index.num_rows:
        usage = index.usage(choices)
        terms: list[dict[int, np.ndarray]] = [{} for _ in range(index.num_rows)]
        edge_terms: list[dict[int, np.ndarray]] = [{} for _ in range(index.num_rows)]
        constant = usage.copy()
        for node in window:
            for r, t in zip(index.mem_rows[node], index.mem[node], strict=True):
                constant[r] -= t[choices[node]]
                terms[r][local[node]] = terms[r].get(local[node], 0.0) + t
        edge_number = {(u, v): e for e, (u, v, _) in enumerate(edges)}
        for (u, v), per_row in index.pair_mem.items():
            if u not in local and v not in local:
                continue
            for r, t in per_row.items():
                constant[r] -= t[choices[u], choices[v]]
                if u in local and v in local:
                    a, b = local[u], local[v]
                    if a < b:
                        edge_terms[r][edge_number[(a, b)]] = t
                    else:
                        edge_terms[r][edge_number[(b, a)]] = t.T
                elif u in local:
                    terms[r][local[u]] = terms[r].get(local[u], 0.0) + t[:, choices[v]]
                else:
                    terms[r][local[v]] = terms[r].get(local[v], 0.0) + t[choices[u], :]
        for r in range(index.num_rows):
            if terms[r] or edge_terms[r]:
                rows.append(MemoryRow(f"row{r}", float(constant[r]), terms[r], edge_terms[r]))
    return Problem(
        node_names=[index.problem.node_names[n] for n in window],
        node_costs=costs,
        edges=edges,
        memory_rows=rows,
        budget_bytes=budget if rows else None,
    )


def window_search(
    problem: Problem,
    choices: Sequence[int],
    options: SolverOptions,
    *,
    deadline: float,
    t0: float,
    offset: float = 0.0,
    progress: ProgressFn | None = None,
    max_windows: int | None = None,
    stall: int | None = None,
    window_vars: int = WINDOW_VARS,
) -> LnsResult:
    """Improve ``choices`` (complete, feasible) by exact CP-SAT solves on windows.

    Stops at ``deadline`` (``time.perf_counter()`` value), after ``max_windows``,
    or after ``stall`` windows in a row that gained nothing.  ``offset`` is
    added to the objective in progress reports.
    """
    index = _Index(problem)
    rng = np.random.default_rng(options.seed)
    current = list(choices)
    cost, memory = evaluate(problem, current)
    budget = problem.budget_bytes
    if not (math.isfinite(cost) and memory_fits(budget, memory)):
        return LnsResult(current, cost, {"windows": 0, "improved": 0, "reason": "start infeasible"})
    windows = improved = idle = 0
    window_options = replace(options, relative_gap=0.0, use_hint=True)
    while problem.num_nodes:
        if max_windows is not None and windows >= max_windows:
            break
        if stall is not None and idle >= stall:
            break
        remaining = deadline - time.perf_counter()
        if remaining < 0.2:
            break
        seed = int(rng.integers(problem.num_nodes))
        window = _window(index, seed, window_vars, rng)
        sub = _sub_problem(index, window, current)
        limit = WINDOW_TIME_S if options.deterministic else min(WINDOW_TIME_S, remaining)
        result = solve_cpsat(
            sub,
            window_options,
            hint=[current[n] for n in window],
            time_limit_s=limit,
        )
        windows += 1
        idle += 1
        if result.choices is None:
            continue
        candidate = list(current)
        for k, node in enumerate(window):
            candidate[node] = result.choices[k]
        new_cost, new_memory = evaluate(problem, candidate)
        if new_cost < cost - 1e-12 * max(1.0, abs(cost)) and memory_fits(budget, new_memory):
            current, cost = candidate, new_cost
            improved += 1
            idle = 0
            if progress is not None:
                progress(Progress("solve", cost + offset, None, time.perf_counter() - t0))
    return LnsResult(current, cost, {"windows": windows, "improved": improved})
