"""A pipeline plan applied to tiny GPT on 8 CPU ranks as 2 stages x [2, 2] (issue 36 item 5):
compiled with ``nn.Graph``'s stages, trained 3 steps with the plan's K = 4 micro-batches and
full checkpointing, the same losses as one rank; the bytes the compiled job moves across
the stage boundary against autopar's :func:`autopar.pipeline.boundary_bytes_per_device`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

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
    from autopar.pipeline import PipelinePlan

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
    from autopar.oneflow.pipeline_apply import count_boundary_traffic

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
    # the tied word embedding: autopar holds a copy on the last stage and all-reduces the two
    # gradients once per step; OneFlow moves the weight every micro-batch and its gradient back
    tied = [e for e in edges if e.shape == [512, 64]]
    tied_want = next(r for r in predicted if r["tied_gradient"])
    for e in tied:
        print(
            f"  tied wte {e.direction}: counted {e.received_per_device:.0f} B per micro-batch "
            f"({e.src_sbp} -> {e.dst_sbp}); autopar: {tied_want['bytes_per_device']:.0f} B once per step"
        )
    assert {e.direction for e in tied} == {"forward", "backward"}
