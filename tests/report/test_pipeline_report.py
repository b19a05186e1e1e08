"""The HTML report of a pipeline plan (``autopar.pipeline/v1``): headline, stages table, charts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autopar.baselines.configs import BaselineConfig
from autopar.baselines.megatron.pipeline import pipeline_baseline
from autopar.hardware.cluster import Cluster
from autopar.ir.training import TrainingConfig
from autopar.pipeline.plan import PipelinePlan
from autopar_service.report import build_pipeline_report, cmd_report, load_any_plan
from tests.report.plans import model


@pytest.fixture(scope="module")
def pipeline() -> PipelinePlan:
    """Megatron-LM's PTD-P of tiny-gpt on 1x8: 2 stages of [2, 2] (no solve needed)."""
    config = BaselineConfig("megatron", (2, 2), 2, "oneflow-0.9", pipeline=2)
    return pipeline_baseline(model("tiny-gpt"), Cluster.parse("1x8"), config, TrainingConfig(4, "full"))


def _stages_table(page: str) -> str:
    table = page[page.index("id='stages-table'") :]
    return table[: table.index("</table>")]


def test_the_report_shows_every_stage(pipeline: PipelinePlan) -> None:
    page = build_pipeline_report(model("tiny-gpt"), pipeline, ["megatron", "single-device"])
    assert "<b>2 pipeline stages</b> x mesh [2, 2]" in page
    table = _stages_table(page)
    assert table.count("<tr>") == 3
    for text in ("layers.0", "layers.1", "[2, 2]", "receives", "micro-batches in flight"):
        assert text in table, text
    headline = page[page.index('id="headline"') : page.index('id="stages"')]
    assert "bubble" in headline and "1F1B" in headline
    assert "n/a: single-device has no pipeline form" in headline
    for chart in ("chart-step", "chart-comm", "chart-layers", "chart-memory"):
        assert f'id="{chart}"' in page, chart
    assert "stage 0" in page and "stage 1" in page  # the charts' columns


def test_autopar_report_reads_a_pipeline_plan(pipeline: PipelinePlan, tmp_path: Path) -> None:
    path = tmp_path / "pp.json"
    pipeline.save(str(path))
    assert isinstance(load_any_plan(str(path)), PipelinePlan)
    out = tmp_path / "pp.html"
    args = argparse.Namespace(
        graph="tiny-gpt",
        plan=str(path),
        compare=["megatron"],
        budget=None,
        label="ptd-p",
        out=str(out),
        micro_batches=None,
        checkpointing=None,
    )
    assert cmd_report(args) == 0
    page = out.read_text()
    assert "ptd-p" in page and _stages_table(page).count("<tr>") == 3
