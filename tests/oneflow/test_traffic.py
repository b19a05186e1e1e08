"""Bytes a OneFlow job moves by its own N-D SBP (autopar.bridges.oneflow.traffic), on the tiny [2, 2] jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autopar.bridges.oneflow.traffic import count_job_traffic

pytestmark = pytest.mark.oneflow


def _job(path: Path) -> Any:
    from autopar.bridges.oneflow.jobs import load_job

    return load_job(path)


def test_a_zero2_job_moves_bytes_on_both_axes_including_zero_casts_and_optimizer(
    mesh_jobs: tuple[Path, dict[str, Any]],
) -> None:
    out, _ = mesh_jobs
    traffic = count_job_traffic(out / "mt5-tiny_zero2.pb")
    assert not traffic.compiled  # a built job: no middle nodes yet
    assert traffic.bytes_per_axis[0] > 0 and traffic.bytes_per_axis[1] > 0
    assert sum(traffic.bytes_per_category["zero_cast"].values()) > 0
    assert sum(traffic.bytes_per_category["optimizer"].values()) > 0
    assert sum(traffic.bytes_per_axis.values()) == pytest.approx(sum(traffic.bytes_per_kind.values()))


def test_without_zero_no_zero_cast_bytes(mesh_jobs: tuple[Path, dict[str, Any]]) -> None:
    out, _ = mesh_jobs
    traffic = count_job_traffic(out / "gpt-tiny_zero0.pb")
    assert "zero_cast" not in traffic.bytes_per_category


def test_a_job_whose_every_port_is_broadcast_moves_nothing(mesh_jobs: tuple[Path, dict[str, Any]]) -> None:
    out, _ = mesh_jobs
    job = _job(out / "bert-tiny_zero2.pb")
    for sig in job.job_parallel_view_conf.op_name2nd_sbp_signature_conf.values():
        for nd in sig.bn_in_op2nd_sbp.values():
            for v in nd.sbp_parallel:
                v.broadcast_parallel.SetInParent()
    assert sum(count_job_traffic(job).bytes_per_axis.values()) == 0


def test_oneflow_zero_stores_each_variable_as_the_one_axis_rule_says(
    mesh_jobs: tuple[Path, dict[str, Any]],
) -> None:
    """OneFlow's ZeRO pass (run at build) stores every variable one axis more split than
    its forward layout: the `oneflow-0.9` runtime's rule (oneflow_zero_shard) predicts it."""
    from autopar.bridges.oneflow import import_job
    from autopar.bridges.oneflow.convert import nd_sbp_from_proto
    from autopar.bridges.oneflow.plans import job_runtime
    from autopar.ir.sbp import parse_nd_sbp
    from autopar.rules.families.optimizer import oneflow_zero_shard
    from autopar.runtimes.registry import RUNTIMES

    out, _ = mesh_jobs
    checked = 0
    for model in ("mt5-tiny", "gpt-tiny", "bert-tiny"):
        job = _job(out / f"{model}_zero2.pb")
        graph = import_job(job)
        conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
        mesh = tuple(graph.meta["mesh_shape"])
        min_size = RUNTIMES[job_runtime(job)].zero_shard_min_size  # the job's shard_min_size
        for var, layout in graph.meta["oneflow"]["zero_layouts"].items():
            shape = graph.tensors[graph.variable_by_op[var].tensor].shape
            stored = nd_sbp_from_proto(conf[var].bn_in_op2nd_sbp["out"], len(mesh))
            want = oneflow_zero_shard(shape, parse_nd_sbp(layout), mesh, min_size)
            assert stored == want, var
            checked += 1
    assert checked > 0
