"""The stage dimension of the search: a pipeline plan of every stage, re-checked, with an honest
bound, and --stages auto keeping the least iteration of the numbers of stages it tried."""

from __future__ import annotations

import dataclasses

import pytest

from autopar.hardware.cluster import Cluster
from autopar.infra.progress import Deadline
from autopar.ir.plan import Plan
from autopar.models import build
from autopar.pipeline.evaluate import evaluate_pipeline
from autopar.pipeline.plan import PipelinePlan
from autopar_solver.options import SolverOptions
from autopar_solver.planner import PlanRequest
from autopar_solver.planner.pipeline_search import solve_pipeline, stage_candidates
from autopar_solver.planner.stage_search import plan_stages


def _request(budget: int | None = None) -> PlanRequest:
    options = SolverOptions(time_limit_s=60, micro_batches=4, checkpointing="full", workers=2)
    return PlanRequest(build("tiny-gpt"), Cluster.parse("1x8"), None, budget, 2, options)


@pytest.fixture(scope="module")
def free_plan() -> PipelinePlan:
    """tiny-gpt in 2 stages of [2, 2], K = 4, no budget: solved once for the module."""
    return solve_pipeline(_request(), 2, Deadline(60), stage_mesh_shape=(2, 2))


def test_a_two_stage_plan_verifies_and_its_bound_is_below_it(free_plan: PipelinePlan) -> None:
    request = _request()
    assert stage_candidates(request) == [2]  # 2 blocks: at most 2 stages
    plan = free_plan
    ev = evaluate_pipeline(request.graph, plan)
    assert ev.errors == []
    assert plan.iteration_time_s == pytest.approx(ev.iteration_time_s)
    assert [list(p.mesh.shape) for p in plan.stages] == [[2, 2], [2, 2]]
    assert plan.solver is not None and 0 < plan.solver["bound"] <= plan.iteration_time_s
    # OneFlow 0.9 moves the tied word embedding to the head's stage twice and its gradient
    # back once every micro-batch (counted on the compiled job: tests/oneflow/test_pipeline_apply.py)
    owner, copy = ev.stages
    assert owner.tied_time_s > 0
    assert copy.tied_time_s == pytest.approx(2 * owner.tied_time_s)


def test_a_stage_over_the_budget_with_its_micro_batches_in_flight_is_planned_again(
    free_plan: PipelinePlan,
) -> None:
    """The intra-stage solve sees one micro-batch; the first stage keeps two in flight.  A budget
    just above the unconstrained first stage's one-micro-batch peak forces a memory round, and
    the result fits with its stash counted."""
    ev = evaluate_pipeline(build("tiny-gpt"), free_plan)
    first = ev.stages[0]
    budget = int(first.evaluation.memory.total + 0.5 * first.stash_bytes)
    assert first.memory_bytes > budget  # as planned freely, stage 0 would not fit
    tight = solve_pipeline(_request(budget), 2, Deadline(60), stage_mesh_shape=(2, 2))
    again = evaluate_pipeline(build("tiny-gpt"), tight)
    assert again.errors == []
    assert max(s.memory_bytes for s in again.stages) <= budget
    assert tight.solver is not None and tight.solver["memory_rounds"] >= 2


def test_stages_auto_keeps_the_least_iteration_it_found():
    request = dataclasses.replace(_request(), cluster=Cluster.parse("2x4"))
    chosen = plan_stages(request, None, Deadline(60))
    rows = chosen.diagnostics["stage_search"]
    assert [r["stages"] for r in rows] == [1, 2]
    found = [r["iteration_time_s"] for r in rows if "iteration_time_s" in r]
    assert chosen.iteration_time_s == pytest.approx(min(found))
    assert isinstance(chosen, PipelinePlan) == (rows[1].get("iteration_time_s") == min(found))


def test_stages_auto_on_one_node_is_one_stage():
    """A pipeline inside a node pays its bubble only to save memory, which recomputation and
    sharding also do: ``auto`` plans one stage there, searching nothing else."""
    chosen = plan_stages(_request(), None, Deadline(60))
    assert isinstance(chosen, Plan) and "stage_search" not in chosen.diagnostics


def test_a_bad_stage_count_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    from autopar.cli.main import main

    status = main(["plan", "tiny-gpt", "--stages", "two", "--out", "/dev/null"])
    assert status == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "autopar: error: [bad_stages] --stages must be a positive integer or auto, got 'two'"
    ]


def test_the_cut_that_shortens_the_slowest_stage():
    """t_s(c) = e_s + c b: b = 0.2 s per block (the middle stages), the first stage 0.1 s and
    the last 0.5 s besides their blocks; the slowest stage can be no faster than the last
    with one block (0.7 s), and the surplus leaves the slowest stages first."""
    from autopar_solver.planner.pipeline_search import rebalanced_counts

    counts, slowest = rebalanced_counts([0.5, 0.4, 0.4, 0.9], (2, 2, 2, 2))
    assert counts == (2, 2, 3, 1) and slowest == pytest.approx(0.7)
    assert rebalanced_counts([0.4, 0.4], (2, 2)) == ((2, 2), pytest.approx(0.4))  # nothing to move


def test_a_heavy_head_gets_fewer_blocks_beside_it():
    """A vocabulary of 32768 on a hidden size of 64 makes the head the slowest part of the last
    stage: the even cut (2, 2) is planned, then (3, 1), and the faster verified plan kept."""
    graph = build("tiny-gpt", layers=4, vocab=32768)
    options = SolverOptions(time_limit_s=120, micro_batches=8, checkpointing="full", workers=2)
    request = PlanRequest(graph, Cluster.parse("1x8"), None, None, 2, options)
    plan = solve_pipeline(request, 2, Deadline(120), stage_mesh_shape=(2, 2))
    assert plan.solver is not None
    cuts = plan.solver["cuts"]
    assert cuts[0]["block_counts"] == [2, 2]
    assert [c["block_counts"] for c in cuts[1:]] == [[3, 1]]
    assert plan.iteration_time_s == pytest.approx(min(c["iteration_time_s"] for c in cuts))
    assert evaluate_pipeline(graph, plan).errors == []
