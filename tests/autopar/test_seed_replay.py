"""The LiBai MT5 report replayed (``benchmarks/seed_replay.py``, issues 22 and 26): the fit
reproduces the figures it consumes and nothing else, its two choices move the prediction
the way the model says they should, and every table it prints is a partition of the
evaluator's own records."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from autopar.cost.breakdown import micro_batch_time
from autopar.hardware.cluster import PRESETS, Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.sbp import Partial
from autopar.models import build
from benchmarks.seed_replay import (
    INTER_FACTORS,
    NSYS_CLASSES,
    SEED,
    SHARE_READINGS,
    Fit,
    Predicted,
    _micro_batch,
    fit,
    main,
    mechanisms,
    phases,
    predict,
    refit_share,
    span,
    what_if,
    with_inter,
)

MODEL = "tiny-mt5"
"""The replay's arithmetic is the model's; a tiny MT5 keeps each evaluation under a second."""
TP_AXIS = len(SEED.mesh) - 1


@pytest.fixture(scope="module")
def fitted() -> Fit:
    return fit(MODEL)


@pytest.fixture(scope="module")
def predicted(fitted: Fit) -> Predicted:
    return predict(fitted, "oneflow-0.9", MODEL)


def _graph() -> Graph:
    return build(MODEL, batch=SEED.samples_per_rank * SEED.mesh[0])


def _mesh(f: Fit) -> Mesh:
    return Mesh(Cluster(SEED.nodes, SEED.devices_per_node, f.device), SEED.mesh)


def _tp_all_reduce_s(f: Fit) -> float:
    meg = _micro_batch(_graph(), "megatron", _mesh(f), SEED.zero_stage, "oneflow-0.9")
    return meg.comm_s[("all-reduce", TP_AXIS)]


def test_the_fit_reproduces_its_inputs_for_every_reading_of_the_share(fitted: Fit):
    single = build(MODEL, batch=SEED.single_device_samples)
    one = Mesh(Cluster(1, 1, fitted.device), (1,))
    compute = _micro_batch(single, "single-device", one, 0, "oneflow-0.9").compute_s
    assert compute == pytest.approx(SEED.single_device_s, rel=0.01)
    bandwidths = []
    for share in SHARE_READINGS:
        f = refit_share(fitted, share)
        assert _tp_all_reduce_s(f) == pytest.approx(share * SEED.megatron_s, rel=0.01)
        bandwidths.append(f.device.intra_node_bandwidth)
    # a larger share of the same 357 ms in all-reduce means a slower link
    assert bandwidths == sorted(bandwidths, reverse=True) and len(set(bandwidths)) == len(bandwidths)


def test_the_inter_node_choice_leaves_the_fitted_inputs_alone(fitted: Fit):
    assert fitted.device.inter_node_bandwidth == pytest.approx(fitted.device.intra_node_bandwidth)
    target = SEED.megatron_all_reduce_share * SEED.megatron_s
    for f in [with_inter(fitted, x) for x in INTER_FACTORS] + [with_inter(fitted, None)]:
        assert f.device.intra_node_bandwidth == fitted.device.intra_node_bandwidth
        assert _tp_all_reduce_s(f) == pytest.approx(target, rel=0.01)
    own = fit(MODEL, inter_over_intra=None)
    assert own.device.inter_node_bandwidth == PRESETS["a100-40g"].inter_node_bandwidth


def test_the_predicted_ratio_falls_as_the_inter_node_bandwidth_rises(fitted: Fit):
    """``inferred`` gathers ZeRO shards across nodes every micro-batch, ``megatron`` keeps
    its micro-batch inside a node: a faster inter-node link helps ``inferred`` more."""
    runs = [predict(with_inter(fitted, x), "oneflow-0.9", MODEL) for x in sorted(INTER_FACTORS)]
    inferred = [p.spans("micro-batch")[1].total_s for p in runs]
    assert all(a > b for a, b in itertools.pairwise(inferred))
    ratios = [p.ratio for p in runs]
    assert all(a >= b for a, b in itertools.pairwise(ratios)) and ratios[0] > ratios[-1]


def test_spans_are_the_evaluators_micro_batch_and_iteration(predicted: Predicted):
    g = _graph()
    inf_micro, inf_step = (
        span(predicted.inferred, "micro-batch", SEED.micro_batches),
        span(predicted.inferred, "step", SEED.micro_batches),
    )
    assert inf_micro.total_s == pytest.approx(micro_batch_time(g, predicted.inferred).total_s)
    assert inf_step.total_s == pytest.approx(predicted.inferred.iteration_time_s)
    for s in (inf_micro, inf_step, *predicted.spans("micro-batch"), *predicted.spans("step")):
        families = sum(s.share(name) for name in NSYS_CLASSES)
        assert families == pytest.approx(s.share("NCCL"))
        assert families + s.compute_s / s.total_s == pytest.approx(1.0)


def test_mechanisms_and_phases_partition_each_plans_time(predicted: Predicted):
    g = _graph()
    k = SEED.micro_batches
    for ev in (predicted.megatron, predicted.inferred):
        rows = mechanisms(g, ev, k)
        micro, step = span(ev, "micro-batch", k), span(ev, "step", k)
        assert sum(r["micro_batch_s"] for r in rows) == pytest.approx(micro.total_s - micro.compute_s)
        assert sum(r["step_s"] for r in rows) == pytest.approx(step.total_s - step.compute_s)
        assert sum(phases(g, ev).values()) == pytest.approx(micro.total_s)
    # megatron's ZeRO gathers run once per step (Megatron-DeepSpeed), inferred's every micro-batch
    gathers = {
        plan: sum(r["micro_batch_s"] for r in mechanisms(g, ev, k) if r["origin"] == "ZeRO parameter gather")
        for plan, ev in (("megatron", predicted.megatron), ("inferred", predicted.inferred))
    }
    assert gathers["megatron"] == 0 < gathers["inferred"]


def test_each_what_if_re_prices_only_its_mechanism(fitted: Fit, predicted: Predicted):
    k, mesh, inf = SEED.micro_batches, _mesh(fitted), predicted.inferred
    before = span(inf, "micro-batch", k)
    gathers = sum(e.time_s * e.per_micro_batch for e in inf.edges if e.zero_gather)
    once = what_if(inf, mesh, ["ZeRO gather once per step"])
    assert not any(e.per_micro_batch for e in once.edges if e.zero_gather)
    assert span(once, "micro-batch", k).total_s == pytest.approx(before.total_s - gathers)

    summed = what_if(inf, mesh, ["partial sums all-reduced"])
    after = span(summed, "micro-batch", k)
    assert not any(
        s.collective.value == "send-recv" and isinstance(s.src.values[s.axis], Partial)
        for e in summed.edges
        for s in e.steps
    )
    assert after.nsys_s["all-reduce"] > before.nsys_s["all-reduce"]
    assert after.nsys_s["send/recv"] < before.nsys_s["send/recv"]
    for family in ("all-gather", "reduce-scatter"):
        assert after.nsys_s[family] == pytest.approx(before.nsys_s[family])
    assert after.compute_s == pytest.approx(before.compute_s)


def test_the_command_prints_the_inputs_apart_from_the_predictions(tmp_path: Path, capsys):
    out = tmp_path / "seed.json"
    main(["--model", MODEL, "--json", str(out)])
    text = capsys.readouterr().out
    order = ["fitted on (inputs", "predicted (not used by the fit)", "per-collective shares", "Sensitivity"]
    positions = [text.index(heading) for heading in order]
    assert positions == sorted(positions)
    data = json.loads(out.read_text())
    assert set(data["replay"]["inputs"]) == {"single_device_compute_ms", "megatron_tp_all_reduce_ms"}
    assert len(data["sensitivity"]["inter_node"]) == len(INTER_FACTORS) + 2
    assert [r["choice"] for r in data["sensitivity"]["all_reduce_share"]] == [
        f"{100 * s:.1f} %" for s in SHARE_READINGS
    ]
