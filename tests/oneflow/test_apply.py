"""A solver plan applied to tiny MT5 on 4 CPU ranks as [2, 2]: compiled as planned, same losses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autopar.bridges.oneflow.planning import autopar_python
from autopar.ir.plan import Plan

pytestmark = pytest.mark.oneflow


@pytest.fixture(scope="module")
def solver_python() -> str:
    try:
        python = autopar_python()
    except Exception as exc:
        pytest.skip(f"no main autopar environment for the solver: {exc}")
    probe = subprocess.run(
        [python, "-c", "import ortools, autopar_solver.planner"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip("the main environment has no solver (autopar[solver])")
    return python


def test_solver_plan_on_a_2x2_mesh_is_compiled_as_planned_and_trains_like_one_rank(
    tmp_path, solver_python, of_env, examples_dir
):
    command = [
        sys.executable,
        str(examples_dir / "train_with_plan.py"),
        "--model", "mt5-tiny",
        "--mesh", "2,2",
        "--planner", "solver",
        # a budget below the replicated plan's memory, so that the solver must shard
        "--memory-fraction", "0.6",
        "--time-limit", "15",
        "--steps", "3",
        "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**of_env, "AUTOPAR_PYTHON": solver_python}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    result = json.loads((tmp_path / "result.json").read_text())
    plan = Plan.load(str(tmp_path / "plan.json"))

    assert plan.source == "autopar" and plan.mesh.shape == (2, 2)
    # the budget (0.6x the replicated plan's memory) binds and the plan meets it; with model
    # states from the graph's dtypes the tiny job meets it by splitting activations, and a
    # budget tight enough to force sharded parameters runs out of time in the memory rounds
    # (issue 9), so sharding is not asserted here
    assert plan.memory["budget_bytes"] is not None and plan.memory["fits"], plan.memory
    # every parameter got its planned layout
    for name, sbp in result["parameters"].items():
        assert sbp == plan.variables[f"model.{name}"]["sbp"], name
    assert not result["unplanned_parameters"]

    fidelity = result["fidelity"]
    assert fidelity["ops_total"] == len(plan.signatures)
    assert fidelity["op_share"] >= 0.95, fidelity["mismatches"][:10]
    assert fidelity["boxing_share"] >= 0.9

    ranks4, rank1 = result["losses"], result["reference_losses"]
    assert len(ranks4) == len(rank1) == 3
    assert ranks4[-1] < ranks4[0]  # it trains
    for a, b in zip(ranks4, rank1):
        assert a == pytest.approx(b, rel=1e-4)
