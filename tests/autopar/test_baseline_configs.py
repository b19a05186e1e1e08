"""Each reference system at the configuration its users run (autopar.baselines.configs,
autopar.baselines.megatron.configs, autopar.baselines.search), and the Megatron-LM runtime
that prices the megatron baseline."""

from __future__ import annotations

import math

import pytest

from autopar.baselines.configs import MEGATRON_RUNTIME, BaselineConfig, best_config, candidate_configs
from autopar.baselines.megatron.configs import (
    MegatronChoice,
    megatron_config,
    megatron_structures,
    parse_megatron_config,
    recompute_blocks,
)
from autopar.baselines.plans import baseline_plan
from autopar.baselines.pricing import config_training
from autopar.baselines.search import search_baseline
from autopar.cost.evaluate import attach_evaluation, evaluate
from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig
from autopar.models import build

CLUSTER_32X8 = Cluster.parse("32x8", "a100-80g")


def test_megatron_configurations_keep_tensor_parallelism_inside_a_node():
    configs = megatron_structures(CLUSTER_32X8, None, 0, 1, MegatronChoice())
    # Megatron-LM's rules: t in the divisors of 8 inside a node, d = 256 / t; DDP, the
    # distributed optimizer or Megatron-FSDP; sequence parallelism with t > 1; priced as
    # Megatron-LM runs
    assert {(c.tensor_parallel, c.data_parallel, c.zero_stage, c.sequence_parallel) for c in configs} == {
        (t, 256 // t, z, sp)
        for t in (1, 2, 4, 8)
        for z in (0, 1, 3)
        for sp in ((False,) if t == 1 else (False, True))
    }
    assert all(c.runtime == MEGATRON_RUNTIME and c.pipeline == 1 for c in configs)
    assert all(
        c.mesh_shape == ((256,) if c.tensor_parallel == 1 else (256 // c.tensor_parallel, c.tensor_parallel))
        for c in configs
    )
    # never the 64-way tensor parallelism across nodes that autopar's [4, 64] would give it
    assert max(c.tensor_parallel for c in configs) == 8


def test_data_parallel_is_zero_over_every_device_and_inferred_is_libai_dp_by_mp():
    flat, laid = candidate_configs("data-parallel", CLUSTER_32X8, 2, "oneflow-0.9")
    assert flat.mesh_shape == (256,) and flat.zero_stage == 2 and flat.runtime == "oneflow-0.9"
    assert laid.mesh_shape == (32, 8)  # as a user lays it over the nodes
    inferred = candidate_configs("inferred", CLUSTER_32X8, 2, "oneflow-0.9")
    assert [c.mesh_shape for c in inferred] == [(256,), (128, 2), (64, 4), (32, 8)]


def test_a_named_megatron_configuration_is_parsed_in_its_users_words():
    c = megatron_config("tp=8,dp=32", CLUSTER_32X8)
    assert c == BaselineConfig("megatron", (32, 8), 0, MEGATRON_RUNTIME, recompute="none")
    assert c.describe() == "tp=8, dp=32, pp=1, recompute=none, DDP"
    d = megatron_config("tp=4, dp=64, optimizer=distributed", CLUSTER_32X8)
    assert d.mesh_shape == (64, 4) and d.zero_stage == 1 and "distributed optimizer" in d.describe()
    every = megatron_config("tp=8,pp=8,dp=4,vpp=2,sp=on,recompute=full:3,optimizer=distributed", CLUSTER_32X8)
    assert (every.pipeline, every.virtual_stages, every.sequence_parallel, every.recompute) == (
        8,
        2,
        True,
        "full:3",
    )
    assert every.describe() == "tp=8, dp=4, pp=8, vpp=2, sp, recompute=full:3, distributed optimizer"
    # a partial configuration names what it fixes; the rest is searched
    assert parse_megatron_config("sp=on,recompute=selective", CLUSTER_32X8) == MegatronChoice(
        sp=True, recompute="selective"
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tp=8,dp=16", "tp(8) * dp(16) * pp(1) != devices(256)"),
        ("tp=16,dp=16", "must divide the 8 devices of a node"),
        ("tp=8,dp=32,zp=2", "unknown zp"),
        ("tp=8,dp=32,pp=2", "tp(8) * dp(32) * pp(2) != devices(256)"),
        ("tp=1,dp=4,pp=64", "pp(64) must divide the 32 nodes"),
        ("tp=x,dp=32", "tp must be a positive integer"),
        ("tp=8,dp=32,optimizer=zero3", "unknown optimizer 'zero3'"),
        ("tp=8,tp=8,dp=32", "write key=value pairs"),
        ("tp=1,sp=on", "needs tp > 1"),
        ("tp=8,sp=maybe", "sp must be on or off"),
        ("tp=8,recompute=some", "recompute must be none, selective, selective:M+M"),
        ("tp=8,pp=1,vpp=2", "it needs pp >= 2"),
    ],
)
def test_a_bad_megatron_configuration_says_what_is_wrong(text, says):
    with pytest.raises(ConfigError) as e:
        megatron_config(text, CLUSTER_32X8)
    assert e.value.code == "bad_baseline_config"
    assert says in e.value.message


def test_megatron_pipelines_across_nodes_with_equal_stages_interleaving_and_an_even_batch():
    # Megatron-LM's PTD-P: pp divides the nodes and the layers; dp = N / (t p) splits the
    # batch; vpp divides a stage's layers, with the micro-batches in groups of pp
    configs = megatron_structures(CLUSTER_32X8, 64, 40, 8, MegatronChoice(zero_stage=1, sp=False))
    found = {(c.pipeline, c.tensor_parallel, c.data_parallel) for c in configs}
    assert found == {
        (p, t, 256 // (p * t))
        for p in (1, 2, 4, 8)  # divisors of the 32 nodes that divide 40 layers
        for t in (1, 2, 4, 8)
        if 64 % (256 // (p * t)) == 0
    }
    assert all(math.prod(c.mesh_shape) * c.pipeline == 256 for c in configs)
    for c in configs:
        layers = 40 // c.pipeline
        assert c.virtual_stages == 1 or (
            c.pipeline >= 2 and layers % c.virtual_stages == 0 and 8 % c.pipeline == 0
        )
    assert {c.virtual_stages for c in configs if c.pipeline == 4} == {1, 2}  # 10 layers a stage, K = 8
    assert {c.virtual_stages for c in configs if c.pipeline == 8} == {1}  # K = 8 is one group of 8


def test_block_recomputation_takes_the_first_layers_of_every_chunk():
    blocks = [f"h.{i}" for i in range(12)]
    assert recompute_blocks(blocks, 1, 1, 2) == ("h.0", "h.1")
    assert recompute_blocks(blocks, 2, 1, 2) == ("h.0", "h.1", "h.6", "h.7")
    assert recompute_blocks(blocks, 2, 3, 1) == ("h.0", "h.2", "h.4", "h.6", "h.8", "h.10")
    g = build("tiny-gpt")
    config = megatron_config("tp=2,dp=2,recompute=full:1", Cluster.parse("1x4", "a100-40g"))
    training = config_training(config, TrainingConfig(4, "off"), g)
    assert training.checkpointing == "auto" and training.recomputed == ("layers.0",)
    selective = config_training(
        megatron_config("tp=2,recompute=selective", Cluster.parse("1x4")), training, g
    )
    assert selective == TrainingConfig(4, "selective")


def _priced(graph, cluster, config: BaselineConfig, training: TrainingConfig) -> Plan:
    mesh = Mesh(cluster, config.mesh_shape)
    p = baseline_plan(config.kind, graph, mesh, config.zero_stage, runtime=config.runtime)
    p.training = training
    return attach_evaluation(p, evaluate(graph, p))


def test_the_best_configuration_is_the_fastest_that_fits_and_every_one_is_listed():
    graph = build("tiny-gpt")
    cluster = Cluster.parse("2x4", "a100-40g")
    training = TrainingConfig(4, "full")
    configs = megatron_structures(cluster, None, 0, 4, MegatronChoice(sp=False))
    chosen, priced = best_config(configs, lambda c: _priced(graph, cluster, c, training), None)
    assert len(priced) == len(configs) and all(p.plan is not None for p in priced)
    times = [p.plan.achieved_iteration_time_s for p in priced if p.plan is not None]
    assert chosen.plan is not None and chosen.plan.achieved_iteration_time_s == min(times)
    # a budget under the fastest configuration's memory picks the fastest of those that fit
    budget = chosen.plan.memory_per_device_bytes * (1 - 1e-9)
    fitting, _ = best_config(configs, lambda c: _priced(graph, cluster, c, training), budget)
    assert fitting.plan is not None and fitting.plan.memory_per_device_bytes <= budget
    assert fitting.config != chosen.config
    # no configuration fits: the one needing least memory, flagged
    least, _ = best_config(configs, lambda c: _priced(graph, cluster, c, training), 1.0)
    assert not least.fits(1.0)
    mem = [p.plan.memory_per_device_bytes for p in priced if p.plan is not None]
    assert least.plan is not None and least.plan.memory_per_device_bytes == min(mem)


def test_the_search_recomputes_only_as_much_as_the_budget_asks():
    """Unconstrained, Megatron-LM recomputes nothing; under a budget between a layout's memory
    with and without recomputation, its least recomputation that fits is found, and every
    layout is priced without recomputation first."""
    graph = build("tiny-gpt", layers=4)
    cluster = Cluster.parse("1x4", "a100-40g")
    training = TrainingConfig(4, "off")
    free, priced = search_baseline(
        "megatron", graph, cluster, training, None, zero_stage=2, runtime="oneflow-0.9", named="tp=2,sp=off"
    )
    assert free.config.recompute == "none" and all(p.config.recompute == "none" for p in priced)
    none = free.plan
    assert none is not None
    full = search_baseline(
        "megatron",
        graph,
        cluster,
        training,
        None,
        zero_stage=2,
        runtime="oneflow-0.9",
        named=f"tp=2,sp=off,optimizer={'distributed' if free.config.zero_stage else 'ddp'},recompute=full",
    )[0].plan
    assert full is not None and full.memory_per_device_bytes < none.memory_per_device_bytes
    budget = (none.memory_per_device_bytes + full.memory_per_device_bytes) / 2
    fits, tried = search_baseline(
        "megatron", graph, cluster, training, budget, zero_stage=2, runtime="oneflow-0.9", named="tp=2,sp=off"
    )
    assert fits.fits(budget) and fits.config.recompute != "none"
    assert {p.config.recompute for p in tried} >= {"none", "selective", "full"}
    assert fits.plan is not None and fits.plan.achieved_iteration_time_s <= full.achieved_iteration_time_s
    faster_fitting = [p for p in tried if p.fits(budget) and p.plan is not None]
    assert fits.plan.achieved_iteration_time_s == min(
        p.plan.achieved_iteration_time_s for p in faster_fitting
    )


def test_megatron_lm_reduces_and_gathers_once_per_step_at_any_k():
    """Megatron-LM accumulates gradients in its main_grad buffer and reduces (DDP) or
    reduce-scatters and re-gathers (distributed optimizer) once per optimizer step: one
    micro-batch costs the same at every K and the once-per-step work does not grow with K,
    so iteration(K) = K x micro-batch + once-per-step exactly."""
    graph = build("tiny-gpt")
    cluster = Cluster.parse("2x4", "a100-40g")
    for zero in (0, 1):
        config = BaselineConfig("megatron", (4, 2), zero, MEGATRON_RUNTIME)
        one = _priced(graph, cluster, config, TrainingConfig(1, "full")).predicted
        eight = _priced(graph, cluster, config, TrainingConfig(8, "full")).predicted
        assert eight["micro_batch_time_s"] == pytest.approx(one["micro_batch_time_s"], rel=1e-12)
        assert eight["once_per_step_time_s"] == pytest.approx(one["once_per_step_time_s"], rel=1e-12)
        assert eight["iteration_time_s"] == pytest.approx(
            8 * one["micro_batch_time_s"] + one["once_per_step_time_s"], rel=1e-12
        )
        assert one["once_per_step_time_s"] > 0  # the gradient reduction is there, once
        # --overlap-grad-reduce and --overlap-param-gather hide part of it behind compute
        assert 0 < eight["hidden_comm_time_s"] <= one["once_per_step_time_s"]
        assert eight["achieved_iteration_time_s"] == pytest.approx(
            eight["iteration_time_s"] - eight["hidden_comm_time_s"], rel=1e-12
        )


def test_oneflow_zero2_regathers_every_micro_batch_where_megatron_lm_does_not():
    graph = build("tiny-gpt")
    cluster = Cluster.parse("2x4", "a100-40g")
    training = TrainingConfig(8, "full")
    oneflow = _priced(graph, cluster, BaselineConfig("megatron", (4, 2), 2, "oneflow-0.9"), training)
    megatron = _priced(graph, cluster, BaselineConfig("megatron", (4, 2), 1, MEGATRON_RUNTIME), training)
    # the same layout: OneFlow's ZeRO gather runs after its repeat op, once per micro-batch
    assert oneflow.predicted["micro_batch_time_s"] > megatron.predicted["micro_batch_time_s"]


def test_megatron_refuses_a_tensor_parallel_degree_that_does_not_divide_the_heads():
    """Megatron-LM divides the heads evenly over the tensor-parallel ranks
    (``divide(num_attention_heads, world_size)``, megatron/core/transformer/attention.py):
    12 heads on tp=8 is refused with the degrees that work, and the configuration search
    leaves that degree out and prices the rest."""
    graph = build("tiny-gpt", heads=12, hidden=96)
    cluster = Cluster.parse("1x8", "a100-40g")
    with pytest.raises(ConfigError) as info:
        baseline_plan("megatron", graph, Mesh(cluster, (1, 8)), 2, runtime="megatron-lm")
    assert info.value.code == "megatron_heads_split"
    assert "12" in info.value.message and "1, 2, 3, 4, 6, 12" in info.value.message
    chosen, priced = search_baseline(
        "megatron", graph, cluster, TrainingConfig(1, "off"), None, zero_stage=2, runtime="megatron-lm"
    )
    refused = [p for p in priced if p.error is not None]
    assert refused and all(p.config.tensor_parallel == 8 for p in refused)
    assert all("12 attention heads" in (p.error or "") for p in refused)
    assert chosen.plan is not None and 12 % chosen.config.tensor_parallel == 0
    assert len(refused) < len(priced)
