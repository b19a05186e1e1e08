"""OneFlow 0.9's ZeRO on tiny probe jobs (8 CPU ranks, [4, 2], ZeRO-2, ``shard_min_size`` 1024).

``_probe_zero_shard.py`` declares weights of 12288 elements ``(B, B)`` or ``(B, S(0))`` read
by one or two ops.  What it shows: every weight is stored as
:func:`~autopar.rules.families.optimizer.oneflow_zero_shard` predicts (a conv weight too),
and the ``System-ZeRO-ParallelCast`` that restores the forward layout is missing exactly
when it would have one consumer reading the cast's own layout (a replicated weight read
only by a ``conv2d`` or ``matmul`` whose input needs no gradient: ViT's
``patch_embed.weight``); :func:`autopar.bridges.oneflow.import_plan` then takes that reader's
layout as the variable's (``autopar/bridges/oneflow/plans.py``, ``_uncast_zero_layout``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autopar.cost.evaluate import evaluate
from autopar.ir.sbp import parse_nd_sbp
from autopar.rules.families.optimizer import oneflow_zero_shard

pytestmark = pytest.mark.oneflow

MESH = (4, 2)
USES = {
    # name: (kind, shape, declared layout, whether the job keeps a ZeRO cast for it)
    "a": ("conv", "64x3x8x8", "(B, B)", False),  # one reader, reads (B, B): cast dropped
    "b": ("convg", "64x3x8x8", "(B, B)", True),  # conv2d + conv_data_grad
    "c": ("matmul", "64x192", "(B, B)", False),
    "d": ("matmulg", "64x192", "(B, B)", True),  # forward matmul + the input's gradient matmul
    "e": ("conv2x", "64x3x8x8", "(B, B)", True),  # two forward convs
    "f": ("conv", "64x3x8x8", "(B, S(0))", True),  # the cast restores (B, S(0)), the conv reads (B, B)
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory, flow: Any) -> Path:
    from tests.oneflow.conftest import launch

    out = tmp_path_factory.mktemp("zero_shard")
    spec = ";".join(
        f"{name}:{kind}:{shape}" + (":BB" if layout == "(B, B)" else "")
        for name, (kind, shape, layout, _) in USES.items()
    )
    launch(8, Path(__file__).with_name("_probe_zero_shard.py"), str(out), f"probe={spec}")
    return out / "probe.pb"


def test_every_weight_is_stored_as_the_one_axis_rule_shards_it(probe: Path) -> None:
    stored = json.loads(probe.with_suffix(".json").read_text())
    for name, (_, shape, layout, _) in USES.items():
        dims = [int(d) for d in shape.split("x")]
        expected = oneflow_zero_shard(dims, parse_nd_sbp(layout), MESH)
        assert parse_nd_sbp("(" + ", ".join(stored[name]) + ")") == expected, name


def test_the_zero_cast_is_missing_where_its_one_consumer_reads_its_layout(probe: Path) -> None:
    from autopar.bridges.oneflow import import_job

    casts = import_job(probe, zero_stage=2).meta["oneflow"]["zero_layouts"]
    assert {name for name, use in USES.items() if use[3]} == {op.removeprefix("m.") for op in casts}


def test_the_probe_jobs_own_plan_imports_valid(probe: Path) -> None:
    """The plan models the cast-less replicated weights as ``(B, B)`` variables whose
    updates read the ``(B, S(0))`` shard, as the cast-holding ones."""
    from autopar.bridges.oneflow import import_job, import_plan

    graph = import_job(probe, zero_stage=2)
    plan = import_plan(probe, graph=graph, zero_stage=2)
    assert evaluate(graph, plan).errors == []
    for name, (_, _, layout, _) in USES.items():
        assert str(plan.signatures[f"m.{name}"].outputs[0]) == layout, name
