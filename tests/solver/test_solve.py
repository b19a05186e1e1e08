import math
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar_solver.dual as dual_module
import autopar_solver.solve as solve_module
from autopar.errors import VerificationError
from autopar_solver.bounds import DiffusionBound
from autopar_solver.heuristic import HeuristicResult
from autopar_solver.options import PHASES, SolverOptions
from autopar_solver.problem import MemoryRow, Problem, evaluate, is_feasible, memory_fits
from autopar_solver.reductions import reduce_problem
from autopar_solver.solve import solve
from autopar_solver.synthetic import synthetic_problem
from tests.solver.helpers import brute_force, min_peak, problems


def _options(reductions: bool = True) -> SolverOptions:
    return SolverOptions(
        time_limit_s=10, workers=2, deterministic=True, relative_gap=0.0, reductions=reductions
    )


def _close(a: float, b: float, solution) -> bool:
    slack = 2 * solution.stats.get("rounding_error_s", 0.0) + 1e-9 * max(1.0, abs(b))
    return abs(a - b) <= slack


@settings(max_examples=80, deadline=None)
@given(problems(), st.booleans())
def test_objective_equals_brute_force(problem, reductions):
    solution = solve(problem, _options(reductions))
    best, _ = brute_force(problem)
    if math.isinf(best):
        assert solution.status == "infeasible"
        assert solution.choices == []
        return
    assert solution.status == "optimal"
    assert is_feasible(problem, solution.choices)
    assert solution.objective == evaluate(problem, solution.choices)[0]
    assert _close(solution.objective, best, solution)
    assert solution.bound == solution.objective and solution.gap == 0.0


@settings(max_examples=40, deadline=None)
@given(problems(), st.integers(1, 30))
def test_loosening_the_budget_never_raises_the_cost(problem, extra):
    if problem.budget_bytes is None:
        problem.budget_bytes = 0.0
    tight = solve(problem, _options())
    problem.budget_bytes += extra
    loose = solve(problem, _options())
    if tight.ok:
        assert loose.ok
        assert loose.objective <= tight.objective + 2 * loose.stats.get("rounding_error_s", 0.0) + 1e-9
    elif loose.status == "infeasible":
        assert tight.status == "infeasible"


@settings(max_examples=40, deadline=None)
@given(problems(), st.data())
def test_adding_a_constant_to_a_node_adds_it_to_the_objective(problem, data):
    node = data.draw(st.integers(0, problem.num_nodes - 1))
    constant = data.draw(st.sampled_from([0.5, 3.0, 17.0]))
    before = solve(problem, _options())
    problem.node_costs[node] = problem.node_costs[node] + constant
    after = solve(problem, _options())
    assert after.status == before.status
    if before.ok:
        slack = 2 * (before.stats.get("rounding_error_s", 0.0) + after.stats.get("rounding_error_s", 0.0))
        assert after.objective == pytest.approx(before.objective + constant, abs=slack + 1e-9)


@settings(max_examples=30, deadline=None)
@given(problems(max_nodes=6))
def test_budget_below_the_smallest_peak_is_infeasible(problem):
    if not problem.memory_rows:
        problem.memory_rows = [MemoryRow("peak", 1.0, {0: np.arange(problem.num_choices[0]) + 1.0})]
    peak = min_peak(problem)
    if math.isinf(peak):
        return
    problem.budget_bytes = max(peak - 1.0, 0.0) if peak >= 1.0 else None
    if problem.budget_bytes is None or peak - 1.0 < 0:
        return
    assert solve(problem, _options()).status == "infeasible"
    problem.budget_bytes = peak
    assert solve(problem, _options()).ok


def test_phases_are_reported_in_order():
    problem = synthetic_problem(60, 8, seed=1, shape="ladder", budget_fraction=0.5)
    seen = []
    solution = solve(problem, _options(), progress=seen.append)
    assert solution.ok
    order = [p.phase for p in seen]
    assert order[0] == "reduce" and order[-1] == "done"
    positions = [PHASES.index(phase) for phase in order]
    assert positions == sorted(positions)
    assert seen[-1].objective == solution.objective
    elapsed = [p.elapsed_s for p in seen]
    assert elapsed == sorted(elapsed)


def test_stats_report_sizes_and_phase_times():
    problem = synthetic_problem(60, 8, seed=2, shape="ladder", budget_fraction=0.5)
    solution = solve(problem, _options())
    stats = solution.stats
    assert stats["sizes"]["before"]["nodes"] == 60
    assert stats["sizes"]["after"]["nodes"] <= 60
    assert stats["reductions"]["after"] == stats["sizes"]["after"]
    assert {"reduce", "heuristic", "build", "solve", "expand"} <= set(stats["phases_s"])
    assert stats["cpsat"]["variables"] > 0 and stats["cpsat"]["constraints"] > 0
    assert len(stats["memory_bytes"]) == len(problem.memory_rows)


def test_fully_reduced_problem_needs_no_cpsat():
    rng = np.random.default_rng(0)
    problem = Problem(
        [f"op{i}" for i in range(30)],
        [rng.uniform(0, 1, 5) for _ in range(30)],
        [(i, i + 1, rng.uniform(0, 1, (5, 5))) for i in range(29)],
        [],
        None,
    )
    solution = solve(problem, _options())
    assert solution.stats["cpsat"] is None
    assert solution.status == "optimal" and solution.gap == 0.0
    assert solution.objective == pytest.approx(solve(problem, _options(reductions=False)).objective, rel=1e-9)


def test_hint_is_used_when_valid_and_ignored_otherwise():
    problem = synthetic_problem(40, 6, seed=3, shape="ladder", budget_fraction=None)
    first = solve(problem, _options())
    again = solve(problem, _options(), hint=first.choices)
    assert again.objective <= first.objective + 1e-12
    assert again.stats["hint"] in ("used", "not better than the heuristic")
    bad = solve(problem, _options(), hint=[0])
    assert bad.stats["hint"].startswith("ignored: 1 choices for 40 nodes")
    out_of_range = solve(problem, _options(), hint=[99] * 40)
    assert "out of range" in out_of_range.stats["hint"]


def test_a_wrong_reduction_is_caught_by_verification(monkeypatch):
    problem = synthetic_problem(30, 5, seed=4, shape="ladder", budget_fraction=None)

    def broken(p, enabled=None, deadline=None):
        reduction = reduce_problem(p, enabled, deadline=deadline)
        reduction.offset += 1.0  # claims one second that the plan does not cost
        return reduction

    monkeypatch.setattr(solve_module, "reduce_problem", broken)
    with pytest.raises(VerificationError, match="reduction is not exact") as info:
        solve(problem, _options())
    assert info.value.code == "verification_failed"


@pytest.mark.slow
def test_scale_5000_nodes_30_choices_within_time_limit():
    problem = synthetic_problem(5000, 30, seed=7, shape="chain", budget_fraction=0.5)
    limit = 30.0
    solution = solve(problem, SolverOptions(time_limit_s=limit, workers=2))
    assert solution.ok
    # the wall-time promise is measured by `python -m benchmarks.solver --promise`, not asserted here
    assert is_feasible(problem, solution.choices)
    assert solution.objective <= solution.stats["heuristic"]["cost"] + 1e-12
    assert math.isfinite(solution.bound) and solution.bound <= solution.objective


@settings(max_examples=30, deadline=None)
@given(problems(memory=False))
def test_sweeps_in_a_second_thread_give_a_true_bound_and_a_verified_plan(problem):
    # not deterministic and no memory row: the dual sweeps in a thread of its own while
    # the solving thread decodes (dual.Dual._advance_in_parallel)
    _check_threaded_solve(problem)


@settings(max_examples=30, deadline=None)
@given(problems(memory=True))
def test_a_priced_run_sweeping_in_a_thread_gives_a_true_bound_and_a_verified_plan(problem):
    # memory rows: the heuristic's prices start a priced run that sweeps in a thread of its
    # own; decodes send it new prices, which it applies between chunks
    _check_threaded_solve(problem)


def _check_threaded_solve(problem):
    """Solved off the deterministic path (threads): a true bound and a verified plan."""
    options = SolverOptions(time_limit_s=2, workers=1, relative_gap=0.0, max_model_vars=0)
    solution = solve(problem, options)
    best, _ = brute_force(problem)
    if math.isinf(best):
        assert solution.status == "infeasible" or not solution.ok
        return
    assert solution.ok and is_feasible(problem, solution.choices)
    assert solution.objective == evaluate(problem, solution.choices)[0]
    assert solution.bound <= best + 1e-9 * max(1.0, abs(best))
    assert solution.objective >= best - 1e-9 * max(1.0, abs(best))


def test_a_sweeping_thread_applies_new_prices_between_chunks_and_at_stop():
    problem = synthetic_problem(60, 6, seed=5)
    run = DiffusionBound(problem, np.zeros(len(problem.memory_rows)))
    sweeper = dual_module.Sweeper(run, time.perf_counter() + 30, threading.Event())
    price = np.full(len(problem.memory_rows), 1e-12)
    sweeper.reprice(price)
    sweeper.stop()
    assert np.array_equal(run.price, price)
    # the bound it keeps is a true one for the priced problem: at most any plan's Lagrangian
    plan = solve(problem, SolverOptions(time_limit_s=2, workers=1)).choices
    cost, memory = evaluate(problem, plan)
    assert run.value <= cost + float(price @ (np.array(memory) - problem.budget_bytes)) + 1e-12


def test_a_memory_round_gets_a_priced_run_when_the_heuristic_needed_no_prices():
    # a round with a memory row whose heuristic plan fits from the start (no Lagrangian
    # prices to hand on) still sweeps a priced run, from the starting prices; its bound
    # is at most any fitting plan's time (the priced term is <= 0 for a plan that fits)
    problem = synthetic_problem(60, 6, seed=5)
    options = SolverOptions(time_limit_s=5, workers=1)
    fits = solve(problem, SolverOptions(time_limit_s=2, workers=1)).choices
    cost, memory = evaluate(problem, fits)
    assert memory_fits(problem.budget_bytes, memory)
    dual = dual_module.Dual(problem, options)
    dual.use_heuristic(HeuristicResult(fits, cost, memory, True), time.perf_counter() + 5)
    assert len(dual.runs) == 2
    priced = dual.runs[1]
    assert np.array_equal(priced.price, dual_module.starting_prices(problem))
    assert (priced.price > 0).all() and np.isfinite(priced.price).all()
    priced.run(20)
    assert priced.value <= cost + 1e-12


def test_the_parallel_dual_sweeps_and_decodes_on_a_big_problem():
    problem = synthetic_problem(400, 12, seed=3)
    options = SolverOptions(time_limit_s=4, workers=1, relative_gap=0.0, max_model_vars=0, reductions=False)
    solution = solve(problem, options)
    dual = solution.stats["dual"]
    assert dual["sweeps"][0] > 0 and dual["decodes"] > 0
    # memory binds: a priced run sweeps too (in its own thread), past the first one's sweeps
    assert len(dual["sweeps"]) == 2 and dual["sweeps"][1] > 0
    assert solution.bound <= solution.objective
    assert solution.objective == evaluate(problem, solution.choices)[0]
