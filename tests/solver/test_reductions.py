import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar_solver.problem import MEMORY_RTOL, MemoryRow, Problem, evaluate
from autopar_solver.reductions import ALL_REDUCTIONS, reduce_problem
from tests.solver.helpers import all_assignments, brute_force, problems, table


def _fits(problem: Problem, memory: list[float]) -> bool:
    if problem.budget_bytes is None:
        return True
    limit = problem.budget_bytes + MEMORY_RTOL * max(problem.budget_bytes, 1.0)
    return all(m <= limit for m in memory)


def check_exact(problem: Problem, enabled) -> None:
    """The reduced problem plus the offset is the original problem, seen through expand."""
    reduction = reduce_problem(problem, enabled)
    best, _ = brute_force(problem)
    if reduction.infeasible:
        assert math.isinf(best), "reductions claimed infeasible but an assignment fits"
        return
    reduced = reduction.reduced
    reduced_best, reduced_arg = brute_force(reduced)
    if math.isinf(best):
        assert math.isinf(reduced_best)
        return
    assert reduced_best + reduction.offset == pytest.approx(best, rel=1e-9, abs=1e-9)
    # Every reduced assignment maps to an original one of the same cost, and a
    # reduced assignment that fits maps to one that fits.
    grid, cost, memory = table(reduced)
    step = max(1, len(grid) // 50)
    for row in range(0, len(grid), step):
        choices = reduction.expand(list(grid[row]))
        original_cost, original_memory = evaluate(problem, choices)
        if math.isinf(cost[row]):
            assert math.isinf(original_cost)
            continue
        assert original_cost == pytest.approx(cost[row] + reduction.offset, rel=1e-9, abs=1e-9)
        if _fits(reduced, list(memory[row])):
            assert _fits(problem, original_memory)
        by_name = dict(zip([r.name for r in problem.memory_rows], original_memory, strict=True))
        for r, row_obj in enumerate(reduced.memory_rows):
            assert memory[row, r] == pytest.approx(by_name[row_obj.name])
    assert reduced_arg is not None
    expanded = reduction.expand(reduced_arg)
    assert evaluate(problem, expanded)[0] == pytest.approx(best, rel=1e-9, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(problems(), st.sampled_from(sorted(ALL_REDUCTIONS)))
def test_each_reduction_alone_is_exact(problem, name):
    check_exact(problem, {name})


@settings(max_examples=60, deadline=None)
@given(problems())
def test_all_reductions_together_are_exact(problem):
    check_exact(problem, None)


@settings(max_examples=20, deadline=None)
@given(problems())
def test_no_reduction_only_merges_parallel_edges(problem):
    reduction = reduce_problem(problem, ())
    assert reduction.reduced.num_nodes == problem.num_nodes
    pairs = {(min(u, v), max(u, v)) for u, v, _ in reduction.reduced.edges}
    assert len(pairs) == len(reduction.reduced.edges)
    grid = all_assignments(problem)
    for row in grid[:: max(1, len(grid) // 20)]:
        a = evaluate(problem, list(row))[0]
        b = evaluate(reduction.reduced, list(row))[0]
        assert (math.isinf(a) and math.isinf(b)) or a == pytest.approx(b)


def _chain(n, k, seed, memory=None):
    rng = np.random.default_rng(seed)
    costs = [rng.uniform(0, 1, k) for _ in range(n)]
    edges = [(i, i + 1, rng.uniform(0, 1, (k, k))) for i in range(n - 1)]
    rows = [] if memory is None else [MemoryRow("peak", 0.0, memory)]
    return Problem([f"op{i}" for i in range(n)], costs, edges, rows, None if memory is None else 1e9)


def test_chain_without_memory_disappears():
    problem = _chain(6, 3, seed=1)
    reduction = reduce_problem(problem)
    assert reduction.reduced.num_nodes == 0
    assert reduction.offset == pytest.approx(brute_force(problem)[0])
    removed = reduction.stats["removed"]
    assert removed.get("nodes_leaf", 0) + removed.get("nodes_chain", 0) >= 4


def test_choice_dependent_memory_blocks_folding_but_constant_memory_does_not():
    k = 3
    # Cost prefers choice 0 while memory prefers choice 2: a real trade-off.
    dependent = {i: np.array([9.0, 5.0, 1.0]) for i in range(5)}
    problem = _chain(5, k, seed=2, memory=dependent)
    problem.node_costs = [np.array([0.0, 1.0, 2.0]) + c for c in problem.node_costs]
    problem.budget_bytes = 30.0
    blocked = reduce_problem(problem, ALL_REDUCTIONS - {"memory"})
    assert blocked.reduced.num_nodes == 5
    assert blocked.stats["removed"].get("chain_blocked_memory", 0) > 0
    check_exact(problem, None)

    constant = {i: np.full(k, 4.0) for i in range(5)}
    problem = _chain(5, k, seed=2, memory=constant)
    problem.budget_bytes = 25.0
    folded = reduce_problem(problem, ALL_REDUCTIONS - {"memory"})
    assert folded.reduced.num_nodes == 0
    assert folded.stats["removed"]["memory_terms_constant"] == 5


def test_pareto_dominant_memory_is_folded_into_the_neighbour():
    # Leaf 1: given node 0's choice, its best choice is also its smallest in memory.
    problem = Problem(
        ["a", "leaf"],
        [np.array([0.0, 0.0]), np.array([1.0, 0.0])],
        [(0, 1, np.array([[0.0, 5.0], [5.0, 0.0]]))],
        [MemoryRow("peak", 0.0, {1: np.array([2.0, 7.0])})],
        budget_bytes=6.0,
    )
    reduction = reduce_problem(problem, {"leaf"})
    assert reduction.stats["removed"] == {"nodes_leaf": 1}
    [row] = reduction.reduced.memory_rows
    assert row.terms[0].tolist() == [2.0, 7.0]  # node 0 now carries the leaf's bytes
    check_exact(problem, {"leaf"})


def test_chain_memory_becomes_a_pairwise_term():
    same = np.array([[0.0, 3.0], [3.0, 0.0]])
    problem = Problem(
        ["u", "v", "w"],
        [np.zeros(2), np.zeros(2), np.zeros(2)],
        [(0, 1, same), (1, 2, same)],
        [MemoryRow("peak", 0.0, {1: np.array([1.0, 2.0])})],
        budget_bytes=10.0,
    )
    # For w = 1 the cheapest v is 1, but v = 0 uses less memory: a trade-off.
    reduction = reduce_problem(problem, {"chain"})
    assert reduction.stats["removed"] == {"chain_blocked_memory": 1}
    # When v must equal w, its choice (and its bytes) follow w: no trade-off left.
    problem.edges[1] = (1, 2, np.array([[0.0, np.inf], [np.inf, 0.0]]))
    reduction = reduce_problem(problem, {"chain"})
    assert reduction.stats["removed"] == {"nodes_chain": 1}
    [row] = reduction.reduced.memory_rows
    assert row.terms == {}
    assert row.edge_terms[0].tolist() == [[1.0, 2.0], [1.0, 2.0]]
    check_exact(problem, {"chain"})


def test_dominance_keeps_one_twin_and_respects_memory():
    twins = Problem(
        ["a", "b"],
        [np.array([1.0, 1.0, 0.5]), np.array([0.0, 1.0])],
        [(0, 1, np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 1.0]]))],
        [],
        None,
    )
    reduction = reduce_problem(twins, {"dominance"})
    # choice 2 is better than 0 and 1 everywhere.
    assert reduction.choice_ids[0].tolist() == [2]
    with_memory = Problem(
        twins.node_names,
        twins.node_costs,
        twins.edges,
        [MemoryRow("peak", 0.0, {0: np.array([1.0, 1.0, 5.0])})],
        budget_bytes=10.0,
    )
    reduction = reduce_problem(with_memory, {"dominance"})
    # choice 2 uses more memory: it no longer dominates; of the twins one survives.
    assert reduction.choice_ids[0].tolist() == [0, 2]


def test_decompose_removes_rank_one_edges():
    row = np.array([1.0, 2.0, 3.0])
    col = np.array([0.5, 0.25])
    problem = Problem(
        ["a", "b"],
        [np.zeros(3), np.zeros(2)],
        [(0, 1, row[:, None] + col[None, :])],
        [],
        None,
    )
    reduction = reduce_problem(problem, {"decompose"})
    assert reduction.reduced.edges == []
    a, b = reduction.reduced.node_costs
    assert a[:, None] + b[None, :] == pytest.approx(row[:, None] + col[None, :])


def test_memory_pass_drops_redundant_rows_and_oversized_choices():
    problem = Problem(
        ["a", "b"],
        [np.zeros(3), np.zeros(2)],
        [(0, 1, np.ones((3, 2)))],
        [
            MemoryRow("never-full", 0.0, {0: np.array([1.0, 2.0, 3.0])}),
            MemoryRow("tight", 2.0, {0: np.array([1.0, 2.0, 9.0]), 1: np.array([1.0, 3.0])}),
        ],
        budget_bytes=6.0,
    )
    reduction = reduce_problem(problem, {"memory"})
    removed = reduction.stats["removed"]
    assert removed["memory_rows_redundant"] == 1
    # a=2 needs 2 + 9 + 1 > 6 whatever b does; b=1 needs 2 + 1 + 3 = 6, which fits.
    assert reduction.choice_ids[0].tolist() == [0, 1]
    assert reduction.choice_ids[1].tolist() == [0, 1]
    assert [r.name for r in reduction.reduced.memory_rows] == ["tight"]


def test_infeasible_budget_is_detected():
    problem = Problem(["a"], [np.zeros(2)], [], [MemoryRow("peak", 5.0, {0: np.array([2.0, 3.0])})], 6.0)
    assert reduce_problem(problem).infeasible
    assert not reduce_problem(problem, ()).infeasible


def test_self_loops_fold_their_diagonal():
    problem = Problem(["a"], [np.zeros(2)], [(0, 0, np.array([[1.0, 9.0], [9.0, 3.0]]))], [], None)
    reduction = reduce_problem(problem, ())
    assert reduction.reduced.node_costs[0].tolist() == [1.0, 3.0]
    assert reduction.reduced.edges == []


def test_restrict_maps_original_choices_and_marks_removed_ones():
    problem = Problem(
        ["a", "b"],
        [np.array([1.0, np.inf, 2.0]), np.zeros(2)],
        [(0, 1, np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]]))],
        [],
        None,
    )
    reduction = reduce_problem(problem, {"infeasible"})
    assert reduction.restrict([2, 1]) == [1, 1]
    assert reduction.restrict([1, 0]) == [None, 0]


def test_unknown_reduction_is_rejected():
    with pytest.raises(ValueError, match="unknown reductions"):
        reduce_problem(_chain(2, 2, 0), {"magic"})


def test_singleton_with_forbidden_choice_is_infeasible():
    # Regression: node 1's only choice is forbidden, so nothing fits.  Fixing it
    # folded ``inf`` into the offset and left a reduced problem that looked feasible.
    problem = Problem(
        ["op0", "op1", "op2"],
        [np.array([17.0]), np.array([np.inf]), np.array([1.0])],
        [],
        [],
        None,
    )
    assert math.isinf(brute_force(problem)[0])
    reduction = reduce_problem(problem, {"singleton"})
    assert reduction.infeasible
    assert reduction.stats["removed"].get("infeasible_node") == 1
    check_exact(problem, {"singleton"})
    check_exact(problem, None)


def test_reductions_stopped_at_a_deadline_keep_the_optimum():
    """Stopped between two reductions, the smaller problem still has the original's optimum."""
    from autopar_solver.synthetic import synthetic_problem

    problem = synthetic_problem(7, 3, seed=5, shape="ladder", budget_fraction=None)
    stopped = reduce_problem(problem, deadline=0.0)
    assert stopped.stats["stopped_at_deadline"]
    full = reduce_problem(problem)
    assert not full.stats["stopped_at_deadline"]
    assert stopped.reduced.num_nodes >= full.reduced.num_nodes
    best, _ = brute_force(problem)
    best_stopped, _ = brute_force(stopped.reduced)
    assert best_stopped + stopped.offset == pytest.approx(best)
