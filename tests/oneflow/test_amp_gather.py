"""The dtype of OneFlow 0.9's ZeRO gather and gradient reduction under mixed precision (issue 33).

``_probe_amp_gather.py`` compiles a ZeRO-2 job on 4 CPU ranks ``[2, 2]`` whose two fp32
weights are read through one fp32 -> fp16 ``cast`` each (the cast OneFlow's AMP pass inserts
on GPUs; on CPU ranks the pass rewrites nothing), at ``K = 1`` and ``K = 4``.  What it shows:

* the ZeRO gather moves the **fp16 copy**: ``System-ZeRO-ParallelCast`` reads the cast's
  output (``optimizer_placement_optimization_pass.cpp`` L92-129 walks variable -> cast,
  L161-198 puts the parallel cast after the sequence's last node), and where the pass drops
  that op the forward boxes the fp16 copy itself; at ``K = 4`` the sequence is variable ->
  ``repeat`` -> cast, still fp16 -- so :func:`autopar.cost.zero_gathers.zero_gather_dtype` prices 2 bytes;
* the gradient reduction (``P -> S`` on the data-parallel axis) moves **fp16 at K = 1** (SBP
  inference boxes the matmul's fp16 gradient into the fp16 -> fp32 cast) and **fp32 at
  K = 4** (the ``acc`` op accumulates the fp32 gradient after that cast, and the reduction
  runs once per step on it).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autopar.cost.evaluate import evaluate
from autopar.cost.zero_gathers import zero_gather_dtype
from autopar.ir.training import TrainingConfig

pytestmark = pytest.mark.oneflow

KS = (1, 4)
FLOAT16 = 9  # oneflow DataType kFloat16


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory, flow: Any) -> dict[int, bytes]:
    from tests.oneflow.conftest import launch

    built = {}
    for k in KS:
        out = tmp_path_factory.mktemp(f"amp_k{k}")
        launch(4, Path(__file__).with_name("_probe_amp_gather.py"), str(out), str(k))
        built[k] = (out / "amp.pb").read_bytes()
    return built


def _job(raw: bytes) -> Any:
    from oneflow.core.job import job_pb2

    job = job_pb2.Job()
    job.ParseFromString(raw)
    return job


@pytest.mark.parametrize("k", KS)
def test_the_zero_parallel_cast_reads_the_fp16_cast(jobs: dict[int, bytes], k: int) -> None:
    job = _job(jobs[k])
    types = {op.name: op.user_conf.op_type_name for op in job.net.op if op.HasField("user_conf")}
    casts = [op for op in job.net.op if op.name.startswith("System-ZeRO-ParallelCast")]
    assert casts, "the job has no ZeRO gather"
    for op in casts:
        lbn = op.user_conf.input["in"].s[0]
        assert types[lbn.split("/")[0]] == "cast"
        assert job.helper.lbn2logical_blob_desc[lbn].data_type == FLOAT16


@pytest.mark.parametrize("k", KS)
def test_gathers_are_fp16_and_reductions_fp16_at_k1_fp32_after_accumulation(
    jobs: dict[int, bytes], k: int
) -> None:
    from autopar.bridges.oneflow import import_job, import_plan

    graph = import_job(jobs[k])
    optimizers = [op for op in graph.ops if op.type == "adam_update"]
    assert len(optimizers) == 2
    assert {zero_gather_dtype(graph, op) for op in optimizers} == {"float16"}
    plan = replace(import_plan(jobs[k], graph=graph, zero_stage=2), training=TrainingConfig(k, "off"))
    ev = evaluate(graph, plan)
    gathers = [e for e in ev.edges if not e.gradient and e.src != e.dst]
    reductions = [e for e in ev.edges if e.gradient]
    assert len(gathers) == 2 and {e.dtype for e in gathers} == {"float16"}
    assert all((e.per_micro_batch, e.per_step) == (1, 0) for e in gathers)  # oneflow-0.9: every micro-batch
    assert len(reductions) == 2
    assert {e.dtype for e in reductions} == {"float16" if k == 1 else "float32"}
    assert all((e.per_micro_batch, e.per_step) == (0, 1) for e in reductions)
