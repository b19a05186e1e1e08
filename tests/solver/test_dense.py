"""Dense problems (three-axis meshes): edge matrices in single precision with a proven
bound, a TRW-S layout cut at its deadline, and the reductions skipped."""

import math
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar_solver.dual as dual_module
import autopar_solver.solve as solve_module
from autopar_solver.bounds import DiffusionBound, LayoutCut, single_precision_allowed
from autopar_solver.options import SolverOptions
from autopar_solver.problem import MemoryRow, Problem, evaluate
from autopar_solver.reductions import unreduced
from tests.solver.helpers import brute_force, problems


def _rounding_up(problem: Problem) -> Problem:
    """``problem`` with every finite cost c replaced by ``c / 10 + 1 / 3``: values float32
    cannot hold, most of them rounded up (the case the bound's correction is for)."""

    def odd(a: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(a), a / 10 + 1 / 3, a)

    return replace(
        problem,
        node_costs=[odd(c) for c in problem.node_costs],
        edges=[(u, v, odd(m)) for u, v, m in problem.edges],
    )


@settings(max_examples=60, deadline=None)
@given(problems(), st.lists(st.floats(0, 3), min_size=3, max_size=3), st.integers(1, 40))
def test_single_precision_bound_never_exceeds_the_optimum(problem, prices, sweeps):
    problem = _rounding_up(problem)
    best, _ = brute_force(problem)
    price = np.array(prices[: len(problem.memory_rows)])
    for p in (None, price):
        run = DiffusionBound(problem, p, single=True)
        assert run.single
        bound = run.run(sweeps)
        if math.isfinite(best):
            assert bound <= best


def test_single_precision_bound_is_tight_on_a_chain_where_every_entry_rounds_up():
    rng = np.random.default_rng(0)
    up = np.float64(0.1)  # float32(0.1) > 0.1
    assert np.float64(np.float32(up)) > up
    problem = Problem(
        [f"op{i}" for i in range(6)],
        [np.full(4, up) + rng.integers(0, 3, 4) * up for _ in range(6)],
        [(i, i + 1, np.full((4, 4), up) + rng.integers(0, 3, (4, 4)) * up) for i in range(5)],
        [],
        None,
    )
    best, _ = brute_force(problem)
    single = DiffusionBound(problem, single=True).run(500)
    double = DiffusionBound(problem, single=False).run(500)
    assert double == pytest.approx(best, rel=1e-12)
    assert single <= best
    assert single == pytest.approx(best, rel=1e-6)


def test_single_precision_needs_costs_that_are_not_negative():
    problem = Problem(["a", "b"], [np.array([-1.0, 0.0]), np.zeros(2)], [(0, 1, np.ones((2, 2)))], [], None)
    assert not single_precision_allowed(problem)
    with pytest.raises(ValueError, match="single precision"):
        DiffusionBound(problem, single=True)
    # a negative edge entry is only seen once laid out: the run falls back to float64
    negative_edge = Problem(
        ["a", "b"], [np.zeros(2), np.zeros(2)], [(0, 1, np.array([[-1.0, 0.1], [0.1, 0.2]]))], [], None
    )
    run = DiffusionBound(negative_edge, single=True)
    assert not run.single
    assert run.run(50) == pytest.approx(-1.0)
    rows = [MemoryRow("r", 0.0, {}, {0: np.ones((2, 2))})]
    with_edge_terms = Problem(["a", "b"], [np.zeros(2), np.zeros(2)], [(0, 1, np.ones((2, 2)))], rows, 1.0)
    assert not single_precision_allowed(with_edge_terms)


def test_a_layout_past_its_deadline_is_cut():
    problem = Problem(["a", "b"], [np.zeros(2), np.zeros(2)], [(0, 1, np.ones((2, 2)))], [], None)
    with pytest.raises(LayoutCut):
        DiffusionBound(problem, deadline=time.perf_counter() - 1.0)


@settings(max_examples=40, deadline=None)
@given(problems())
def test_unreduced_maps_choices_back_unchanged(problem):
    if any(u == v for u, v, _ in problem.edges):
        with pytest.raises(ValueError, match="self-loop"):
            unreduced(problem, "test")
        return
    reduction = unreduced(problem, "test")
    assert reduction.reduced is problem
    choices = [len(c) - 1 for c in problem.node_costs]
    assert reduction.expand(choices) == choices
    assert reduction.restrict(choices) == choices
    assert reduction.stats["skipped"] == "test"


@settings(max_examples=15, deadline=None)
@given(problem=problems(max_nodes=6, max_choices=4))
def test_a_dense_problem_is_solved_unreduced_to_the_optimum(problem, monkeypatch_dense):
    if any(u == v for u, v, _ in problem.edges) or not problem.edges:
        return
    best, _ = brute_force(problem)
    sol = solve_module.solve(problem, SolverOptions(time_limit_s=30, workers=1))
    assert "skipped" in sol.stats["reductions"]
    assert sol.stats["dual"].get("single_precision", True)
    if math.isfinite(best):
        assert sol.status == "optimal"
        assert sol.objective == pytest.approx(best)
        assert evaluate(problem, sol.choices)[0] == pytest.approx(sol.objective)
    else:
        assert sol.status == "infeasible" or not math.isfinite(sol.objective)


@pytest.fixture(scope="module")
def monkeypatch_dense():
    """Every problem with an edge counts as dense (the reductions are skipped) and keeps its
    matrices in single precision when allowed: the path of three-axis meshes, on problems
    small enough to check against brute force."""
    patch = pytest.MonkeyPatch()
    patch.setattr(dual_module, "_DENSE_ENTRIES", 0)
    patch.setattr(dual_module, "_DENSE_ENTRIES_PER_EDGE", 0)
    patch.setattr("autopar_solver.bounds.SINGLE_ENTRIES", 0)
    patch.setattr("autopar_solver.bounds.SINGLE_ENTRIES_PER_EDGE", 0)
    yield
    patch.undo()
