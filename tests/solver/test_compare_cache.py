"""`plan --compare` evaluates each baseline once: kept on disk under a content key."""

from __future__ import annotations

from pathlib import Path

import pytest

import autopar.baselines.plans
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.models import build
from autopar_solver.cli import baseline_evaluated

MESH = Mesh(Cluster.parse("1x4", "a100-40g"), (2, 2))


def test_each_baseline_is_evaluated_once_per_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    built: list[str] = []
    real = autopar.baselines.plans.baseline_plan

    def counting(kind, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(kind)
        return real(kind, *args, **kwargs)

    monkeypatch.setattr(autopar.baselines.plans, "baseline_plan", counting)
    graph = build("tiny-gpt")
    first = baseline_evaluated("data-parallel", graph, MESH, 2, tmp_path, "ideal")
    again = baseline_evaluated("data-parallel", graph, MESH, 2, tmp_path, "ideal")
    assert built == ["data-parallel"]
    assert again.to_dict() == first.to_dict()
    assert first.step_time_s > 0
    # any change of content is a new entry: the kind, the ZeRO stage, the runtime profile
    baseline_evaluated("megatron", graph, MESH, 2, tmp_path, "ideal")
    baseline_evaluated("data-parallel", graph, MESH, 3, tmp_path, "ideal")
    baseline_evaluated("data-parallel", graph, MESH, 2, tmp_path, "oneflow-0.9")
    assert built == ["data-parallel", "megatron", "data-parallel", "data-parallel"]
    assert len(list(tmp_path.glob("*.json"))) == 4


def test_a_damaged_entry_is_recomputed(tmp_path: Path):
    graph = build("tiny-gpt")
    plan = baseline_evaluated("data-parallel", graph, MESH, 2, tmp_path, "ideal")
    (entry,) = tmp_path.glob("*.json")
    entry.write_text("{not json")
    again = baseline_evaluated("data-parallel", graph, MESH, 2, tmp_path, "ideal")
    assert again.step_time_s == pytest.approx(plan.step_time_s)
