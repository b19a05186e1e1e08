"""The time limit bounds the whole command: a plan returned at the deadline is verified and
its gap is a true upper bound on its sub-optimality; without a plan the error says how far
it got.  (No wall-clock assertions: the outcomes hold whatever the machine's speed.)"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost.build_tables import build_cost_tables
from autopar.cost.evaluate import evaluate
from autopar.errors import TimeLimitError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline, Progress
from autopar.infra.store import MemoryStore
from autopar.models import build
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest, plan, solve_on_mesh
from autopar_solver.problem import evaluate as evaluate_problem
from autopar_solver.problem import is_feasible
from autopar_solver.solve import solve
from tests.solver.helpers import brute_force, problems

CLUSTER = Cluster.parse("1x4", "a100-40g")


@settings(max_examples=40, deadline=None)
@given(
    problems(max_nodes=10),
    st.sampled_from([0.001, 0.01, 0.05]),
    # 100_000: one CP-SAT model; 0: the big-problem path (TRW-S bound, decoded plans, windows)
    st.sampled_from([100_000, 0]),
)
def test_plan_at_the_deadline_is_verified_and_its_gap_bounds_its_suboptimality(problem, limit, max_vars):
    options = SolverOptions(time_limit_s=limit, workers=1, relative_gap=0.0, max_model_vars=max_vars)
    solution = solve(problem, options)
    best, _ = brute_force(problem)
    if not solution.ok:
        return  # no plan at the deadline: nothing is claimed
    assert math.isfinite(best)
    assert is_feasible(problem, solution.choices)
    assert solution.objective == evaluate_problem(problem, solution.choices)[0]
    slack = 2 * solution.stats.get("rounding_error_s", 0.0) + 1e-9 * max(1.0, abs(best))
    assert solution.bound <= best + slack
    if solution.objective > 0:
        true_gap = (solution.objective - best) / solution.objective
        assert true_gap <= solution.gap + slack / solution.objective


@pytest.fixture(scope="module")
def graph():
    return build("tiny-gpt")


def test_no_time_after_loading_says_so(graph):
    request = PlanRequest(graph, CLUSTER, (2, 2), None, 2, SolverOptions(time_limit_s=1, workers=1))
    with pytest.raises(TimeLimitError) as e:
        plan(request, deadline=Deadline(1e-9))
    assert e.value.code == "time_limit" and e.value.details["phase"] == "load"


def test_no_time_for_the_cost_tables_says_how_far_they_got(graph):
    store = MemoryStore()
    with pytest.raises(TimeLimitError) as e:
        build_cost_tables(graph, Mesh(CLUSTER, (2, 2)), 2, store=store, workers=1, deadline=Deadline(1e-9))
    assert e.value.code == "time_limit"
    assert e.value.details["phase"].startswith("cost_tables")
    assert 0 < e.value.details["done"] < e.value.details["total"]
    assert "raise the time limit" in e.value.message
    assert len(store) == e.value.details["done"]  # what was computed is kept


def test_no_time_to_solve_is_an_error_not_an_unverified_plan(graph):
    store = MemoryStore()
    mesh = Mesh(CLUSTER, (2, 2))
    build_cost_tables(graph, mesh, 2, store=store, workers=1)
    options = SolverOptions(time_limit_s=1, workers=1)
    with pytest.raises(TimeLimitError) as e:
        solve_on_mesh(graph, mesh, None, 2, options, store=store, deadline=Deadline(1e-9))
    assert e.value.details["phase"] == "solve"


def test_no_time_for_the_memory_floors_says_so(graph):
    from autopar_solver.planner import memory_floors

    tables = build_cost_tables(graph, Mesh(CLUSTER, (2, 2)), 2, workers=1)
    assert len(memory_floors(tables, Deadline(60))) == len(graph.ops)
    with pytest.raises(TimeLimitError) as e:
        memory_floors(tables, Deadline(1e-9))
    assert e.value.details["phase"] == "memory_floors" and "raise the time limit" in e.value.message
    # and from the planner, with a budget (the floors are computed after the tables, in time)
    with pytest.raises(TimeLimitError) as e:
        solve_on_mesh(
            graph,
            Mesh(CLUSTER, (2, 2)),
            40 * 2**30,
            2,
            SolverOptions(time_limit_s=1),
            tables=tables,
            deadline=Deadline(1e-9),
        )
    assert e.value.details["phase"] == "memory_floors"


def test_plan_is_verified_with_an_honest_gap_and_one_done(graph):
    store = MemoryStore()
    build_cost_tables(graph, Mesh(CLUSTER, (2, 2)), 2, store=store, workers=1)
    reports: list[Progress] = []
    p = plan(
        PlanRequest(graph, CLUSTER, (2, 2), None, 2, SolverOptions(time_limit_s=60, workers=1)),
        store=store,
        progress=reports.append,
    )
    ev = evaluate(graph, p)
    assert ev.valid
    assert p.solver["objective"] == pytest.approx(ev.per_edge_iteration_time_s, rel=1e-6)
    assert p.solver["bound"] <= p.solver["objective"]
    assert p.solver["gap"] == pytest.approx(
        (p.solver["objective"] - p.solver["bound"]) / p.solver["objective"]
    )
    phases = [r.phase for r in reports]
    assert phases.count("done") == 1 and phases[-1] == "done"
    assert reports[-1].objective == p.solver["objective"]
    elapsed = [r.elapsed_s for r in reports]
    assert elapsed == sorted(elapsed)


def test_mesh_search_reports_carry_their_shape_and_one_done(graph):
    reports: list[Progress] = []
    p = plan(
        PlanRequest(graph, CLUSTER, None, None, 2, SolverOptions(time_limit_s=20, workers=1)),
        progress=reports.append,
    )
    shapes = {r.shape for r in reports if r.phase.startswith("cost_tables")}
    assert shapes == {(4,), (2, 2)}
    assert [r.phase for r in reports].count("done") == 1
    assert reports[-1].objective == p.solver["objective"]
    assert reports[-1].shape == tuple(p.mesh.shape)
    elapsed = [r.elapsed_s for r in reports]
    assert elapsed == sorted(elapsed)
