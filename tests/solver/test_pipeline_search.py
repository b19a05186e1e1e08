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


def test_a_heavy_head_gets_fewer_blocks_beside_it():
    """A vocabulary of 32768 on a hidden size of 64 makes the head the slowest part of the last
    stage: the even cut (2, 2) is planned, then (3, 1), the cut the dynamic program predicts
    from the even cut's per-block costs, and the faster verified plan kept."""
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


def _searched(
    graph_overrides: dict[str, int], runtime: str, stages: int, shape: tuple[int, ...]
) -> PipelinePlan:
    graph = build("tiny-gpt", **graph_overrides)
    options = SolverOptions(
        time_limit_s=120, micro_batches=8, checkpointing="full", workers=2, runtime=runtime
    )
    request = PlanRequest(graph, Cluster.parse("1x8"), None, None, 2, options)
    return solve_pipeline(request, stages, Deadline(120), stage_mesh_shape=shape)


def _balanced_row(plan: PipelinePlan, v: int = 1) -> dict:
    rows = plan.diagnostics["pipeline_search"]
    return next(r for r in rows if r["source"] == "balanced" and r["virtual_stages"] == v)


def test_an_uneven_head_is_cut_no_worse_than_the_balanced_cut():
    """8 blocks and a head of vocabulary 32768: the dynamic program, on the balanced cut's
    per-block costs, moves blocks off the head's stage; the cut it predicts is planned, and the
    plan returned is no slower than the balanced one as evaluate_pipeline re-checks it."""
    overrides = {"layers": 8, "vocab": 32768}
    plan = _searched(overrides, "oneflow-0.9", 2, (2, 2))
    graph = build("tiny-gpt", **overrides)
    ev = evaluate_pipeline(graph, plan)
    assert ev.errors == [] and ev.iteration_time_s == pytest.approx(plan.iteration_time_s)
    balanced = _balanced_row(plan)
    assert balanced["block_counts"] == [4, 4]
    assert plan.iteration_time_s <= balanced["iteration_time_s"]
    assert plan.counts[-1] < 4  # fewer blocks beside the head
    rows = plan.diagnostics["pipeline_search"]
    predicted = [r for r in rows if r["source"] == "predicted"]
    assert [r["outcome"] for r in predicted] == ["planned"]
    assert predicted[0]["predicted_iteration_s"] < balanced["iteration_time_s"]
    assert {r["virtual_stages"] for r in rows} == {1}  # OneFlow 0.9 runs 1F1B only
    assert [r["outcome"] for r in rows].count("chosen") == 1


BUBBLE_BOUND = {"layers": 8, "hidden": 1024, "ffn": 4096}
"""Wide blocks, cheap sends inside a node: with 4 stages and K = 8 the 1F1B bubble (3 of 11
slots) costs more than interleaving's extra sends."""


def test_megatron_lm_interleaves_when_the_bubble_dominates():
    plan = _searched(BUBBLE_BOUND, "megatron-lm", 4, (2,))
    assert plan.virtual_stages > 1 and plan.counts == (2, 2, 2, 2)
    assert plan.iteration_time_s < _balanced_row(plan, 1)["iteration_time_s"]
    again = PipelinePlan.from_json(plan.to_json())
    assert again.virtual_stages == plan.virtual_stages
    ev = evaluate_pipeline(build("tiny-gpt", **BUBBLE_BOUND), again)  # the re-check, interleaved
    assert ev.errors == [] and ev.iteration_time_s == pytest.approx(plan.iteration_time_s)
    assert plan.solver is not None and plan.solver["virtual_stages"] == plan.virtual_stages
    assert 0 < plan.solver["bound"] <= plan.iteration_time_s


def test_oneflow_never_interleaves():
    plan = _searched(BUBBLE_BOUND, "oneflow-0.9", 4, (2,))
    assert plan.virtual_stages == 1
    assert {r["virtual_stages"] for r in plan.diagnostics["pipeline_search"]} == {1}
    assert "virtual_stages" not in plan.to_dict()
