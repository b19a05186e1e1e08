"""The outcome of the exact reductions (:mod:`autopar_solver.reductions`): the reduced problem
and its undo stack.

:class:`Reduction` maps a plan of the reduced problem back to the original one
(:meth:`Reduction.expand`: the kept nodes' choices, then the folded nodes in the reverse
order of their folds: a fixed choice, a leaf's table on its neighbour's choice, a chain's
on its two neighbours') and an original plan onto the reduced nodes (:meth:`Reduction.restrict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar_solver.problem import Problem

__all__ = ["Chain", "Fixed", "Leaf", "Reduction", "Undo", "problem_size", "unreduced"]


@dataclass(frozen=True)
class Fixed:
    node: int
    choice: int


@dataclass(frozen=True)
class Leaf:
    node: int
    neighbour: int
    table: np.ndarray
    """Original choice of ``neighbour`` -> original choice of ``node``."""


@dataclass(frozen=True)
class Chain:
    node: int
    u: int
    w: int
    table: np.ndarray
    """(original choice of u, original choice of w) -> original choice of ``node``."""


Undo = Fixed | Leaf | Chain


@dataclass
class Reduction:
    """A reduced problem and how to map its solutions back."""

    original: Problem
    reduced: Problem
    node_ids: list[int]
    """Reduced node -> original node."""
    choice_ids: list[np.ndarray]
    """Reduced node -> original choice index of each of its remaining choices."""
    offset: float
    """Seconds folded out of the objective: original = reduced + offset."""
    infeasible: bool
    """True when the reductions proved that no assignment fits."""
    undo: list[Undo] = field(repr=False)
    stats: dict[str, Any] = field(default_factory=dict)

    def expand(self, choices: Sequence[int]) -> list[int]:
        """Map a reduced assignment to the original problem (original choice indices).

        For any reduced assignment the expanded one costs ``reduced + offset``
        and uses the same bytes in every kept memory row.
        """
        if len(choices) != len(self.node_ids):
            raise ValueError(f"{len(choices)} choices for {len(self.node_ids)} reduced nodes")
        result = [-1] * self.original.num_nodes
        for j, node in enumerate(self.node_ids):
            result[node] = int(self.choice_ids[j][choices[j]])
        for record in reversed(self.undo):
            if isinstance(record, Fixed):
                result[record.node] = record.choice
            elif isinstance(record, Leaf):
                result[record.node] = int(record.table[result[record.neighbour]])
            else:
                result[record.node] = int(record.table[result[record.u], result[record.w]])
        return result

    def restrict(self, choices: Sequence[int]) -> list[int | None]:
        """Map an original assignment onto the reduced nodes.

        ``None`` for a node whose original choice was removed by a reduction.
        """
        out: list[int | None] = []
        for j, node in enumerate(self.node_ids):
            hits = np.flatnonzero(self.choice_ids[j] == choices[node])
            out.append(int(hits[0]) if hits.size else None)
        return out


def problem_size(problem: Problem) -> dict[str, int]:
    """Counts used in reduction reports."""
    return {
        "nodes": problem.num_nodes,
        "choices": int(sum(problem.num_choices)),
        "edges": len(problem.edges),
        "edge_entries": int(sum(m.size for _, _, m in problem.edges)),
        "memory_rows": len(problem.memory_rows),
        "memory_terms": int(sum(len(r.terms) + len(r.edge_terms) for r in problem.memory_rows)),
    }


def unreduced(problem: Problem, reason: str) -> Reduction:
    """``problem`` as it is, as a :class:`Reduction` that folds nothing (``reason`` in its
    stats): for problems where the reductions cost more than they remove.  The problem
    must have no self-loop (the search after the reductions expects none)."""
    if any(u == v for u, v, _ in problem.edges):
        raise ValueError("unreduced(): the problem has a self-loop; reduce it instead")
    size = problem_size(problem)
    return Reduction(
        original=problem,
        reduced=problem,
        node_ids=list(range(problem.num_nodes)),
        choice_ids=[np.arange(len(c), dtype=np.int64) for c in problem.node_costs],
        offset=0.0,
        infeasible=False,
        undo=[],
        stats={"before": size, "after": size, "removed": {}, "skipped": reason},
    )
