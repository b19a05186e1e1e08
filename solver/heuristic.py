"""Fast complete assignment: greedy, Lagrangian memory repair, tree-block descent.

::

    greedy     nodes in the given order (topological): each takes the choice that
               minimises its cost plus edge costs to already-assigned neighbours,
               among choices that keep every memory row within budget (rows count
               unassigned nodes at their smallest term); when none fits, the one
               with the least overflow
    lagrange   while a row overflows, or to trade memory for time: price memory at
               lambda_r seconds per byte of row r, descend on cost + lambda * bytes,
               raise lambda_r while row r overflows and lower it while it fits
               (bisection on a log scale); keep the best plan that fits
    descend    tree-block moves: pick a random set of nodes whose induced graph
               is a forest, fix every other node, and solve the forest exactly by
               dynamic programming (min-sum over each tree); never worse.  Then
               iterated conditional modes (one node at a time)
    polish     descent on the true cost that rejects any move leaving the budget

Cost: one greedy pass, one tree-block move and one ICM sweep are each
O(sum over edges of choices_u x choices_v) array work: about 20-60 ms for 5000
nodes x 30 choices.  Randomness comes from ``seed`` only, so runs repeat.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autopar_solver.problem import Problem, cost_spread, evaluate, memory_fits

__all__ = ["HeuristicResult", "greedy_assignment", "improve", "refine", "solve_heuristic"]

_LAGRANGE_ROUNDS = 24
_LAGRANGE_STALL = 2
_LAGRANGE_MOVES = 2
_LAGRANGE_SWEEPS = 5
_FREE_SHARE = 0.3
_STALL = 8
_MAX_MOVES = 1000


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
    price: np.ndarray | None = None
    """Seconds per byte of each memory row at which the plan fitted (Lagrangian
    prices; None when memory did not bind).  Useful for a Lagrangian bound."""


class _Index:
    """Adjacency (parallel edges summed) and memory terms, oriented per node."""

    def __init__(self, problem: Problem) -> None:
        n = problem.num_nodes
        self.problem = problem
        self.n = n
        self.costs = [c.copy() for c in problem.node_costs]
        pair: dict[tuple[int, int], np.ndarray] = {}
        for u, v, matrix in problem.edges:
            if u == v:
                self.costs[u] = self.costs[u] + np.diag(matrix)
            elif u < v:
                pair[(u, v)] = pair[(u, v)] + matrix if (u, v) in pair else matrix
            else:
                pair[(v, u)] = pair[(v, u)] + matrix.T if (v, u) in pair else matrix.T
        self.budget = problem.budget_bytes
        rows = problem.memory_rows if self.budget is not None else []
        self.num_rows = len(rows)
        self.constant = np.array([r.constant for r in rows], dtype=np.float64)
        row_ids: list[list[int]] = [[] for _ in range(n)]
        row_terms: list[list[np.ndarray]] = [[] for _ in range(n)]
        for r, row in enumerate(rows):
            for i, t in row.terms.items():
                row_ids[i].append(r)
                row_terms[i].append(t)
        # Pairwise memory (from reductions): per unordered pair, row -> matrix [lo, hi].
        self.pair_mem: dict[tuple[int, int], dict[int, np.ndarray]] = {}
        for r, row in enumerate(rows):
            for e, t in row.edge_terms.items():
                u, v, _ = problem.edges[e]
                if u == v:
                    row_ids[u].append(r)
                    row_terms[u].append(np.diag(t).copy())
                    continue
                key, oriented = ((u, v), t) if u < v else ((v, u), t.T)
                slot = self.pair_mem.setdefault(key, {})
                slot[r] = slot[r] + oriented if r in slot else oriented
                pair.setdefault(key, np.zeros_like(oriented))
        self.mem_rows = [np.array(ids, dtype=np.int64) for ids in row_ids]
        self.mem = [
            np.vstack(t) if t else np.zeros((0, len(problem.node_costs[i]))) for i, t in enumerate(row_terms)
        ]
        self.pairs = pair
        self.nbrs: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
        self.set_edge_prices(np.zeros(self.num_rows))
        # Pairwise memory per node: (row, neighbour, matrix [mine, theirs]).
        self.edge_mem: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in range(n)]
        self.edge_mem_min = np.zeros(self.num_rows)
        for (u, v), per_row in self.pair_mem.items():
            for r, t in per_row.items():
                self.edge_mem[u].append((r, v, t))
                self.edge_mem[v].append((r, u, t.T))
                self.edge_mem_min[r] += float(t.min())

    def set_edge_prices(self, price: np.ndarray) -> None:
        """Edge matrices with ``price[r]`` seconds per byte of pairwise memory added."""
        for (u, v), matrix in self.pairs.items():
            total = matrix
            for r, t in self.pair_mem.get((u, v), {}).items():
                if price[r]:
                    total = total + price[r] * t
            self.nbrs[u][v] = total
            self.nbrs[v][u] = total.T

    def priced_costs(self, price: np.ndarray) -> list[np.ndarray]:
        """Node costs with ``price[r]`` seconds per byte of row ``r`` added."""
        if not price.any():
            return self.costs
        out = []
        for i, c in enumerate(self.costs):
            if self.mem[i].shape[0]:
                c = c + price[self.mem_rows[i]] @ self.mem[i]
            out.append(c)
        return out

    def local_cost(self, i: int, choices: Sequence[int], costs: list[np.ndarray]) -> np.ndarray:
        """Cost of each choice of ``i`` given the assigned neighbours (``-1`` = unassigned)."""
        total = costs[i].copy()
        for j, matrix in self.nbrs[i].items():
            if choices[j] >= 0:
                total += matrix[:, choices[j]]
        return total

    def mem_delta(self, i: int, choices: Sequence[int], current: int) -> np.ndarray:
        """Bytes each row gains, per choice of ``i``, relative to ``current``.

        ``current = -1`` means "relative to the row's optimistic lower bound"
        (the node's smallest term; pairwise terms at their minimum until both
        ends are assigned).  Shape: (num_rows, choices).
        """
        k = len(self.costs[i])
        delta = np.zeros((self.num_rows, k))
        if self.mem[i].shape[0]:
            base = self.mem[i].min(axis=1) if current < 0 else self.mem[i][:, current]
            np.add.at(delta, self.mem_rows[i], self.mem[i] - base[:, None])
        for r, j, t in self.edge_mem[i]:
            if choices[j] >= 0:
                col = t[:, choices[j]]
                delta[r] += col - (t.min() if current < 0 else col[current])
        return delta

    def usage(self, choices: Sequence[int]) -> np.ndarray:
        usage = self.constant.copy()
        for i, c in enumerate(choices):
            if self.mem[i].shape[0]:
                np.add.at(usage, self.mem_rows[i], self.mem[i][:, c])
        for (u, v), per_row in self.pair_mem.items():
            for r, t in per_row.items():
                usage[r] += t[choices[u], choices[v]]
        return usage

    def lower_usage(self) -> np.ndarray:
        usage = self.constant + self.edge_mem_min
        for i in range(self.n):
            if self.mem[i].shape[0]:
                np.add.at(usage, self.mem_rows[i], self.mem[i].min(axis=1))
        return usage


# ---------------------------------------------------------------------- greedy
def greedy_assignment(
    problem: Problem,
    order: Sequence[int] | None = None,
    fixed: Sequence[int | None] | None = None,
) -> list[int]:
    """One greedy pass (see the module docstring); ``fixed`` pre-assigns some nodes."""
    return _greedy(_Index(problem), order, fixed)


def _greedy(index: _Index, order: Sequence[int] | None, fixed: Sequence[int | None] | None) -> list[int]:
    n = index.n
    order = range(n) if order is None else order
    choices = [-1] * n
    usage = index.lower_usage()
    budget = index.budget
    if fixed is not None:
        for i, c in enumerate(fixed):
            if c is not None:
                if index.num_rows:
                    usage += index.mem_delta(i, choices, -1)[:, c]
                choices[i] = c
    for i in order:
        if choices[i] >= 0:
            continue
        score = index.local_cost(i, choices, index.costs)
        finite = np.isfinite(score)
        if index.num_rows and budget is not None:
            delta = index.mem_delta(i, choices, -1)
            overflow = np.maximum(usage[:, None] + delta - budget, 0.0).sum(axis=0)
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


# ------------------------------------------------------------------------- ICM
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
    index = _Index(problem)
    deadline = time.perf_counter() + time_budget_s
    return _icm(index, list(choices), order, index.costs, True, deadline, max_sweeps)


def _icm(
    index: _Index,
    choices: list[int],
    order: Sequence[int] | None,
    costs: list[np.ndarray],
    hard_memory: bool,
    deadline: float,
    max_sweeps: int,
) -> list[int]:
    order = list(range(index.n)) if order is None else list(order)
    budget = index.budget if index.budget is not None else math.inf
    check = hard_memory and index.num_rows > 0 and index.budget is not None
    usage = index.usage(choices) if check else np.zeros(0)
    for _ in range(max_sweeps):
        gained = False
        for step, i in enumerate(order):
            if step % 256 == 255 and time.perf_counter() > deadline:
                return choices
            if len(costs[i]) == 1:
                continue
            local = index.local_cost(i, choices, costs)
            current = choices[i]
            delta = None
            if check:
                delta = index.mem_delta(i, choices, current)
                limit = np.maximum(usage, budget)[:, None]  # never increase an overflow
                allowed = ((usage[:, None] + delta) <= limit).all(axis=0)
                local = np.where(allowed, local, np.inf)
            pick = int(np.argmin(local))
            now = float(local[current])
            if math.isfinite(now):
                better = bool(local[pick] < now - 1e-12 * max(1.0, abs(now)))
            else:
                better = bool(math.isfinite(local[pick]))
            if better:
                choices[i] = pick
                if delta is not None:
                    usage += delta[:, pick]
                gained = True
        if not gained or time.perf_counter() > deadline:
            break
    return choices


# ------------------------------------------------------------ tree-block moves
def _random_forest(index: _Index, rng: np.random.Generator) -> list[int]:
    """Nodes, in random order, whose induced subgraph has no cycle."""
    parent = list(range(index.n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    inside = np.zeros(index.n, dtype=bool)
    chosen = []
    for i in rng.permutation(index.n):
        i = int(i)
        roots = [find(j) for j in index.nbrs[i] if inside[j]]
        if len(roots) != len(set(roots)):
            continue  # two neighbours already connected: adding i closes a cycle
        inside[i] = True
        chosen.append(i)
        for r in roots:
            parent[r] = i
    return chosen


def _tree_block(
    index: _Index,
    choices: list[int],
    costs: list[np.ndarray],
    nbrs: list[dict[int, np.ndarray]],
    rng: np.random.Generator,
) -> list[int]:
    """Re-solve a random induced forest exactly with the other nodes fixed."""
    forest = _random_forest(index, rng)
    inside = np.zeros(index.n, dtype=bool)
    inside[forest] = True
    unary: dict[int, np.ndarray] = {}
    for i in forest:
        u = costs[i].copy()
        for j, matrix in nbrs[i].items():
            if not inside[j]:
                u += matrix[:, choices[j]]
        unary[i] = u
    # Root every tree, visit in BFS order, pass messages leaves -> root.
    seen = np.zeros(index.n, dtype=bool)
    new = list(choices)
    for root in forest:
        if seen[root]:
            continue
        seen[root] = True
        order = [root]
        parent = {root: -1}
        head = 0
        while head < len(order):
            a = order[head]
            head += 1
            for j in nbrs[a]:
                if inside[j] and not seen[j]:
                    seen[j] = True
                    parent[j] = a
                    order.append(j)
        belief = unary  # built above for this call only: safe to update in place
        argmins: dict[int, np.ndarray] = {}
        for c in reversed(order[1:]):
            p = parent[c]
            total = nbrs[p][c] + belief[c]  # [choice of p, choice of c]
            best = total.argmin(axis=1)
            argmins[c] = best
            belief[p] += total[np.arange(total.shape[0]), best]
        new[root] = int(belief[root].argmin())
        for c in order[1:]:
            new[c] = int(argmins[c][new[parent[c]]])
    return new


def _priced_objective(index: _Index, choices: Sequence[int], costs: list[np.ndarray]) -> float:
    parts = [float(costs[i][c]) for i, c in enumerate(choices)]
    parts.extend(float(index.nbrs[u][v][choices[u], choices[v]]) for u, v in index.pairs)
    return math.fsum(parts)


def _descend(
    index: _Index,
    choices: list[int],
    costs: list[np.ndarray],
    rng: np.random.Generator,
    deadline: float,
    *,
    stall: int = _STALL,
    max_moves: int = _MAX_MOVES,
    fits: bool = False,
    sweeps: int = 20,
) -> list[int]:
    """Tree-block moves on ``costs`` until ``stall`` moves in a row gain nothing,
    then ICM.  With ``fits`` a move must keep every memory row within budget."""
    best = _priced_objective(index, choices, costs)
    idle = 0
    for _ in range(max_moves):
        candidate = _tree_block(index, choices, costs, index.nbrs, rng)
        value = _priced_objective(index, candidate, costs)
        gain = value < best - 1e-12 * max(1.0, abs(best))
        if value <= best and (not fits or _fits(index, candidate)):
            choices, best = candidate, value
        else:
            gain = False
        idle = 0 if gain else idle + 1
        if idle >= stall or time.perf_counter() > deadline:
            break
    return _icm(index, choices, None, costs, fits, deadline, sweeps)


def _fits(index: _Index, choices: Sequence[int]) -> bool:
    return index.budget is None or bool((index.usage(choices) <= index.budget).all())


# ------------------------------------------------------------------- top level
def solve_heuristic(
    problem: Problem,
    order: Sequence[int] | None = None,
    start: Sequence[int | None] | None = None,
    time_budget_s: float = 2.0,
    seed: int = 0,
) -> HeuristicResult:
    """Greedy (seeded by ``start``, complete or partial) -> Lagrangian repair -> descent.

    ``time_budget_s`` bounds the descent phases; ``math.inf`` makes the run depend
    on ``seed`` only (for deterministic solves).
    """
    t0 = time.perf_counter()
    deadline = t0 + time_budget_s
    rng = np.random.default_rng(seed)
    index = _Index(problem)
    budget = index.budget
    stats: dict[str, float] = {}
    choices = _greedy(index, order, start)
    stats["greedy_s"] = time.perf_counter() - t0
    stats["greedy_cost"] = evaluate(problem, choices)[0]
    best = _Best(problem, budget)
    best.consider(choices)
    # With memory rows, keep most of the time for pricing memory if it binds.
    free_deadline = t0 + _FREE_SHARE * time_budget_s if index.num_rows else deadline
    free = _descend(index, list(choices), index.costs, rng, free_deadline)
    best.consider(free)
    rounds = 0
    fit_price: np.ndarray | None = None
    free_fits = budget is None or bool((index.usage(free) <= budget).all())
    if index.num_rows and budget is not None and not free_fits:
        rounds, fit_price = _price_memory(index, budget, free, rng, deadline, best)
    stats["lagrange_rounds"] = float(rounds)
    if best.choices is not None and rounds:
        # Memory binds: descend on the true cost, refusing moves that overflow.
        best.consider(_descend(index, list(best.choices), index.costs, rng, deadline, fits=True))
    start_choices = best.choices if best.choices is not None else choices
    polished = _icm(index, list(start_choices), order, index.costs, True, deadline, 50)
    best.consider(polished)
    final = best.choices if best.choices is not None else polished
    cost, memory = evaluate(problem, final)
    stats["heuristic_s"] = time.perf_counter() - t0
    feasible = math.isfinite(cost) and memory_fits(budget, memory)
    return HeuristicResult(list(final), cost, memory, feasible, stats, fit_price)


class _Best:
    """The cheapest plan seen that fits the budget (None until one does)."""

    def __init__(self, problem: Problem, budget: float | None) -> None:
        self.problem = problem
        self.budget = budget
        self.choices: list[int] | None = None
        self.cost = math.inf

    def consider(self, candidate: list[int]) -> None:
        cost, memory = evaluate(self.problem, candidate)
        if math.isfinite(cost) and memory_fits(self.budget, memory) and cost < self.cost:
            self.choices, self.cost = list(candidate), cost


def _price_memory(
    index: _Index,
    budget: float,
    free: list[int],
    rng: np.random.Generator,
    deadline: float,
    best: _Best,
) -> tuple[int, np.ndarray]:
    """Memory binds: price it (Lagrangian relaxation of the memory rows) and bisect each
    row's price on a log scale between "overflows" and "fits", descending from ``free``
    at each price.  Returns the rounds run and the least price seen to fit, per row."""
    price = np.zeros(index.num_rows)
    low = np.zeros(index.num_rows)
    high = np.full(index.num_rows, math.inf)
    unit = _price_unit(index)
    current = free
    usage = index.usage(current)
    rounds = 0
    for round_number in range(1, _LAGRANGE_ROUNDS + 1):
        rounds = round_number
        over = usage > budget
        low = np.where(over, np.maximum(low, price), low)
        high = np.where(over, high, np.minimum(high, price))
        with np.errstate(invalid="ignore"):
            price = np.where(
                np.isfinite(high),
                np.where(low > 0, np.sqrt(low * high), high / 4),
                np.maximum(4 * low, unit),
            )
        index.set_edge_prices(price)
        current = _descend(
            index,
            current,
            index.priced_costs(price),
            rng,
            deadline,
            stall=_LAGRANGE_STALL,
            max_moves=_LAGRANGE_MOVES,
            sweeps=_LAGRANGE_SWEEPS,
        )
        usage = index.usage(current)
        best.consider(current)
        if time.perf_counter() > deadline:
            break
    index.set_edge_prices(np.zeros(index.num_rows))
    return rounds, np.where(np.isfinite(high), high, price)


def refine(
    problem: Problem, start: Sequence[int], time_budget_s: float = 2.0, seed: int = 0
) -> HeuristicResult:
    """Descent from a complete plan: tree-block moves and ICM on the true cost that
    never leave the memory budget.  A start that does not fit goes through
    :func:`solve_heuristic` instead (greedy repair and Lagrangian pricing)."""
    t0 = time.perf_counter()
    index = _Index(problem)
    if not _fits(index, start):
        return solve_heuristic(problem, start=start, time_budget_s=time_budget_s, seed=seed)
    rng = np.random.default_rng(seed)
    choices = _descend(index, list(start), index.costs, rng, t0 + time_budget_s, fits=True)
    cost, memory = evaluate(problem, choices)
    feasible = math.isfinite(cost) and memory_fits(problem.budget_bytes, memory)
    return HeuristicResult(choices, cost, memory, feasible, {"heuristic_s": time.perf_counter() - t0})


def _price_unit(index: _Index) -> float:
    """Seconds per byte at which memory and time weigh about the same."""
    mem_spreads = [float(np.ptp(m, axis=1).max()) for m in index.mem if m.shape[0] and m.shape[1] > 1]
    cost_scale = cost_spread(index.costs)
    mem_scale = float(np.median(mem_spreads)) if mem_spreads else 1.0
    return max(cost_scale, 1e-30) / max(mem_scale, 1.0)
