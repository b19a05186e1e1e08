"""``--zero auto`` (solver/planner/zero_search.py): each ZeRO stage solved in turn with a share
of the time left, the fastest as the runtime runs it kept, the gap over every stage tried."""

from __future__ import annotations

import math

import pytest

from autopar.baselines.plans import baseline_plan
from autopar.errors import TimeLimitError
from autopar.hardware.cluster import PRESETS, Cluster
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline
from autopar.ir.plan import Plan
from autopar_solver.planner.zero_search import ZERO_AUTO, plan_zero_stages, zero_search_text
from tests.graphs import mlp_graph


def _plan(zero: int, iteration_s: float, achieved_s: float, bound_s: float | None) -> Plan:
    plan = baseline_plan("data-parallel", mlp_graph(), Mesh(Cluster(1, 2, PRESETS["a100-40g"]), (2,)), zero)
    plan.predicted["iteration_time_s"] = iteration_s
    plan.predicted["achieved_iteration_time_s"] = achieved_s
    plan.solver = {"status": "feasible", "bound": bound_s, "gap": 0.0}
    return plan


def test_the_fastest_as_run_is_kept_and_the_gap_covers_every_stage() -> None:
    plans = {1: _plan(1, 10.0, 9.0, 8.0), 3: _plan(3, 10.5, 8.5, 7.0)}
    shares: list[float] = []

    def solve(zero: int, within: Deadline) -> Plan:
        shares.append(within.limit_s)
        return plans[zero]

    best = plan_zero_stages(ZERO_AUTO, solve, Deadline(100.0))
    assert best is plans[3]  # slower as modelled, faster as the runtime runs it (hidden gathers)
    # the first gets half the time left, the last all that is left (whatever the machine's load
    # took between the two calls)
    assert shares[0] <= 50.0 < shares[1] <= 100.0
    rows = best.diagnostics["zero_search"]
    assert [(r["zero_stage"], r["chosen"]) for r in rows] == [(1, False), (3, True)]
    assert best.solver is not None
    assert best.solver["zero_search_bound"] == 7.0  # the least bound of the two problems
    assert best.solver["zero_search_gap"] == pytest.approx((10.5 - 7.0) / 10.5)
    text = zero_search_text(rows)
    assert "ZeRO-3 (chosen): iteration 10500.00 ms (8500.00 ms as the runtime runs it)" in text
    assert "ZeRO-1: iteration 10000.00 ms" in text and "bound 8000.00 ms" in text


def test_a_stage_without_a_plan_is_a_row_and_leaves_the_gap_unproven() -> None:
    def solve(zero: int, within: Deadline) -> Plan:
        if zero == 1:
            raise TimeLimitError("time_limit", "no verified plan within 5.0 s")
        return _plan(3, 2.0, 2.0, 1.5)

    best = plan_zero_stages(ZERO_AUTO, solve, Deadline(10.0))
    rows = best.diagnostics["zero_search"]
    assert rows[0]["outcome"] == "no plan" and "[time_limit]" in rows[0]["error"]
    assert best.solver is not None and "zero_search_gap" not in best.solver
    assert "ZeRO-1: no plan: [time_limit] no verified plan" in zero_search_text(rows)


def test_no_plan_at_any_stage_raises_the_last_error() -> None:
    def solve(zero: int, within: Deadline) -> Plan:
        raise TimeLimitError("time_limit", f"nothing at ZeRO-{zero}")

    with pytest.raises(TimeLimitError, match="ZeRO-3"):
        plan_zero_stages(ZERO_AUTO, solve, Deadline(math.inf))
