"""Megatron-LM's layout as the memory rounds' first plan (solver/planner/hand_layout.py): a mesh's
plan is never slower, as its runtime runs it, than that layout on the same mesh, and the
summary says when the layout itself is returned."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import pytest

from autopar.baselines.plans import baseline_plan
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.training import TrainingConfig
from autopar.models import build
from autopar.rules.registry import default_rules
from autopar_solver.options import SolverOptions
from autopar_solver.planner import solve_on_mesh
from autopar_solver.planner.hand_layout import HAND_LAYOUT_SOURCE, faster_as_run
from autopar_solver.planner.rounds import Rounds
from autopar_solver.problem import Solution

K = 4


def _megatron_as_run(graph: Any, mesh: Mesh, zero: int) -> float:
    """Megatron-LM's layout on ``mesh`` (tp = the last axis, sequence parallel), every block
    keeping its activations, as the megatron-lm runtime runs it: seconds per iteration."""
    hand = baseline_plan(
        "megatron", graph, mesh, zero, rules=default_rules(), runtime="megatron-lm", sequence_parallel=True
    )
    return evaluate(
        graph, dataclasses.replace(hand, training=TrainingConfig(K, "off"))
    ).achieved_iteration_time_s


@pytest.mark.parametrize("zero", [1, 3])
def test_a_mesh_plan_is_never_slower_as_run_than_megatron_layout_on_it(zero: int) -> None:
    graph = build("tiny-gpt")
    mesh = Mesh(Cluster.parse("1x4", "a100-40g"), (2, 2))
    options = SolverOptions(
        time_limit_s=60, deterministic=True, workers=2, micro_batches=K, runtime="megatron-lm"
    )
    plan = solve_on_mesh(graph, mesh, None, zero, options)  # verified against its objective inside
    assert plan.solver is not None
    hand = plan.solver["stats"]["hand_layout"]
    assert hand["mesh"] == [2, 2] and hand["ops_from_cheapest"] == 0 and hand["fits"]
    assert math.isfinite(hand["objective_s"])
    reference = _megatron_as_run(graph, mesh, zero)
    assert hand["achieved_iteration_time_s"] == pytest.approx(reference, rel=1e-9)
    assert plan.achieved_iteration_time_s <= reference * (1 + 1e-9)
    if hand["returned"]:  # the layout itself: the summary says so, and what the search found
        assert plan.solver["stats"]["source"] == HAND_LAYOUT_SOURCE
        assert hand["searched_achieved_iteration_time_s"] > plan.achieved_iteration_time_s
        assert "Megatron-LM's on this mesh" in plan.summary()


def _verified(achieved_s: float, objective_s: float, bound_s: float) -> Any:
    plan = SimpleNamespace(name=f"plan at {achieved_s}")
    ev = SimpleNamespace(achieved_iteration_time_s=achieved_s)
    return plan, ev, Solution([0], objective_s, bound_s, 0.0, "feasible", 1.0, {"source": "cpsat"})


def test_the_hand_layout_is_returned_only_when_it_is_faster_as_run() -> None:
    searched = _verified(2.0, 3.0, 2.9)
    state = Rounds(positions=[], hint=None, reserve=0.0, best_bound=2.9)
    state.hand_layout = {"mesh": [4, 2]}
    hand_plan, hand_ev, _ = _verified(1.8, 4.0, -math.inf)
    state.hand_verified = (hand_plan, hand_ev, Solution([1], 4.0, -math.inf, 1.0, "feasible", 0.0, {}))
    plan, ev, solution = faster_as_run(state, searched)
    assert plan is hand_plan and ev is hand_ev
    # its own objective (what the evaluator checks it against), the rounds' bound
    assert solution.objective == 4.0 and solution.bound == 2.9
    assert solution.gap == pytest.approx((4.0 - 2.9) / 4.0)
    assert solution.stats["searched"]["achieved_iteration_time_s"] == 2.0
    assert state.hand_layout["returned"] is True

    state.hand_verified = (hand_plan, SimpleNamespace(achieved_iteration_time_s=2.5), state.hand_verified[2])
    assert faster_as_run(state, searched) is searched
    assert state.hand_layout["returned"] is False


def test_without_a_hand_layout_that_fits_the_search_stands() -> None:
    searched = _verified(2.0, 3.0, 2.9)
    state = Rounds(positions=[], hint=None, reserve=0.0)
    assert faster_as_run(state, searched) is searched


def test_only_plans_priced_as_megatron_lm_runs_them_try_it() -> None:
    graph = build("tiny-gpt")
    mesh = Mesh(Cluster.parse("1x4", "a100-40g"), (2, 2))
    options = SolverOptions(
        time_limit_s=30, deterministic=True, workers=2, micro_batches=K, runtime="oneflow-0.9"
    )
    plan = solve_on_mesh(graph, mesh, None, 1, options)
    assert plan.solver is not None and "hand_layout" not in plan.solver["stats"]
