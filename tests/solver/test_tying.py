"""Tying identical layers keeps the cost and every memory row of each tied assignment."""

from __future__ import annotations

import itertools

import numpy as np

from autopar_solver.problem import MemoryRow, Problem, evaluate
from autopar_solver.tying import tie, untie


def _problem(rng: np.random.Generator) -> tuple[Problem, list[int]]:
    # two "layers" (0-1, 2-3) of the same class pattern, chained 0 -> 1 -> 2 -> 3, plus 0 -> 2
    k = 3
    classes = [0, 1, 0, 1]
    costs = [rng.uniform(0, 1, k) for _ in range(4)]
    edges = [(u, v, rng.uniform(0, 1, (k, k))) for u, v in ((0, 1), (1, 2), (2, 3), (0, 2))]
    rows = [
        MemoryRow(
            "peak",
            5.0,
            {i: rng.uniform(0, 4, k) for i in range(4)},
            # boxed copies at consumers: one between classes (edge 1: 1 -> 2), one inside a
            # class (edge 3: 0 -> 2, both class 0), one parallel to another (edges 0 and 2)
            {e: rng.uniform(0, 2, (k, k)) for e in (0, 1, 2, 3)},
        )
    ]
    return Problem([f"n{i}" for i in range(4)], costs, edges, rows, budget_bytes=20.0), classes


def test_tied_cost_and_memory_equal_the_untied_evaluation_with_edge_terms() -> None:
    rng = np.random.default_rng(7)
    problem, classes = _problem(rng)
    tied = tie(problem, classes)
    assert tied.num_nodes == 2 and tied.memory_rows[0].edge_terms
    for choice in itertools.product(range(3), repeat=tied.num_nodes):
        tied_cost, tied_memory = evaluate(tied, list(choice))
        cost, memory = evaluate(problem, untie(classes, list(choice)))
        assert np.isclose(tied_cost, cost)
        assert np.allclose(tied_memory, memory)
