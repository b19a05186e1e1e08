"""Exact reductions: shrink a :class:`~autopar_solver.problem.Problem` before CP-SAT.

Pipeline (each step keeps the optimum and is undone by :meth:`Reduction.expand`)::

    Problem ──> merge parallel edges, fold self-loops
            ──> worklist over nodes, to a fixpoint:
                  infeasible      drop choices with inf cost or an all-inf row on an edge
                  constant_memory fold a choice-independent memory term into the row constant
                  dominance       drop choice a when some choice b is <= in cost, every
                                  incident edge row and every memory coefficient
                  singleton       fix a node with one choice: fold it into its neighbours
                  isolated        fix a node without edges to its Pareto-best choice
                  leaf            fold a degree-1 node into its neighbour (argmin kept)
                  chain           fold a degree-2 node into an edge between its neighbours
                  decompose       drop an edge whose matrix is row[a] + col[b]
            ──> memory pass (needs a budget): drop rows that can never overflow,
                drop choices that overflow even when everything else is minimal
            ──> repeat until nothing changes ──> reduced Problem + undo stack

Memory and elimination.  A node ``v`` may be folded into its neighbours only if,
for every choice of the neighbours, one of its choices is best in cost *and* in
every memory row at once (Pareto-dominant).  Then switching ``v`` to that choice
never costs time nor memory, so the fold is exact.  The memory of the chosen
choice goes into the neighbour's node term (leaf) or into a pairwise edge term
between the two neighbours (chain, :attr:`MemoryRow.edge_terms`).  Choice-
independent memory (the usual activation that does not depend on the SBP)
always passes this test.  Nodes without a Pareto-dominant choice stay in the
model.

Floating point: folds change the order of additions, so the reduced objective
plus :attr:`Reduction.offset` equals the original objective up to a few ulp.
``decompose`` accepts a matrix as ``row[a] + col[b]`` when the residual is
below ``16 * eps * max|M|``.  Byte counts that are whole numbers stay exact.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar_solver.dominance import dominated_choices, pareto_best
from autopar_solver.problem import MemoryRow, Problem
from autopar_solver.reduction import Chain, Fixed, Leaf, Reduction, Undo, problem_size, unreduced

__all__ = ["ALL_REDUCTIONS", "Reduction", "problem_size", "reduce_problem", "unreduced"]

ALL_REDUCTIONS = frozenset(
    {
        "infeasible",
        "constant_memory",
        "dominance",
        "singleton",
        "isolated",
        "leaf",
        "chain",
        "decompose",
        "memory",
    }
)
"""Names accepted by ``reduce_problem(enabled=...)``.  Parallel edges are always merged."""

_EPS = float(np.finfo(np.float64).eps)
_MAX_CHAIN_ENTRIES = 4_000_000
"""Skip a chain fold whose (choices u) x (choices v) x (choices w) tensor is larger."""


def reduce_problem(
    problem: Problem, enabled: Iterable[str] | None = None, *, deadline: float | None = None
) -> Reduction:
    """Apply the exact reductions named in ``enabled`` (default: all) to a fixpoint, or until
    ``deadline`` (a :func:`time.perf_counter` value): each reduction is exact on its own, so
    stopping between two leaves a smaller problem with the same optimum
    (``stats["stopped_at_deadline"]`` says so)."""
    names = ALL_REDUCTIONS if enabled is None else frozenset(enabled)
    unknown = names - ALL_REDUCTIONS
    if unknown:
        raise ValueError(f"unknown reductions {sorted(unknown)}; choose from {sorted(ALL_REDUCTIONS)}")
    work = _Work(problem, names)
    work.run(deadline)
    result = work.result()
    result.stats["stopped_at_deadline"] = work.stopped
    return result


@dataclass
class _Row:
    name: str
    constant: float
    terms: dict[int, np.ndarray]
    edge_terms: dict[int, np.ndarray]


class _Work:
    """Mutable working copy; nodes and choices keep their original ids."""

    def __init__(self, problem: Problem, enabled: frozenset[str]) -> None:
        self.problem = problem
        self.on = enabled
        self.budget = problem.budget_bytes
        self.counts: Counter[str] = Counter()
        self.infeasible = False
        self.offset_parts: list[float] = []
        self.undo: list[Undo] = []
        self.choices: dict[int, np.ndarray] = {
            i: np.arange(len(c), dtype=np.int64) for i, c in enumerate(problem.node_costs)
        }
        self.cost: dict[int, np.ndarray] = {i: c.copy() for i, c in enumerate(problem.node_costs)}
        self.adj: dict[int, dict[int, int]] = {i: {} for i in self.cost}
        self.edges: dict[int, tuple[int, int, np.ndarray]] = {}
        self.rows: dict[int, _Row] = {}
        self.node_rows: dict[int, set[int]] = {i: set() for i in self.cost}
        self.edge_rows: dict[int, set[int]] = {}
        self.next_edge = 0
        self.queue: deque[int] = deque()
        self.queued: set[int] = set()
        self.stopped = False
        self.blocked: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        """(edge, node) -> (the edge matrix, the node's choices whose row of it is all forbidden)."""
        self.not_sums: dict[int, np.ndarray] = {}
        """Edge -> the matrix found not to be a sum ``row[a] + col[b]`` (kept alive, compared
        by identity: a matrix that did not change is not tested again)."""
        self._load(problem)

    # ------------------------------------------------------------------ loading
    def _load(self, problem: Problem) -> None:
        if problem.budget_bytes is not None:
            for r, row in enumerate(problem.memory_rows):
                self.rows[r] = _Row(
                    row.name,
                    float(row.constant),
                    {i: t.copy() for i, t in row.terms.items()},
                    {},
                )
                for i in row.terms:
                    self.node_rows[i].add(r)
        else:
            self.counts["rows_ignored_no_budget"] = len(problem.memory_rows)
        # Edge memory terms of the input, grouped by edge.
        edge_mem: dict[int, list[tuple[int, np.ndarray]]] = {}
        if problem.budget_bytes is not None:
            for r, row in enumerate(problem.memory_rows):
                for e, t in row.edge_terms.items():
                    edge_mem.setdefault(e, []).append((r, t))
        for e, (u, v, matrix) in enumerate(problem.edges):
            mems = edge_mem.get(e, [])
            if u == v:
                # Self-loop: only the diagonal can be used.
                self.cost[u] = self.cost[u] + np.diag(matrix)
                for r, t in mems:
                    self._add_node_term(r, u, np.diag(t).copy())
                self.counts["edges_self_loop"] += 1
                continue
            self._add_edge(u, v, matrix.copy(), {r: t.copy() for r, t in mems})
        for i in self.cost:
            self._push(i)

    # ------------------------------------------------------------ primitives
    def _push(self, node: int) -> None:
        if node in self.cost and node not in self.queued:
            self.queued.add(node)
            self.queue.append(node)

    def _add_node_term(self, r: int, node: int, values: np.ndarray) -> None:
        row = self.rows[r]
        if node in row.terms:
            row.terms[node] = row.terms[node] + values
        else:
            row.terms[node] = values
            self.node_rows[node].add(r)

    def _add_edge(self, u: int, v: int, matrix: np.ndarray, mems: dict[int, np.ndarray]) -> None:
        """Add an edge; merge with an existing edge between the same nodes."""
        existing = self.adj[u].get(v)
        if existing is not None:
            eu, _, em = self.edges[existing]
            flip = eu != u
            self.edges[existing] = (
                eu,
                self.edges[existing][1],
                em + (matrix.T if flip else matrix),
            )
            for r, t in mems.items():
                t = t.T if flip else t
                row = self.rows[r]
                if existing in row.edge_terms:
                    row.edge_terms[existing] = row.edge_terms[existing] + t
                else:
                    row.edge_terms[existing] = t
                    self.edge_rows[existing].add(r)
            self.counts["edges_parallel_merged"] += 1
            return
        e = self.next_edge
        self.next_edge += 1
        self.edges[e] = (u, v, matrix)
        self.adj[u][v] = e
        self.adj[v][u] = e
        self.edge_rows[e] = set()
        for r, t in mems.items():
            self.rows[r].edge_terms[e] = t
            self.edge_rows[e].add(r)

    def _oriented(self, e: int, node: int) -> np.ndarray:
        """Edge matrix with ``node``'s choices on the rows."""
        u, _, matrix = self.edges[e]
        return matrix if u == node else matrix.T

    def _oriented_mem(self, e: int, r: int, node: int) -> np.ndarray:
        t = self.rows[r].edge_terms[e]
        return t if self.edges[e][0] == node else t.T

    def _remove_edge(self, e: int) -> None:
        u, v, _ = self.edges.pop(e)
        del self.adj[u][v]
        del self.adj[v][u]
        for r in self.edge_rows.pop(e):
            del self.rows[r].edge_terms[e]

    def _remove_node(self, node: int) -> None:
        for e in list(self.adj[node].values()):
            self._remove_edge(e)
        for r in self.node_rows.pop(node):
            del self.rows[r].terms[node]
        del self.adj[node]
        del self.cost[node]
        del self.choices[node]

    def _restrict(self, node: int, keep: np.ndarray) -> None:
        """Keep only the choices where ``keep`` is True."""
        self.choices[node] = self.choices[node][keep]
        self.cost[node] = self.cost[node][keep]
        for r in self.node_rows[node]:
            self.rows[r].terms[node] = self.rows[r].terms[node][keep]
        for nbr, e in self.adj[node].items():
            u, v, matrix = self.edges[e]
            first = u == node
            self.edges[e] = (u, v, matrix[keep, :] if first else matrix[:, keep])
            for r in self.edge_rows[e]:
                t = self.rows[r].edge_terms[e]
                self.rows[r].edge_terms[e] = t[keep, :] if first else t[:, keep]
            self._push(nbr)
        self._push(node)

    def _node_mem_rows(self, node: int, edges: Sequence[int]) -> list[int]:
        rows = set(self.node_rows[node])
        for e in edges:
            rows |= self.edge_rows[e]
        return sorted(rows)

    # --------------------------------------------------------------- driver
    def run(self, deadline: float | None = None) -> None:
        steps = 0
        while not self.infeasible:
            while self.queue and not self.infeasible:
                steps += 1
                if deadline is not None and steps % 64 == 1 and time.perf_counter() >= deadline:
                    self.stopped = True
                    return
                node = self.queue.popleft()
                self.queued.discard(node)
                if node in self.cost:
                    self._process(node)
            if self.infeasible or not self._memory_pass():
                break

    def _process(self, x: int) -> None:
        if "infeasible" in self.on and not self._drop_infeasible(x):
            return
        if "constant_memory" in self.on:
            self._fold_constant_memory(x)
        if "dominance" in self.on and len(self.cost[x]) > 1:
            self._drop_dominated(x)
        degree = len(self.adj[x])
        if "singleton" in self.on and len(self.cost[x]) == 1:
            self._fix_singleton(x)
            return
        if degree == 0 and "isolated" in self.on and self._fix_isolated(x):
            return
        if degree == 1 and "leaf" in self.on and self._fold_leaf(x):
            return
        if degree == 2 and "chain" in self.on and self._fold_chain(x):
            return
        if "decompose" in self.on:
            for e in list(self.adj[x].values()):
                self._decompose(e)

    # ----------------------------------------------------------- reductions
    def _drop_infeasible(self, x: int) -> bool:
        bad = ~np.isfinite(self.cost[x])
        for e in self.adj[x].values():
            bad |= self._blocked_rows(e, x)
        if bad.all():
            self.infeasible = True
            self.counts["infeasible_node"] += 1
            return False
        if bad.any():
            self.counts["choices_infeasible"] += int(bad.sum())
            self._restrict(x, ~bad)
        return True

    def _blocked_rows(self, e: int, x: int) -> np.ndarray:
        """Choices of ``x`` whose row of edge ``e`` is all forbidden (kept per edge matrix,
        which is replaced, never changed in place: an unchanged matrix is not scanned again)."""
        matrix = self.edges[e][2]
        key = (e, x)
        seen = self.blocked.get(key)
        if seen is not None and seen[0] is matrix:
            return seen[1]
        rows = ~np.isfinite(self._oriented(e, x)).any(axis=1)
        self.blocked[key] = (matrix, rows)
        return rows

    def _fold_constant_memory(self, x: int) -> None:
        for r in sorted(self.node_rows[x]):
            t = self.rows[r].terms[x]
            if t.max() == t.min():
                self.rows[r].constant += float(t[0])
                del self.rows[r].terms[x]
                self.node_rows[x].discard(r)
                self.counts["memory_terms_constant"] += 1

    def _features(self, x: int) -> np.ndarray:
        """Everything a choice of ``x`` contributes, one row per choice (lower is better)."""
        cols = [self.cost[x][:, None]]
        for e in self.adj[x].values():
            cols.append(self._oriented(e, x))
            cols.extend(self._oriented_mem(e, r, x) for r in sorted(self.edge_rows[e]))
        cols.extend(self.rows[r].terms[x][:, None] for r in sorted(self.node_rows[x]))
        return np.concatenate(cols, axis=1)

    def _drop_dominated(self, x: int) -> None:
        dominated = dominated_choices(np.ascontiguousarray(self._features(x), dtype=np.float64))
        if dominated.any():
            self.counts["choices_dominated"] += int(dominated.sum())
            self._restrict(x, ~dominated)

    def _fix(self, x: int, local: int) -> None:
        """Fix ``x`` to its choice ``local`` and fold it into neighbours and rows.

        Callers fix ``x`` only when some optimal (or every) assignment uses
        ``local``; a forbidden (``inf``) cost there means nothing fits at all.
        An ``inf`` offset would instead vanish from the reduced problem, which
        could then look feasible, so the problem is marked infeasible.
        """
        if not math.isfinite(float(self.cost[x][local])):
            self.infeasible = True
            self.counts["infeasible_node"] += 1
            return
        self.offset_parts.append(float(self.cost[x][local]))
        for nbr, e in list(self.adj[x].items()):
            self.cost[nbr] = self.cost[nbr] + self._oriented(e, x)[local, :]
            for r in sorted(self.edge_rows[e]):
                self._add_node_term(r, nbr, self._oriented_mem(e, r, x)[local, :].copy())
            self._push(nbr)
        for r in self.node_rows[x]:
            self.rows[r].constant += float(self.rows[r].terms[x][local])
        self.undo.append(Fixed(x, int(self.choices[x][local])))
        self._remove_node(x)

    def _fix_singleton(self, x: int) -> None:
        self.counts["nodes_singleton"] += 1
        self._fix(x, 0)

    def _fix_isolated(self, x: int) -> bool:
        ok = pareto_best(self.cost[x][None, :], [t[None, :] for t in self._mem_of(x)])[0]
        if not ok.any():
            self.counts["isolated_blocked_memory"] += 1
            return False
        self.counts["nodes_isolated"] += 1
        self._fix(x, int(np.argmax(ok)))
        return True

    def _mem_of(self, x: int) -> list[np.ndarray]:
        return [self.rows[r].terms[x] for r in sorted(self.node_rows[x])]

    def _fold_leaf(self, x: int) -> bool:
        ((u, e),) = self.adj[x].items()
        edge = self._oriented(e, u)  # [a (u), b (x)]
        total = edge + self.cost[x][None, :]
        rows = self._node_mem_rows(x, [e])
        mems = [self._contribution(x, r, [(e, u)]) for r in rows]
        ok = pareto_best(total, mems)
        needed = np.isfinite(total).any(axis=1)
        if (needed & ~ok.any(axis=1)).any():
            self.counts["leaf_blocked_memory"] += 1
            return False
        best = np.argmax(ok, axis=1)
        picks = np.arange(total.shape[0])
        self.cost[u] = self.cost[u] + np.where(needed, total[picks, best], np.inf)
        folded = [np.where(needed, np.broadcast_to(m, total.shape)[picks, best], 0.0) for m in mems]
        table = np.zeros(len(self.problem.node_costs[u]), dtype=np.int64)
        table[self.choices[u]] = self.choices[x][best]
        self.undo.append(Leaf(x, u, table))
        self._remove_node(x)
        for r, values in zip(rows, folded, strict=True):
            if values.any() or r in self.node_rows[u]:
                self._add_node_term(r, u, values)
        self.counts["nodes_leaf"] += 1
        self._push(u)
        return True

    def _contribution(self, x: int, r: int, edges: list[tuple[int, int]]) -> np.ndarray:
        """Bytes row ``r`` gets from node ``x`` (and its edges), shaped for folding.

        ``edges`` lists ``(edge, neighbour)``; the result has one axis per
        neighbour in that order with ``x``'s choices on the last axis for a leaf,
        or as ``[a, b, c]`` (u, x, w) for a chain.
        """
        row = self.rows[r]
        base = row.terms.get(x, np.zeros(len(self.cost[x])))
        if len(edges) == 1:
            ((e, nbr),) = edges
            out = np.broadcast_to(base[None, :], (len(self.cost[nbr]), len(base))).copy()
            if e in row.edge_terms:
                out = out + self._oriented_mem(e, r, nbr)
            return out
        (e1, u), (e2, w) = edges
        out = np.broadcast_to(base[None, :, None], (len(self.cost[u]), len(base), len(self.cost[w]))).copy()
        if e1 in row.edge_terms:
            out = out + self._oriented_mem(e1, r, u)[:, :, None]
        if e2 in row.edge_terms:
            out = out + self._oriented_mem(e2, r, x)[None, :, :]
        return out

    def _fold_chain(self, x: int) -> bool:
        (u, e1), (w, e2) = sorted(self.adj[x].items())
        nu, nx, nw = len(self.cost[u]), len(self.cost[x]), len(self.cost[w])
        if nu * nx * nw > _MAX_CHAIN_ENTRIES:
            self.counts["chain_blocked_size"] += 1
            return False
        left = self._oriented(e1, u)  # [a, b]
        right = self._oriented(e2, x)  # [b, c]
        total = left[:, :, None] + self.cost[x][None, :, None] + right[None, :, :]  # [a, b, c]
        rows = self._node_mem_rows(x, [e1, e2])
        mems = [self._contribution(x, r, [(e1, u), (e2, w)]) for r in rows]
        # Put x's choices last for the Pareto test.
        ok = pareto_best(total.transpose(0, 2, 1), [m.transpose(0, 2, 1) for m in mems])
        needed = np.isfinite(total).any(axis=1)
        if (needed & ~ok.any(axis=2)).any():
            self.counts["chain_blocked_memory"] += 1
            return False
        best = np.argmax(ok, axis=2)  # [a, c]
        ia, ic = np.meshgrid(np.arange(nu), np.arange(nw), indexing="ij")
        matrix = np.where(needed, total[ia, best, ic], np.inf)
        new_mems = {r: np.where(needed, m[ia, best, ic], 0.0) for r, m in zip(rows, mems, strict=True)}
        new_mems = {r: t for r, t in new_mems.items() if t.any()}
        table = np.zeros((len(self.problem.node_costs[u]), len(self.problem.node_costs[w])), dtype=np.int64)
        table[np.ix_(self.choices[u], self.choices[w])] = self.choices[x][best]
        self.undo.append(Chain(x, u, w, table))
        self._remove_node(x)
        self._add_edge(u, w, matrix, new_mems)
        self.counts["nodes_chain"] += 1
        self._push(u)
        self._push(w)
        return True

    @staticmethod
    def _split_sum(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """``(row, col)`` with ``matrix[a, b] == row[a] + col[b]``, or None."""
        if not np.isfinite(matrix).all():
            return None
        row = matrix.min(axis=1)
        rest = matrix - row[:, None]
        col = rest.min(axis=0)
        resid = rest - col[None, :]
        scale = float(np.abs(matrix).max()) if matrix.size else 0.0
        if np.abs(resid).max(initial=0.0) > 16 * _EPS * scale:
            return None
        return row, col

    def _decompose(self, e: int) -> None:
        u, v, matrix = self.edges[e]
        if self.not_sums.get(e) is matrix:
            return
        parts = self._split_sum(matrix)
        if parts is None:
            self.not_sums[e] = matrix
            return
        mem_parts = {}
        for r in self.edge_rows[e]:
            split = self._split_sum(self.rows[r].edge_terms[e])
            if split is None:
                return
            mem_parts[r] = split
        self.cost[u] = self.cost[u] + parts[0]
        self.cost[v] = self.cost[v] + parts[1]
        self._remove_edge(e)
        for r, (row_part, col_part) in sorted(mem_parts.items()):
            self._add_node_term(r, u, row_part)
            self._add_node_term(r, v, col_part)
        self.counts["edges_decomposed"] += 1
        self._push(u)
        self._push(v)

    def _memory_pass(self) -> bool:
        """Row-level memory reasoning; True when something changed."""
        if "memory" not in self.on or self.budget is None:
            return False
        changed = False
        budget = self.budget
        for r in sorted(self.rows):
            row = self.rows[r]
            mins = {i: float(t.min()) for i, t in row.terms.items()}
            edge_min = sum(float(t.min()) for t in row.edge_terms.values())
            lower = row.constant + sum(mins.values()) + edge_min
            upper = (
                row.constant
                + sum(float(t.max()) for t in row.terms.values())
                + sum(float(t.max()) for t in row.edge_terms.values())
            )
            if lower > budget:
                self.infeasible = True
                self.counts["infeasible_row"] += 1
                return False
            if upper <= budget:
                for i in row.terms:
                    self.node_rows[i].discard(r)
                    self._push(i)
                for e in row.edge_terms:
                    self.edge_rows[e].discard(r)
                    u, v, _ = self.edges[e]
                    self._push(u)
                    self._push(v)
                del self.rows[r]
                self.counts["memory_rows_redundant"] += 1
                changed = True
                continue
            for i, t in list(row.terms.items()):
                over = t > budget - (lower - mins[i])
                if over.any():
                    self.counts["choices_memory"] += int(over.sum())
                    if over.all():
                        self.infeasible = True
                        return False
                    # ``lower`` only grows when choices go, so it stays a valid bound.
                    self._restrict(i, ~over)
                    changed = True
        return changed

    # ---------------------------------------------------------------- result
    def result(self) -> Reduction:
        problem = self.problem
        before = problem_size(problem)
        node_ids = sorted(self.cost)
        index = {node: j for j, node in enumerate(node_ids)}
        edge_ids = sorted(self.edges, key=lambda e: (index[self.edges[e][0]], index[self.edges[e][1]]))
        edge_index = {e: k for k, e in enumerate(edge_ids)}
        edges = [(index[self.edges[e][0]], index[self.edges[e][1]], self.edges[e][2]) for e in edge_ids]
        rows = [
            MemoryRow(
                row.name,
                row.constant,
                {index[i]: t for i, t in sorted(row.terms.items(), key=lambda kv: index[kv[0]])},
                {
                    edge_index[e]: t
                    for e, t in sorted(row.edge_terms.items(), key=lambda kv: edge_index[kv[0]])
                },
            )
            for _, row in sorted(self.rows.items())
        ]
        labels = None
        if problem.labels is not None:
            labels = [[problem.labels[n][int(c)] for c in self.choices[n]] for n in node_ids]
        if self.infeasible:
            node_ids, edges, rows, labels = [], [], [], None
        reduced = Problem(
            node_names=[problem.node_names[n] for n in node_ids],
            node_costs=[self.cost[n] for n in node_ids],
            edges=edges,
            memory_rows=rows,
            budget_bytes=problem.budget_bytes,
            labels=labels,
        )
        after = problem_size(reduced)
        stats: dict[str, Any] = {
            "before": before,
            "after": after,
            "removed": dict(sorted(self.counts.items())),
        }
        return Reduction(
            original=problem,
            reduced=reduced,
            node_ids=node_ids,
            choice_ids=[self.choices[n].copy() for n in node_ids],
            offset=math.fsum(self.offset_parts),
            infeasible=self.infeasible,
            undo=self.undo,
            stats=stats,
        )
