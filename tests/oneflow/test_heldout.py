"""The held-out jobs (``examples/oneflow/heldout``, the ``evaluation`` split) on 8 CPU ranks as [4, 2].

OneFlow's own plans of every held-out job import with no evaluator error (every op
signature OneFlow uses is one the rules offer, ZeRO at OneFlow's default
``shard_min_size`` included), and autopar's plan, pinned with ``compile_with_plan``,
compiles with no refused signature, at the default ZeRO settings and with
``shard_min_size=1``.  A plan made for ``shard_min_size=1`` pinned into a job at the
default settings (the reported failure) compiles too: the retry drops the refused
updates' variables with them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, launch, skip_without_solver

from autopar.bridges.oneflow import import_job, import_plan, load_job
from autopar.bridges.oneflow.plans import job_runtime
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from benchmarks.heldout_pinned import plan_job

pytestmark = pytest.mark.oneflow

sys.path.insert(0, str(EXAMPLES))
from heldout import EVALUATION, SPLIT  # noqa: E402

BUILDER = Path(__file__).with_name("_build_heldout.py")
MIN_SIZES = (1024, 1)


@pytest.fixture(scope="session")
def heldout_jobs(tmp_path_factory: pytest.TempPathFactory, flow: Any) -> Path:
    """Built jobs ``{job}_min{N}.pb`` and OneFlow-compiled ``{job}_min1024_compiled.pb``.

    Built once in ``$AUTOPAR_ONEFLOW_JOBS/heldout`` when that is set.
    """
    cached = os.environ.get("AUTOPAR_ONEFLOW_JOBS")
    out = Path(cached) / "heldout" if cached else tmp_path_factory.mktemp("heldout")
    if not (out / "built.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        launch(8, BUILDER, str(out), "build", timeout=1200)
    return out


def test_the_split_is_frozen_and_the_heldout_jobs_are_evaluation() -> None:
    assert set(EVALUATION) == {"hf-t5-tiny", "hf-gpt2-tiny"}
    assert all(SPLIT[name] == "development" for name in ("mt5-tiny", "gpt-tiny", "bert-tiny"))
    with pytest.raises(TypeError):
        SPLIT["hf-t5-tiny"] = "development"  # type: ignore[index]


@pytest.mark.parametrize("name", EVALUATION)
def test_oneflow_inference_of_a_heldout_job_imports_valid(heldout_jobs: Path, name: str) -> None:
    """Built (default and shard_min_size=1 ZeRO) and compiled (default): 0 evaluator errors."""
    files = [f"{name}_min{n}.pb" for n in MIN_SIZES] + [f"{name}_min1024_compiled.pb"]
    for file in files:
        job = load_job(heldout_jobs / file)
        graph = import_job(job)
        plan = import_plan(job, graph=graph, cluster=Cluster.parse("1x8"))
        assert plan.runtime == ("oneflow-0.9-shard-min-1" if "_min1." in file else "oneflow-0.9")
        ev = evaluate(graph, plan)
        print(f"{file}: {len(graph.ops)} ops, OneFlow's plan valid={ev.valid}, {len(ev.errors)} errors")
        assert ev.valid and not ev.errors, (file, ev.errors[:5])


@pytest.mark.parametrize("name", EVALUATION)
def test_predicted_bytes_of_oneflows_plan_are_the_compiled_jobs_count(heldout_jobs: Path, name: str) -> None:
    """OneFlow's plan (imported from the built job) priced by the evaluator, grouped by
    destination, against ``count_job_traffic`` of the job OneFlow compiled from it: the
    compiled job holds the ``BoxingCollector``'s middle nodes and one boxing per (tensor,
    destination SBP), as the evaluator prices them; within 1 % per mesh axis.  (Counted on
    the built job, ZeRO's ``(P, P) -> (B, S(0))`` gradients are single 2-D send/recv edges and
    each consumer its own edge: the held-out table's +50 % on axis 0.)"""
    from autopar.bridges.oneflow.traffic import count_job_traffic

    built = heldout_jobs / f"{name}_min1024.pb"
    graph = import_job(built, zero_stage=2)
    ev = evaluate(graph, import_plan(built, graph=graph, zero_stage=2))
    counted = count_job_traffic(heldout_jobs / f"{name}_min1024_compiled.pb")
    assert counted.compiled and counted.middle_nodes > 0
    for axis in (0, 1):
        predicted, count = ev.comm_bytes_per_axis[axis], counted.bytes_per_axis[axis]
        print(f"{name} axis {axis}: predicted {predicted:.0f}, counted {count:.0f} bytes per device")
        assert predicted == pytest.approx(count, rel=0.01)


def test_oneflow_default_zero_leaves_small_variables_unsharded(heldout_jobs: Path) -> None:
    """In the job, norm weights and biases keep (B, B) storage under the default ZeRO, and the
    rules' oneflow-0.9 update of such a variable reads its gradient (B, B) as OneFlow does."""
    for name in EVALUATION:
        job = load_job(heldout_jobs / f"{name}_min1024.pb")
        small = {
            op.name: list(op.variable_conf.nd_sbp)
            for op in job.net.op
            if op.HasField("variable_conf") and op.name.endswith(("norm.weight", "ln_1.weight", "ln_f.bias"))
        }
        assert small and all(v == ["B", "B"] for v in small.values()), small
        shard1 = load_job(heldout_jobs / f"{name}_min1.pb")
        split = [list(op.variable_conf.nd_sbp) for op in shard1.net.op if op.name in small]
        assert all("S(0)" in v for v in split), split


def _plan(out: Path, name: str, min_size: int, runtime: str, tag: str = "") -> None:
    job = f"{name}_min{min_size}"
    plan_job(out, job, runtime=runtime, stem=f"{job}{tag}", time_limit_s=60.0)


def test_autopar_plans_pin_into_heldout_jobs_without_a_refused_signature(heldout_jobs: Path) -> None:
    skip_without_solver()
    out = heldout_jobs / "pinned"
    out.mkdir(exist_ok=True)
    for name in EVALUATION:
        for min_size in MIN_SIZES:
            (out / f"{name}_min{min_size}.pb").write_bytes(
                (heldout_jobs / f"{name}_min{min_size}.pb").read_bytes()
            )
            _plan(out, name, min_size, job_runtime(load_job(out / f"{name}_min{min_size}.pb")))
    # the reported failure: a plan for shard_min_size=1 pinned into a job at OneFlow's defaults
    _plan(out, "hf-gpt2-tiny", 1024, "oneflow-0.9-shard-min-1", tag="_planned-for-min1")
    launch(8, BUILDER, str(out), "pin", timeout=1800)
    for name in EVALUATION:
        for min_size in MIN_SIZES:
            result = json.loads((out / f"{name}_min{min_size}.pinned.json").read_text())
            print(
                f"{name} shard_min_size={min_size}: {result['ops_matched']}/{result['ops_total']} ops as "
                f"planned ({100 * result['op_share']:.1f} %), {result['pinned_ops']} pinned, "
                f"attempts {result['attempts']}, refused {result['rejected'] or 'none'}"
            )
            assert result["rejected"] == [] and result["attempts"] == 1, result
            assert result["op_share"] > 0.9, result["mismatches"][:10]
    mismatched = json.loads((out / "hf-gpt2-tiny_min1024_planned-for-min1.pinned.json").read_text())
    print(f"plan for shard_min_size=1 in a default job: refused {mismatched['rejected']}, compiled")
    assert mismatched["rejected"], "OneFlow refuses sharded updates of small variables it keeps whole"


def _megatron_against_hand_counts(job: Path, name: str) -> tuple[float, float, float, float]:
    """(megatron tp bytes, Megatron-LM's tp hand count, megatron dp bytes, DDP's dp hand count)."""
    from autopar.baselines.plans import baseline_plan
    from benchmarks.heldout_truth import family_config, hand_count_family
    from benchmarks.model_truth import hand_count_dp_bytes_config

    graph = import_job(job, zero_stage=2)
    mesh = import_plan(job, graph=graph, zero_stage=2).mesh
    ev = evaluate(graph, baseline_plan("megatron", graph, mesh, 0))
    assert ev.valid, ev.errors[:3]
    family, cfg = family_config(name)
    tp, dp = ev.comm_bytes_per_axis[1], ev.comm_bytes_per_axis[0]
    return tp, hand_count_family(family, cfg, mesh), dp, hand_count_dp_bytes_config(family, cfg, mesh)


def test_megatron_on_hf_gpt2_matches_megatron_lms_hand_counts(heldout_jobs: Path) -> None:
    """HF GPT-2's fused ``c_attn`` (a Conv1D ``[in, out]`` weight, its output split into q, k,
    v by ``flow.split``) is one column-parallel linear split by heads, as Megatron-LM's
    ``query_key_value``: tensor- and data-parallel bytes within 5 % of the hand counts (the
    tensor-parallel ones were 1.88x)."""
    tp, tp_hand, dp, dp_hand = _megatron_against_hand_counts(
        heldout_jobs / "hf-gpt2-tiny_min1024.pb", "hf-gpt2-tiny"
    )
    assert tp == pytest.approx(tp_hand, rel=0.05)
    assert dp == pytest.approx(dp_hand, rel=0.05)


def test_megatron_on_hf_t5_data_parallel_bytes_match_ddp(heldout_jobs: Path) -> None:
    """The shared 512 x 128 vocabulary (fewer than 8 rows per column) is vocab-parallel
    because it has as many rows as the loss has classes: DDP's count from the configuration."""
    _, _, dp, dp_hand = _megatron_against_hand_counts(heldout_jobs / "hf-t5-tiny_min1024.pb", "hf-t5-tiny")
    assert dp == pytest.approx(dp_hand, rel=0.05)


def test_megatron_on_hf_t5_tensor_parallel_bytes_match_megatron_lm(heldout_jobs: Path) -> None:
    """OneFlow's autograd sums the encoder output's gradient from the decoder layers'
    cross-attention k and v in ``add_n`` trees that mix layers (k0, v0 and v1 in one, k1 in
    the next); the baseline lets a partial sum complete at most one Megatron linear before
    its all-reduce, so it all-reduces once per decoder layer, as Megatron-LM's ``key_value``
    (``ParallelAttention``, ``self.key_value(encoder_output)``): within 5 % of the hand count
    (it was 1.11x, 2 all-reduces per layer, with one linear per partial sum)."""
    tp, tp_hand, _, _ = _megatron_against_hand_counts(heldout_jobs / "hf-t5-tiny_min1024.pb", "hf-t5-tiny")
    assert tp == pytest.approx(tp_hand, rel=0.05)
