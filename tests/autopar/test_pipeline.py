"""Pipeline stages: the split of a graph, the 1F1B formulas, and the re-check of a pipeline plan,
each against a closed form or Megatron-LM's own hand count."""

from __future__ import annotations

import json
import math

import pytest

from autopar.baselines.megatron.configs import megatron_config
from autopar.baselines.megatron.pipeline import pipeline_baseline
from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.ir.graph import DTYPE_BYTES, Role
from autopar.ir.training import TrainingConfig
from autopar.models import build
from autopar.pipeline.evaluate import evaluate_pipeline, stage_cluster
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.schedule import in_flight_micro_batches, one_f_one_b_iteration
from autopar.pipeline.split import assign_stages, balanced_counts, ordered_blocks, split_graph


def test_one_f_one_b_with_equal_stages_is_k_plus_s_minus_one_slots():
    # Narayanan et al. 2021 sec. 2.2.1: (k + S - 1) slots of t, then the once-per-step work
    t, u, k = 0.010, 0.003, 8
    for stages in (1, 2, 4):
        assert one_f_one_b_iteration([t] * stages, [u] * stages, k) == pytest.approx((k + stages - 1) * t + u)
    # unequal stages: the fill and drain pass every stage once, the rest at the slowest's pace
    assert one_f_one_b_iteration([0.01, 0.02, 0.01], [0.001, 0.004, 0.0], 5) == pytest.approx(
        0.04 + 4 * 0.02 + 0.004
    )


def test_the_first_stage_holds_the_most_micro_batches():
    assert [in_flight_micro_batches(s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight_micro_batches(s, 4, 2) for s in range(4)] == [2, 2, 2, 1]


def test_balanced_counts_put_the_larger_stages_last():
    assert balanced_counts(10, 4) == (2, 2, 3, 3)
    assert sum(balanced_counts(48, 8)) == 48
    with pytest.raises(ConfigError):
        balanced_counts(2, 3)


def test_stages_hold_whole_nodes_or_a_slice_of_one():
    cluster = Cluster.parse("8x8")
    assert (stage_cluster(cluster, 2).nodes, stage_cluster(cluster, 2).devices_per_node) == (4, 8)
    one = Cluster.parse("1x8")
    assert (stage_cluster(one, 2).nodes, stage_cluster(one, 2).devices_per_node) == (1, 4)
    with pytest.raises(ConfigError):
        stage_cluster(Cluster.parse("3x8"), 2)


@pytest.mark.parametrize("model", ["tiny-gpt", "tiny-bert"])
def test_a_decoder_split_in_two_sends_one_activation_forward_and_one_gradient_back(model):
    """Megatron-LM's 1F1B sends one tensor [b, s, h] forward per micro-batch (``send_forward``)
    and its gradient back (``send_backward``): the split must cross with exactly those two, the
    tied word embedding's gradient once per step, and every op in exactly one stage."""
    graph = build(model)
    counts = balanced_counts(len(ordered_blocks(graph)), 2)
    owner = assign_stages(graph, counts)
    slices = split_graph(graph, counts)
    for sl in slices:
        names = {op.name for op in sl.graph.ops}
        owned = {op for op, s in owner.items() if s == sl.index}
        assert owned <= names
        for name in names - owned:  # what a stage holds besides its own ops
            op = sl.graph.op_by_name[name]
            copied = name in sl.tied_copies or any(name == f"{v}.cast" for v in sl.tied_copies)
            assert op.type in ("pipeline_recv", "input") or copied, name
    per_micro_batch = [b for sl in slices for b in sl.receives if b.per == "micro-batch"]
    hidden = graph.meta["config"]["hidden"]
    assert len(per_micro_batch) == 2
    forward, backward = sorted(per_micro_batch, key=lambda b: b.src)
    assert (forward.src, forward.dst, backward.src, backward.dst) == (0, 1, 1, 0)
    for b in per_micro_batch:
        assert graph.tensors[b.tensor].shape[-1] == hidden
        assert graph.tensors[b.tensor].numel == graph.tensors[forward.tensor].numel
    tied = [b for sl in slices for b in sl.receives if b.tied_gradient]
    assert [graph.tensors[b.tensor].shape for b in tied] == [
        graph.tensors["embedding.word_embeddings.weight/out"].shape
    ]
    assert slices[1].tied_copies == ("embedding.word_embeddings.weight",)
    # a stage's graph holds its blocks' forward, backward and optimizer ops
    for sl in slices:
        roles = {op.role for op in sl.graph.ops}
        assert roles == {Role.FORWARD, Role.BACKWARD, Role.OPTIMIZER}


def test_megatron_ptd_p_is_priced_as_its_stages_and_rechecked():
    """tp=2, pp=2, dp=2 on 8 devices: the iteration is 1F1B over the stages' own evaluations; a
    stage's memory is its peak plus the stash of its other micro-batches in flight; the forward
    activation's receive is Megatron's hand count b s h x 2 bytes / dp per device."""
    graph = build("tiny-gpt")
    cluster = Cluster.parse("2x4")
    config = megatron_config("tp=2,dp=2,pp=2", cluster)
    k = 4
    plan = pipeline_baseline(graph, cluster, config, TrainingConfig(k, "full"))
    ev = evaluate_pipeline(graph, plan)
    assert ev.errors == []
    t = [s.evaluation.micro_batch_time_s for s in ev.stages]
    u = [s.evaluation.once_per_step_time_s + s.once_comm_s for s in ev.stages]
    assert ev.iteration_time_s == pytest.approx(sum(t) + (k - 1) * max(t) + max(u))
    for s in ev.stages:
        assert s.in_flight == min(2 - s.stage, k)
        assert s.memory_bytes == pytest.approx(
            s.evaluation.memory.total + (s.in_flight - 1) * s.stash_bytes + s.extra_bytes
        )
        assert s.stash_bytes > 0
    cfg = graph.meta["config"]
    hand = cfg["batch"] * cfg["seq"] * cfg["hidden"] * DTYPE_BYTES["float16"] / 2  # / dp
    link = cluster.device
    receive = hand / link.inter_node_bandwidth + link.inter_node_latency
    assert ev.stages[1].receive_time_s == pytest.approx(receive, rel=1e-9)
    # the JSON form round-trips and re-checks to the same iteration
    again = PipelinePlan.from_dict(plan.to_dict())
    assert evaluate_pipeline(graph, again).iteration_time_s == pytest.approx(ev.iteration_time_s)
    assert math.isclose(plan.iteration_time_s, ev.iteration_time_s)


def test_the_command_line_prices_megatron_ptd_p_and_re_checks_it_at_another_k(tmp_path, capsys):
    from autopar.cli.main import main

    out = tmp_path / "meg.json"
    argv = ["baseline", "megatron", "tiny-gpt", "--cluster", "2x4", "--micro-batches", "4"]
    named = "tp=2,dp=2,pp=2,vpp=1,sp=off,recompute=full,optimizer=ddp"
    assert main([*argv, "--megatron-config", named, "--out", str(out)]) == 0
    written = PipelinePlan.from_json(out.read_text())
    assert written.counts == (1, 1) and written.source == "baseline:megatron"
    assert "tp=2, dp=2, pp=2, recompute=full, DDP" in capsys.readouterr().out
    assert main(["evaluate", "tiny-gpt", str(out), "--micro-batches", "8", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    graph = build("tiny-gpt")
    staged = PipelinePlan.from_json(out.read_text())
    staged.training = TrainingConfig(8, "full")
    for p in staged.stages:
        p.training = TrainingConfig(8, "full")
    assert again["errors"] == []
    assert again["iteration_time_s"] == pytest.approx(evaluate_pipeline(graph, staged).iteration_time_s)
    assert again["iteration_time_s"] > written.iteration_time_s  # 8 micro-batches, not 4


def test_a_checkpointed_middle_stage_stashes_its_block_input_per_micro_batch():
    """With every block recomputed, a micro-batch in flight on a middle stage keeps what its
    block reads from outside: the stage's input [b, s, h] and the attention mask (Chen et al.
    2016; Narayanan et al. 2021 sec. 3.5: one input activation per stage per micro-batch)."""
    graph = build("tiny-gpt", layers=4)
    cluster = Cluster.parse("4x2")
    plan = pipeline_baseline(
        graph, cluster, megatron_config("tp=2,dp=1,pp=4", cluster), TrainingConfig(8, "full")
    )
    ev = evaluate_pipeline(graph, plan)
    cfg = graph.meta["config"]
    block_input = cfg["batch"] * cfg["seq"] * cfg["hidden"] * DTYPE_BYTES["float16"]  # dp = 1: whole
    mask = graph.tensors["attention_bias/out"].nbytes
    for middle in ev.stages[1:3]:
        assert middle.stash_bytes == block_input + mask
    assert [s.in_flight for s in ev.stages] == [4, 3, 2, 1]


def test_a_schedule_repriced_is_what_the_re_check_gives_it():
    """``rescheduled`` prices the stages of one evaluation under another interleaving exactly as
    evaluate_pipeline does the plan with those virtual stages; an uneven cut is refused a v
    that does not divide every stage's blocks (not only the smallest)."""
    import dataclasses

    from autopar.pipeline.evaluate import rescheduled

    graph = build("tiny-gpt", layers=8)
    cluster = Cluster.parse("2x4")
    config = megatron_config("tp=2,dp=2,pp=2", cluster)
    k = 4
    plan = pipeline_baseline(graph, cluster, config, TrainingConfig(k, "full"))
    ev = evaluate_pipeline(graph, plan)
    assert ev.errors == [] and plan.virtual_stages == 1
    for v in (2, 4):
        again = evaluate_pipeline(graph, dataclasses.replace(plan, virtual_stages=v))
        quick = rescheduled(ev, plan.counts, k, v, None)
        assert quick.errors == again.errors == []
        assert quick.iteration_time_s == pytest.approx(again.iteration_time_s, rel=1e-12)
        assert [s.memory_bytes for s in quick.stages] == pytest.approx([s.memory_bytes for s in again.stages])
        assert [s.in_flight for s in quick.stages] == [s.in_flight for s in again.stages]
    assert ev.stages[0].in_flight == 2  # the evaluation itself is left as it was
    refused = rescheduled(ev, (4, 6), k, 4, None)  # the smallest stage divides; the other not
    assert refused.errors and "does not divide the 6 layers" in refused.errors[0]
