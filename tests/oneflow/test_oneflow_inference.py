"""autopar's emulation of OneFlow's greedy SBP inference vs OneFlow's own choices (import-plan)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autopar.oneflow.importer import import_job
from autopar.oneflow.plans import import_plan
from autopar.oneflow_inference import SOURCE_TYPES, agreement, infer_like_oneflow

pytestmark = pytest.mark.oneflow


@pytest.mark.parametrize("model", ["gpt-tiny", "bert-tiny"])
def test_each_op_decides_like_oneflow_from_oneflows_producer_layouts(
    mesh_jobs: tuple[Path, dict[str, Any]], model: str
) -> None:
    out, _ = mesh_jobs
    job = out / f"{model}_zero0.pb"
    graph = import_job(job)
    plan = import_plan(job, graph=graph)
    per_op = agreement(graph, plan, cascade=False)
    # measured on these jobs: GPT 86.1 %, BERT 85.0 % (target 95 %: ties in bytes still go
    # to autopar's rule order, not OneFlow's; see docs/oneflow.md); a floor against regressions
    assert per_op.share >= 0.8, per_op.examples[:5]


def test_sources_keep_their_given_layout(mesh_jobs: tuple[Path, dict[str, Any]]) -> None:
    out, _ = mesh_jobs
    job = out / "mt5-tiny_zero0.pb"
    graph = import_job(job)
    plan = import_plan(job, graph=graph)
    sources = {op.name: plan.signatures[op.name] for op in graph.ops if op.type in SOURCE_TYPES}
    inferred = infer_like_oneflow(graph, tuple(plan.mesh.shape), sources)
    assert all(inferred[name] == sig for name, sig in sources.items())
    assert set(inferred) == {op.name for op in graph.ops}
