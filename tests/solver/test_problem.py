import math

import numpy as np
import pytest
from hypothesis import given, settings

from autopar.errors import ConfigError, PlanError
from autopar_solver.problem import MemoryRow, Problem, evaluate, is_feasible, memory_fits
from tests.solver.helpers import problems, table


def _two_nodes(**kw):
    base = dict(
        node_names=["a", "b"],
        node_costs=[np.array([1.0, 2.0]), np.array([0.5, 0.25, 4.0])],
        edges=[(0, 1, np.arange(6.0).reshape(2, 3))],
        memory_rows=[MemoryRow("peak", 10.0, {0: np.array([3.0, 1.0])})],
        budget_bytes=12.0,
    )
    base.update(kw)
    return Problem(**base)


def test_evaluate_sums_nodes_edges_and_rows():
    p = _two_nodes()
    cost, memory = evaluate(p, [1, 2])
    assert cost == 2.0 + 4.0 + 5.0
    assert memory == [10.0 + 1.0]
    assert is_feasible(p, [1, 2])
    assert not is_feasible(p, [0, 2])  # 10 + 3 > 12


@settings(max_examples=40, deadline=None)
@given(problems())
def test_evaluate_matches_array_reference(problem):
    grid, cost, memory = table(problem)
    for row in range(0, len(grid), max(1, len(grid) // 7)):
        got_cost, got_memory = evaluate(problem, list(grid[row]))
        if math.isinf(cost[row]):
            assert math.isinf(got_cost)
        else:
            assert got_cost == pytest.approx(cost[row], rel=1e-12, abs=1e-12)
        assert got_memory == pytest.approx(list(memory[row]))


def test_parallel_edges_add_up():
    p = _two_nodes(edges=[(0, 1, np.ones((2, 3))), (1, 0, np.full((3, 2), 2.0))])
    assert evaluate(p, [0, 0])[0] == 1.0 + 0.5 + 1.0 + 2.0


def test_inf_forbids():
    p = _two_nodes(node_costs=[np.array([1.0, np.inf]), np.array([0.5, 0.25, 4.0])])
    assert math.isinf(evaluate(p, [1, 0])[0])
    assert not is_feasible(p, [1, 0])


def test_lists_are_converted_to_float_arrays():
    p = Problem(["a"], [[1, 2]], [], [MemoryRow("r", 0, {0: [1, 2]})], None)
    assert p.node_costs[0].dtype == np.float64
    assert p.memory_rows[0].terms[0].dtype == np.float64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"node_names": ["a"]}, "1 node names for 2"),
        ({"node_costs": [np.array([1.0, np.nan]), np.array([0.0, 0.0, 0.0])]}, "NaN"),
        ({"node_costs": [np.array([]), np.array([0.0, 0.0, 0.0])]}, "non-empty"),
        ({"edges": [(0, 1, np.zeros((3, 2)))]}, r"expected \(2, 3\)"),
        ({"edges": [(0, 5, np.zeros((2, 3)))]}, "out of range"),
        ({"edges": [(0, 1, np.full((2, 3), -np.inf))]}, "-inf"),
        ({"budget_bytes": -1.0}, "budget_bytes"),
        ({"memory_rows": [MemoryRow("peak", 0.0, {0: np.array([-1.0, 0.0])})]}, ">= 0"),
        ({"memory_rows": [MemoryRow("peak", 0.0, {0: np.array([1.0])})]}, "one value per choice"),
        ({"memory_rows": [MemoryRow("peak", 0.0, {}, {3: np.zeros((2, 3))})]}, "name an edge"),
        ({"labels": [["x", "y"], ["z"]]}, "labels"),
    ],
)
def test_invalid_problems_say_what_is_wrong(change, message):
    with pytest.raises(ConfigError, match=message) as info:
        _two_nodes(**change)
    assert info.value.code == "bad_problem"


def test_evaluate_rejects_bad_choices():
    p = _two_nodes()
    with pytest.raises(PlanError, match="1 choices for 2 nodes"):
        evaluate(p, [0])
    with pytest.raises(PlanError, match="choice 3 out of range"):
        evaluate(p, [0, 3])


def test_memory_fits_tolerance_is_relative():
    assert memory_fits(None, [1e30])
    assert memory_fits(1e9, [1e9 * (1 + 1e-10)])
    assert not memory_fits(1e9, [1e9 * (1 + 1e-8)])


def test_edge_terms_count_pairs():
    p = _two_nodes(memory_rows=[MemoryRow("peak", 1.0, {}, {0: np.arange(6.0).reshape(2, 3)})])
    assert evaluate(p, [1, 1])[1] == [1.0 + 4.0]
