"""Megatron-LM's sequence parallelism priced as Megatron-LM runs it (Korthikanti et al. 2022,
section 4.2.2; megatron/core/tensor_parallel/mappings.py): per layer and micro-batch, the
all-reduce of each tensor-parallel region becomes an all-gather before it and a
reduce-scatter after it, forward and backward; nothing else moves (no all-to-all), and a
norm's weight gradient reads the gradient the norm's input gradient reads, in one layout."""

from __future__ import annotations

from collections import Counter

import pytest

from autopar.baselines.megatron.configs import megatron_config
from autopar.baselines.pricing import price_baseline_config
from autopar.cost.evaluate import evaluate
from autopar.hardware.cluster import Cluster
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig
from autopar.models import build

CLUSTER = Cluster.parse("1x8", "a100-80g")


@pytest.fixture(scope="module")
def graph():
    return build("gpt-1.3b", layers=2)


def _collectives(graph, sp: str) -> tuple[Counter, float]:
    config = megatron_config(f"tp=8,sp={sp},recompute=none", CLUSTER)
    plan = price_baseline_config(graph, CLUSTER, config, TrainingConfig(1, "off"))
    assert isinstance(plan, Plan)
    ev = evaluate(graph, plan)
    assert ev.valid, ev.errors
    norm = graph.op_by_name["layers.1.mlp_norm.layer_norm"]
    hidden = graph.tensors[next(iter(norm.outputs.values()))].shape
    per_layer: Counter = Counter()
    for e in ev.edges:
        if e.consumer.startswith("layers.1.") and e.shape == hidden and e.per_micro_batch:
            per_layer.update(s.collective.value for s in e.steps)
    tp_comm = sum(ev.comm_time_s_per_collective.values())
    assert "all-to-all" not in ev.comm_time_s_per_collective
    return per_layer, tp_comm


def test_a_layer_gathers_and_scatters_its_hidden_state_four_times_each(graph) -> None:
    with_sp, sp_comm = _collectives(graph, "on")
    without, comm = _collectives(graph, "off")
    assert with_sp == Counter({"all-gather": 4, "reduce-scatter": 4})
    assert without == Counter({"all-reduce": 4})
    # an all-gather and a reduce-scatter move what one all-reduce does (ring: (n-1)/n each);
    # twice the collectives pay twice the latency (here about 1 %)
    assert comm * (1 - 1e-9) <= sp_comm <= comm * 1.03
