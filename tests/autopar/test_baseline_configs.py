"""Each reference system at the configuration its users run (autopar.baselines.configs), and
the Megatron-LM runtime that prices the megatron baseline."""

from __future__ import annotations

import math

import pytest

from autopar.baselines.configs import (
    MEGATRON_RUNTIME,
    BaselineConfig,
    best_config,
    candidate_configs,
    parse_config,
)
from autopar.baselines.plans import baseline_plan
from autopar.cost.evaluate import attach_evaluation, evaluate
from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig
from autopar.models import build

CLUSTER_32X8 = Cluster.parse("32x8", "a100-80g")


def test_megatron_configurations_keep_tensor_parallelism_inside_a_node():
    configs = candidate_configs("megatron", CLUSTER_32X8, zero_stage=2, runtime="oneflow-0.9")
    # Megatron-LM's rules: t in the divisors of 8 inside a node, d = 256 / t; DDP or the
    # distributed optimizer; priced as Megatron-LM runs, whatever the request's runtime
    assert {(c.tensor_parallel, c.data_parallel, c.zero_stage) for c in configs} == {
        (t, 256 // t, z) for t in (1, 2, 4, 8) for z in (0, 1)
    }
    assert all(c.runtime == MEGATRON_RUNTIME for c in configs)
    assert all(
        c.mesh_shape == ((256,) if c.tensor_parallel == 1 else (256 // c.tensor_parallel, c.tensor_parallel))
        for c in configs
    )
    # never the 64-way tensor parallelism across nodes that autopar's [4, 64] would give it
    assert max(c.tensor_parallel for c in configs) == 8


def test_data_parallel_is_zero_over_every_device_and_inferred_is_libai_dp_by_mp():
    (dp,) = candidate_configs("data-parallel", CLUSTER_32X8, 2, "oneflow-0.9")
    assert dp.mesh_shape == (256,) and dp.zero_stage == 2 and dp.runtime == "oneflow-0.9"
    inferred = candidate_configs("inferred", CLUSTER_32X8, 2, "oneflow-0.9")
    assert [c.mesh_shape for c in inferred] == [(256,), (128, 2), (64, 4), (32, 8)]


def test_a_named_megatron_configuration_is_parsed_in_its_users_words():
    c = parse_config("megatron", "tp=8,dp=32", CLUSTER_32X8)
    assert c == BaselineConfig("megatron", (32, 8), 0, MEGATRON_RUNTIME)
    assert c.describe() == "tp=8, dp=32, pp=1, DDP"
    d = parse_config("megatron", "tp=4, dp=64, optimizer=distributed", CLUSTER_32X8)
    assert d.mesh_shape == (64, 4) and d.zero_stage == 1 and "distributed optimizer" in d.describe()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tp=8,dp=16", "tp(8) * dp(16) * pp(1) != devices(256)"),
        ("tp=16,dp=16", "must divide the 8 devices of a node"),
        ("tp=8", "needs tp and dp"),
        ("tp=8,dp=32,sp=2", "unknown: sp"),
        ("tp=8,dp=32,pp=2", "tp(8) * dp(32) * pp(2) != devices(256)"),
        ("tp=1,dp=4,pp=64", "pp(64) must divide the 32 nodes"),
        ("tp=x,dp=32", "tp must be a positive integer"),
        ("tp=8,dp=32,optimizer=zero3", "unknown optimizer 'zero3'"),
        ("tp=8,tp=8,dp=32", "write tp=T,dp=D"),
    ],
)
def test_a_bad_megatron_configuration_says_what_is_wrong(text, says):
    with pytest.raises(ConfigError) as e:
        parse_config("megatron", text, CLUSTER_32X8)
    assert e.value.code == "bad_baseline_config"
    assert says in e.value.message


def test_megatron_pipelines_across_nodes_with_equal_stages_and_an_even_batch():
    # Megatron-LM's PTD-P: pp divides the nodes and the layers; dp = N / (t p) splits the batch
    configs = candidate_configs("megatron", CLUSTER_32X8, 2, "oneflow-0.9", batch=64, blocks=40)
    found = {(c.pipeline, c.tensor_parallel, c.data_parallel) for c in configs}
    assert found == {
        (p, t, 256 // (p * t))
        for p in (1, 2, 4, 8)  # divisors of the 32 nodes that divide 40 layers
        for t in (1, 2, 4, 8)
        if 64 % (256 // (p * t)) == 0
    }
    assert all(math.prod(c.mesh_shape) * c.pipeline == 256 for c in configs)
    named = parse_config("megatron", "tp=8,dp=16,pp=2,optimizer=distributed", CLUSTER_32X8)
    assert (named.pipeline, named.mesh_shape, named.zero_stage) == (2, (16, 8), 1)
    assert named.describe() == "tp=8, dp=16, pp=2, distributed optimizer"


def _priced(graph, cluster, config: BaselineConfig, training: TrainingConfig) -> Plan:
    mesh = Mesh(cluster, config.mesh_shape)
    p = baseline_plan(config.kind, graph, mesh, config.zero_stage, runtime=config.runtime)
    p.training = training
    return attach_evaluation(p, evaluate(graph, p))


def test_the_best_configuration_is_the_fastest_that_fits_and_every_one_is_listed():
    graph = build("tiny-gpt")
    cluster = Cluster.parse("2x4", "a100-40g")
    training = TrainingConfig(4, "full")
    configs = candidate_configs("megatron", cluster, 2, "oneflow-0.9")
    chosen, priced = best_config(configs, lambda c: _priced(graph, cluster, c, training), None)
    assert len(priced) == len(configs) and all(p.plan is not None for p in priced)
    times = [p.plan.iteration_time_s for p in priced if p.plan is not None]
    assert chosen.plan is not None and chosen.plan.iteration_time_s == min(times)
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
    configs = candidate_configs("megatron", cluster, 2, "megatron-lm")
    training = TrainingConfig(1, "full")
    chosen, priced = best_config(configs, lambda c: _priced(graph, cluster, c, training), None)
    refused = [p for p in priced if p.error is not None]
    assert refused and all(p.config.tensor_parallel == 8 for p in refused)
    assert all("12 attention heads" in (p.error or "") for p in refused)
    assert chosen.plan is not None and 12 % chosen.config.tensor_parallel == 0
    assert len(refused) < len(priced)
