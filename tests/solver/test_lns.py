import math
import time

import pytest
from hypothesis import given, settings

from autopar_solver.heuristic import greedy_assignment
from autopar_solver.lns import window_search
from autopar_solver.options import SolverOptions
from autopar_solver.problem import evaluate, is_feasible
from autopar_solver.reductions import reduce_problem
from autopar_solver.solve import solve
from autopar_solver.synthetic import synthetic_problem
from tests.solver.helpers import brute_force, problems

OPTIONS = SolverOptions(time_limit_s=10, workers=2, deterministic=True, relative_gap=0.0)


@settings(max_examples=30, deadline=None)
@given(problems())
def test_one_window_covering_everything_is_exact(problem):
    problem = reduce_problem(problem, ()).reduced
    best, _ = brute_force(problem)
    start = greedy_assignment(problem)
    if math.isinf(best) or not is_feasible(problem, start):
        return
    result = window_search(
        problem,
        start,
        OPTIONS,
        deadline=math.inf,
        t0=time.perf_counter(),
        max_windows=1,
        window_vars=10**9,
    )
    assert result.cost == pytest.approx(best, abs=1e-6)


def test_small_windows_never_make_the_plan_worse():
    problem = reduce_problem(synthetic_problem(150, 8, seed=2, shape="ladder", budget_fraction=0.4)).reduced
    start = greedy_assignment(problem)
    assert is_feasible(problem, start)
    result = window_search(
        problem,
        start,
        OPTIONS,
        deadline=math.inf,
        t0=time.perf_counter(),
        max_windows=8,
        window_vars=400,
    )
    assert result.stats["windows"] == 8
    assert is_feasible(problem, result.choices)
    assert evaluate(problem, result.choices)[0] == result.cost <= evaluate(problem, start)[0]
    assert result.stats["improved"] >= 1


def test_solve_switches_to_windows_for_large_models():
    problem = synthetic_problem(80, 8, seed=3, shape="ladder", budget_fraction=0.5)
    options = SolverOptions(time_limit_s=3, workers=2, max_model_vars=0)
    solution = solve(problem, options)
    assert solution.stats["strategy"] == "windows"
    assert solution.stats["windows"]["windows"] >= 1
    assert solution.ok and is_feasible(problem, solution.choices)
    assert solution.bound <= solution.objective
    exact = solve(problem, SolverOptions(time_limit_s=10, workers=2, relative_gap=0.0))
    assert exact.stats["strategy"] == "model"
    assert exact.objective <= solution.objective + 1e-9


def test_deterministic_windows_repeat():
    problem = synthetic_problem(60, 6, seed=5, shape="ladder", budget_fraction=0.5)
    options = SolverOptions(time_limit_s=4, workers=2, deterministic=True, max_model_vars=0, relative_gap=0.0)
    first = solve(problem, options)
    second = solve(problem, options)
    assert first.stats["strategy"] == "windows"
    assert first.stats["windows"]["windows"] == 2  # time_limit_s / WINDOW_TIME_S
    assert first.choices == second.choices
    assert first.bound == second.bound
