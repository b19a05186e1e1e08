import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparError
from autopar_solver.cpsat import find_feasible, min_feasible_memory, model_size, solve_cpsat
from autopar_solver.options import SolverOptions
from autopar_solver.problem import MemoryRow, Problem, evaluate, is_feasible
from autopar_solver.reductions import reduce_problem
from autopar_solver.synthetic import synthetic_problem
from tests.solver.helpers import brute_force, min_peak, problems

EXACT = SolverOptions(time_limit_s=10, workers=2, deterministic=True, relative_gap=0.0)


def _merged(problem: Problem) -> Problem:
    """Parallel edges merged and self-loops folded, nothing else."""
    return reduce_problem(problem, ()).reduced


@settings(max_examples=70, deadline=None)
@given(problems(max_nodes=7), st.sampled_from(["auto", "full", "sparse"]))
def test_cpsat_matches_brute_force(problem, encoding):
    problem = _merged(problem)
    result = solve_cpsat(problem, EXACT, encoding=encoding)
    best, _ = brute_force(problem)
    if math.isinf(best):
        assert result.status == "infeasible"
        assert result.choices is None
        return
    assert result.status == "optimal"
    assert result.choices is not None
    assert is_feasible(problem, result.choices)
    cost = evaluate(problem, result.choices)[0]
    slack = 2 * result.rounding_error_s + 1e-9
    assert abs(cost - best) <= slack
    assert abs(result.objective_s - cost) <= result.rounding_error_s + 1e-9
    assert result.bound_s == result.objective_s


@settings(max_examples=40, deadline=None)
@given(problems(max_nodes=6))
def test_min_feasible_memory_matches_brute_force(problem):
    problem = _merged(problem)
    got, proven = min_feasible_memory(problem, EXACT)
    want = min_peak(problem)
    if math.isinf(want):
        assert math.isinf(got) and proven
        return
    assert proven
    assert got == pytest.approx(want)


def test_min_feasible_memory_budget_then_fits():
    problem = synthetic_problem(40, 6, seed=2, shape="ladder", budget_fraction=0.0)
    problem = _merged(problem)
    smallest, proven = min_feasible_memory(problem, EXACT)
    assert proven
    problem.budget_bytes = smallest
    assert solve_cpsat(problem, EXACT).status in ("optimal", "feasible")
    problem.budget_bytes = smallest - 1.0
    assert solve_cpsat(problem, EXACT).status == "infeasible"


def test_large_memory_values_round_conservatively():
    # Terms near 2**40 bytes force a unit above one byte.  Coefficients round up and
    # the budget rounds down, so the model refuses the two plans that fit within a
    # few bytes, and never accepts one that overflows.
    big = float(2**40)
    terms = {0: np.array([big + 3, 5.0]), 1: np.array([big + 1, 7.0])}
    problem = Problem(
        ["a", "b"],
        [np.array([0.0, 1.0]), np.array([0.0, 1.0])],
        [],
        [MemoryRow("peak", 100.0, terms)],
        budget_bytes=big + 110,
    )
    assert is_feasible(problem, [0, 1]) and is_feasible(problem, [1, 0])
    result = solve_cpsat(problem, EXACT)
    assert result.stats["memory_unit_bytes"] == 1024  # about 2**41 variable bytes / 2**31
    assert not result.stats["memory_exact"]
    assert result.status == "optimal"
    assert result.choices == [1, 1]
    assert is_feasible(problem, result.choices)


def test_costs_of_very_different_sizes_keep_a_small_rounding_error():
    problem = Problem(
        ["a", "b"],
        [np.array([1e-9, 2e-9]), np.array([1000.0, 1000.0 + 1e-6])],
        [(0, 1, np.array([[0.0, 3e-7], [1e-7, 0.0]]))],
        [],
        None,
    )
    result = solve_cpsat(problem, EXACT)
    assert result.rounding_error_s <= 2e-6
    assert result.choices == [0, 0]


def test_complete_hint_and_progress_reports():
    problem = _merged(synthetic_problem(60, 8, seed=3, shape="ladder", budget_fraction=0.5))
    seen = []
    hint = [int(np.argmin(c)) for c in problem.node_costs]
    result = solve_cpsat(problem, EXACT, hint=hint, progress=seen.append, offset=1.0)
    assert result.stats["hinted_vars"] == result.stats["variables"]
    phases = [p.phase for p in seen]
    assert phases[0] == "build" and "solve" in phases
    with_objective = [p for p in seen if p.objective is not None]
    assert with_objective, "no solution was reported"
    objectives = [p.objective for p in with_objective]
    assert objectives == sorted(objectives, reverse=True)
    final = evaluate(problem, result.choices)[0] + 1.0
    assert objectives[-1] == pytest.approx(final, abs=result.rounding_error_s + 1e-9)
    for p in seen:
        if p.bound is not None and p.objective is not None:
            assert p.bound <= p.objective + 1e-9


def test_forbidden_everywhere_is_infeasible():
    problem = Problem(
        ["a", "b"],
        [np.zeros(2), np.zeros(2)],
        [(0, 1, np.array([[np.inf, 1.0], [np.inf, np.inf]])), (1, 0, np.array([[0.0, 0.0], [np.inf, 0.0]]))],
        [],
        None,
    )
    assert solve_cpsat(_merged(problem), EXACT).status == "infeasible"


def test_self_loops_must_be_reduced_first():
    problem = Problem(["a"], [np.zeros(2)], [(0, 0, np.eye(2))], [], None)
    with pytest.raises(AutoparError, match="reductions") as info:
        solve_cpsat(problem, EXACT)
    assert info.value.code == "self_loop"


@settings(max_examples=40, deadline=None)
@given(problems(max_nodes=6))
def test_find_feasible_finds_a_plan_iff_one_fits(problem):
    problem = _merged(problem)
    found = find_feasible(problem, EXACT)
    best, _ = brute_force(problem)
    if math.isinf(best):
        assert found is None
    else:
        assert found is not None and is_feasible(problem, found)


def test_model_size_counts_choices_and_grouped_pairs():
    matrix = np.array([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])  # 1 row group, 2 column groups
    problem = Problem(["a", "b"], [np.array([0.0, np.inf]), np.zeros(3)], [(0, 1, matrix)], [], None)
    assert model_size(problem) == 1 + 3 + (1 * 2 + 1 + 2)


@settings(max_examples=30, deadline=None)
@given(problems(max_nodes=6))
def test_a_valid_lower_bound_keeps_the_optimum(problem):
    problem = _merged(problem)
    best, _ = brute_force(problem)
    if math.isinf(best):
        return
    result = solve_cpsat(problem, EXACT, lower_bound_s=best)  # the tightest valid bound
    assert result.status == "optimal"
    assert abs(evaluate(problem, result.choices)[0] - best) <= 2 * result.rounding_error_s + 1e-9


def test_find_feasible_counts_building_the_model_in_its_time_limit():
    """Off the deterministic path a feasibility model whose build would pass the limit is
    abandoned (None) instead of being built and solved past it."""
    problem = reduce_problem(synthetic_problem(60, seed=3)).reduced
    assert problem.budget_bytes is not None
    live = SolverOptions(time_limit_s=30, workers=1)
    found = find_feasible(problem, live, time_limit_s=30)
    assert found is not None and is_feasible(problem, found)
    assert find_feasible(problem, live, time_limit_s=1e-9) is None
    # deterministic runs ignore the clock while building: the same answer as with time
    deterministic = SolverOptions(time_limit_s=30, workers=1, deterministic=True)
    again = find_feasible(problem, deterministic, time_limit_s=30)
    assert again is not None and is_feasible(problem, again)


def test_solve_cpsat_counts_building_the_model_in_its_time_limit():
    problem = reduce_problem(synthetic_problem(60, seed=3)).reduced
    live = SolverOptions(time_limit_s=30, workers=1)
    out = solve_cpsat(problem, live, time_limit_s=1e-9)
    assert out.status == "unknown" and out.choices is None
    assert out.stats["solve_s"] == 0.0 and out.stats["build_s"] >= 0.0
    solved = solve_cpsat(problem, live, time_limit_s=30)
    assert solved.choices is not None and is_feasible(problem, solved.choices)
