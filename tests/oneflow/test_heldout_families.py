"""The held-out evaluation jobs (examples/oneflow/heldout/families.py) on 8 CPU ranks as [4, 2].

Built once per session (``$AUTOPAR_ONEFLOW_JOBS/heldout`` when that is set) by
``_build_heldout_families.py`` with OneFlow's default ZeRO-2.  These are
EVALUATION jobs: the assertions say what holds on them; what does not hold yet is
marked ``xfail(strict=True)`` with the reason, so a fix shows up as a pass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from autopar.evaluate import evaluate
from autopar.graph import Role
from autopar.sbp import Broadcast, Partial

pytestmark = pytest.mark.oneflow

FAMILIES = ("llama", "bert", "vit")
LAYERS = 2


@pytest.fixture(scope="session")
def heldout_jobs(tmp_path_factory: pytest.TempPathFactory, flow: Any) -> Path:
    from tests.oneflow.conftest import launch

    cached = os.environ.get("AUTOPAR_ONEFLOW_JOBS")
    out = Path(cached) / "heldout" if cached else tmp_path_factory.mktemp("heldout")
    if not all((out / f"{f}_zero2.pb").exists() for f in FAMILIES):
        out.mkdir(parents=True, exist_ok=True)
        launch(8, Path(__file__).with_name("_build_heldout_families.py"), str(out), *FAMILIES)
    return out


def _megatron(job: Path) -> tuple[Any, Any]:
    from autopar.baselines import baseline_plan
    from autopar.oneflow import import_job, import_plan

    graph = import_job(job, zero_stage=2)
    mesh = import_plan(job, graph=graph, zero_stage=2).mesh
    return graph, evaluate(graph, baseline_plan("megatron", graph, mesh, 0), group_boxing=True)


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_megatron_reduces_each_column_block_input_gradient_once(heldout_jobs: Path, family: str) -> None:
    """Separate q, k, v (and gate, up) projections: their input gradients, summed by one
    ``add_n`` with the residual's, are all-reduced once per block, as Megatron-LM does
    (2 per layer: attention and MLP), plus the vocab-split head's input gradient (BERT's
    LM-head transform dense stays a replicated Linear, as Megatron-LM's BertLMHead keeps it)."""
    graph, ev = _megatron(heldout_jobs / f"{family}_zero2.pb")
    hidden = graph.tensors[graph.variables[0].tensor].shape[-1]
    reductions = [
        e
        for e in ev.edges
        if graph.op_by_name[e.producer].role is Role.BACKWARD
        and len(e.shape) == 3
        and e.shape[-1] == hidden
        and isinstance(e.src[1], Partial)
        and isinstance(e.dst[1], Broadcast)
    ]
    assert len(reductions) == 2 * LAYERS + 1


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_megatron_tensor_parallel_bytes_within_5_percent_of_megatron_lm(
    heldout_jobs: Path, family: str
) -> None:
    """A composite cross-entropy (``log_softmax``, ``nll``) of a vocab-split head stays
    vocab-parallel, as Megatron-LM's ``_VocabParallelCrossEntropy`` (all-reduces of
    ``[b, s]`` statistics, not the logits): the tensor-parallel bytes are Megatron-LM's
    hand count by formula (:func:`benchmarks.heldout_truth.hand_count_family`)."""
    from benchmarks.heldout_truth import family_config, hand_count_family

    graph, ev = _megatron(heldout_jobs / f"{family}_zero2.pb")
    hand_family, cfg = family_config(family)
    from autopar.oneflow import import_plan

    mesh = import_plan(heldout_jobs / f"{family}_zero2.pb", graph=graph, zero_stage=2).mesh
    assert ev.valid, ev.errors[:3]
    assert ev.comm_bytes_per_axis[1] == pytest.approx(hand_count_family(hand_family, cfg, mesh), rel=0.05)


@pytest.mark.parametrize("family", FAMILIES)
def test_both_byte_formulas_count_the_same_total(heldout_jobs: Path, family: str) -> None:
    """The counter's two per-hop formulas may split a flat collective differently over the
    axes, never its total."""
    from autopar.oneflow.traffic import count_job_traffic

    counted = count_job_traffic(heldout_jobs / f"{family}_zero2.pb")
    assert sum(counted.kernel_bytes_per_axis.values()) == pytest.approx(sum(counted.bytes_per_axis.values()))


def test_megatron_reduces_a_tied_table_read_through_identities_once(
    tmp_path_factory: pytest.TempPathFactory, flow: Any
) -> None:
    """A job that reads its parameters through ``identity`` ops (OneFlow's CPU workaround;
    the tied GPT table is read twice): each gradient is reduced over the data-parallel
    axis once, its two uses summed first, so the bytes are Megatron-LM's DDP count from
    the configuration (they were 1.2x on an HF GPT-2 job before identities could carry
    the partial sum)."""
    from benchmarks.heldout_truth import family_config
    from benchmarks.model_truth import hand_count_dp_bytes_config
    from tests.oneflow.conftest import launch

    cached = os.environ.get("AUTOPAR_ONEFLOW_JOBS")
    out = Path(cached) / "heldout" if cached else tmp_path_factory.mktemp("identity")
    job = out / "gpt-tiny+identity_zero2.pb"
    if not job.exists():
        out.mkdir(parents=True, exist_ok=True)
        launch(8, Path(__file__).with_name("_build_heldout_families.py"), str(out), "gpt-tiny+identity")
    graph, ev = _megatron(job)
    assert any(op.type == "identity" for op in graph.ops)
    family, cfg = family_config("gpt-tiny")
    from autopar.oneflow import import_plan

    mesh = import_plan(job, graph=graph, zero_stage=2).mesh
    assert ev.comm_bytes_per_axis[0] == pytest.approx(hand_count_dp_bytes_config(family, cfg, mesh), rel=0.01)
