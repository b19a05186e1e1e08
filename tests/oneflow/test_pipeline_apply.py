"""A pipeline plan applied to tiny GPT on 8 CPU ranks as 2 stages x [2, 2] (issue 36 item 5):
compiled with ``nn.Graph``'s stages, trained 3 steps with the plan's K = 4 micro-batches and
full checkpointing, the same losses as one rank; the bytes the compiled job moves across
the stage boundary against autopar's :func:`autopar.pipeline.evaluate.boundary_bytes_per_device`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import launch, skip_without_solver

pytestmark = pytest.mark.oneflow

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory: pytest.TempPathFactory, flow: object) -> Path:
    python = skip_without_solver()
    out = tmp_path_factory.mktemp("pipeline")
    done = subprocess.run(
        [python, str(HERE / "_pipeline_plan.py"), str(out), "4"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    plan = str(out / "plan.json")
    launch(8, HERE / "_pipeline_apply.py", plan, str(out), "pipeline", timeout=900)
    launch(1, HERE / "_pipeline_apply.py", plan, str(out), "reference", timeout=600)
    return out


def test_two_stages_train_like_one_rank(pipeline_run: Path) -> None:
    from autopar.pipeline.plan import PipelinePlan

    plan = PipelinePlan.from_dict(json.loads((pipeline_run / "plan.json").read_text()))
    assert plan.counts == (1, 1) and [p.mesh.shape for p in plan.stages] == [(2, 2), (2, 2)]
    staged = json.loads((pipeline_run / "pipeline.json").read_text())
    one = json.loads((pipeline_run / "reference.json").read_text())
    applied = staged["applied"]
    assert applied["ranks"] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert applied["modules"] == {"h.0": 0, "wte": 0, "wpe": 0, "h.1": 1, "ln_f": 1}
    assert not applied["unplanned"] and not applied["notes"]
    assert applied["micro_batches"] == 4 and applied["checkpointing"] == ["h.0", "h.1"]
    for name, got in applied["parameters"].items():
        stage = plan.stages[got["stage"]]
        assert all(got["sbp"] == stage.variables[v]["sbp"] for v in got["variables"]), name
    print("losses, 8 ranks (2 stages x [2, 2]):", staged["losses"])
    print("losses, 1 rank:                    ", one["losses"])
    assert len(staged["losses"]) == len(one["losses"]) == 3
    assert staged["losses"][-1] < staged["losses"][0]  # it trains
    for a, b in zip(staged["losses"], one["losses"]):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-6)
    for a, b in zip(staged["per_micro_batch"], one["per_micro_batch"]):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-6)  # each micro-batch met its own labels


def test_boundary_bytes_of_the_compiled_job_match_the_plan(pipeline_run: Path) -> None:
    from autopar.bridges.oneflow.boundary_traffic import count_boundary_traffic

    predicted = json.loads((pipeline_run / "boundaries.json").read_text())
    edges = [e for e in count_boundary_traffic(pipeline_run / "pipeline_job.pb") if e.shape != [1]]
    (pipeline_run / "counted.json").write_text(json.dumps([e.to_dict() for e in edges], indent=1))
    activation = [e for e in edges if e.shape == [8, 32, 64]]
    forward = [e for e in activation if e.direction == "forward"]
    backward = [e for e in activation if e.direction == "backward"]
    assert len(forward) == len(backward) == 1, [e.to_dict() for e in activation]
    by_tensor = {r["tensor"]: r for r in predicted}
    want_fwd = by_tensor["layers.0.mlp_residual/out_0"]
    want_bwd = by_tensor["layers.0.mlp_residual.out_0_grad_add_n/out_0"]
    print("boundary bytes per device per micro-batch, predicted vs counted (compiled job):")
    for want, got in ((want_fwd, forward[0]), (want_bwd, backward[0])):
        print(
            f"  {want['tensor']}: predicted {want['bytes_per_device']:.0f} B "
            f"({want['sender_sbp']} -> {want['receiver_sbp']}), counted {got.received_per_device:.0f} B "
            f"received / {got.sent_per_device:.0f} B sent ({got.src_sbp} -> {got.dst_sbp}, {got.phase})"
        )
        assert got.phase == "per_micro_batch"
        assert (got.src_sbp, got.dst_sbp) == (want["sender_sbp"], want["receiver_sbp"])
        assert got.received_per_device == pytest.approx(want["bytes_per_device"])
        assert got.sent_per_device == pytest.approx(want["bytes_per_device"])
    # the tied word embedding: OneFlow moves the weight to the head's stage twice and its
    # gradient back once every micro-batch, as autopar prices it under oneflow-0.9
    # (autopar.pipeline.evaluate.TIED_TRANSFERS_PER_MICRO_BATCH)
    from autopar.pipeline.evaluate import TIED_TRANSFERS_PER_MICRO_BATCH

    tied = [e for e in edges if e.shape == [512, 64]]
    tied_want = next(r for r in predicted if r["tied_gradient"])
    for e in tied:
        print(
            f"  tied wte {e.direction}: counted {e.received_per_device:.0f} B per micro-batch "
            f"({e.src_sbp} -> {e.dst_sbp}); autopar: {tied_want['bytes_per_device']:.0f} B once per step"
        )
    assert {e.direction for e in tied} == {"forward", "backward"}
    assert sum(e.direction == "forward" for e in tied) == TIED_TRANSFERS_PER_MICRO_BATCH["to_copy"]
    assert sum(e.direction == "backward" for e in tied) == TIED_TRANSFERS_PER_MICRO_BATCH["to_owner"]
    assert all(e.phase == "per_micro_batch" for e in tied)
    # as the owner (stage 0) lays the parameter out
    owner = plan_of(pipeline_run).stages[0]
    wte = owner.variables["embedding.word_embeddings.weight"]
    pieces = 1
    for size, value in zip(owner.mesh.shape, wte["sbp"].strip("()").split(", ")):
        pieces *= size if value.startswith("S") else 1
    assert all(e.received_per_device == pytest.approx(512 * 64 * 4 / pieces) for e in tied)


def plan_of(run: Path) -> Any:  # the run's autopar.pipeline.plan.PipelinePlan
    from autopar.pipeline.plan import PipelinePlan

    return PipelinePlan.from_dict(json.loads((run / "plan.json").read_text()))


def test_oneflow_fidelity_prints_the_stage_boundaries(
    pipeline_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``autopar oneflow fidelity JOB PIPELINE --graph G``: each boundary predicted vs counted."""
    from autopar.cli.main import main

    report = pipeline_run / "fidelity.json"
    argv = [str(pipeline_run / "pipeline_job.pb"), str(pipeline_run / "plan.json")]
    assert (
        main(
            ["oneflow", "fidelity", *argv, "--graph", str(pipeline_run / "graph.json"), "--json", str(report)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "forward  layers.0.mlp_residual/out_0 [8, 32, 64] (micro-batch): predicted 16384, "
        "counted per micro-batch: 16384" in out
    )
    assert (
        "backward layers.0.mlp_residual.out_0_grad_add_n/out_0 [8, 32, 64] (micro-batch): predicted 16384"
        in out
    )
    data = json.loads(report.read_text())
    assert {p["tensor"] for p in data["predicted"]} >= {"layers.0.mlp_residual/out_0"}
