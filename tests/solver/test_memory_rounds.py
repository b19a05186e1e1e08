"""Memory rounds keep time for the rounds after them (:mod:`autopar_solver.planner.rounds`).

tiny-gpt on ``[4]`` at 90 % of the memory of its fastest plan: the memory floors are about
a third of the budget, so they do not say that memory binds, yet the fastest plan (the first
round's, without memory rows) is over the budget.  Once it has overflowed, memory binds: a
round not known to be the last must leave time for the next one.
"""

from dataclasses import replace

import pytest

from autopar.cost.build_tables import build_cost_tables
from autopar.cost.evaluate import evaluate
from autopar.cost.weighted_tables import with_training
from autopar.hardware.cluster import PRESETS, Cluster
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline
from autopar.models import build
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest, plan, solve_on_mesh
from autopar_solver.planner.context import MAX_MEMORY_ROUNDS
from autopar_solver.planner.floors import memory_seed
from autopar_solver.planner.rounds import ROUND_SHARE

CLUSTER = Cluster(1, 4, replace(PRESETS["a100-40g"], compute_units=0))
"""As test_planner's: a100-40g without the SM-fill term of :func:`autopar.hardware.kernels.gemm_time`
(tiny-gpt's GEMMs leave most SMs idle; with the term its [2, 2] solve keeps a gap)."""
RUNTIME = "oneflow-0.9-shard-min-1"
SHAPE = (4,)
"""[4]: its first round proves its optimum in about a second ([2, 2] took 20-40 s)."""
LIMIT_S = 120
"""Generous for a loaded 2-core CI: idle, the plan comes in about 20 s (its second round,
given 59 s, stopped at 19 s)."""


@pytest.fixture(scope="module")
def graph():
    return build("tiny-gpt")


@pytest.fixture(scope="module")
def fastest(graph):
    """The plan without a budget (proven optimal in seconds: deterministic, its own limit)."""
    options = SolverOptions(runtime=RUNTIME, time_limit_s=20, deterministic=True, workers=2)
    return plan(PlanRequest(graph, CLUSTER, SHAPE, None, 2, options))


@pytest.fixture(scope="module")
def solved(graph, fastest):
    """The plan at 90 % of the fastest plan's memory, with a limit generous for a loaded
    2-core CI (the solves stop at their gap), and the budget."""
    mesh = Mesh(CLUSTER, SHAPE)
    budget = int(0.9 * fastest.memory_per_device_bytes)
    options = SolverOptions(runtime=RUNTIME, time_limit_s=LIMIT_S, workers=2)
    tables = with_training(build_cost_tables(graph, mesh, 2, runtime=RUNTIME), options.training)
    seed = memory_seed(tables, budget, mesh, Deadline(600))
    # the floors say memory does not bind: no row from the first round, no shared time
    assert not seed.binds and not seed.positions
    return solve_on_mesh(graph, mesh, budget, 2, options, tables=tables), budget


def test_a_plan_is_verified_when_the_first_rounds_plan_breaks_memory(graph, solved) -> None:
    p, budget = solved
    rounds = p.solver["stats"]["rounds"]
    assert rounds[0]["memory_rows"] == 0 and rounds[0]["fits"] is False
    assert len(rounds) >= 2 and p.solver["memory_rows"] >= 1
    ev = evaluate(graph, p)
    assert ev.valid and ev.memory.total <= budget
    assert p.solver["objective"] == pytest.approx(ev.per_edge_iteration_time_s, rel=1e-6)


def test_after_an_overflow_a_round_keeps_time_for_the_next(solved) -> None:
    """Every round after the first overflow that is not known to be the last (no polish,
    not the last memory round) was given at most :data:`ROUND_SHARE` of the time left;
    a polish, the last round, was given all of it (it runs to the gap or the limit)."""
    p, _ = solved
    rounds = p.solver["stats"]["rounds"]
    assert rounds[1]["limit_s"] <= ROUND_SHARE * rounds[1]["left_s"] + 1e-9
    for round_no, r in enumerate(rounds[1:], start=1):
        if r["polish"] or round_no >= MAX_MEMORY_ROUNDS - 1:
            assert r["limit_s"] == pytest.approx(min(LIMIT_S, r["left_s"]))
        else:
            assert r["limit_s"] <= ROUND_SHARE * r["left_s"] + 1e-9
