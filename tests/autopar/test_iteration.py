"""The training iteration: K micro-batches per step and activation checkpointing."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from autopar.baselines.plans import baseline_plan
from autopar.cost.activation_spans import activation_spans
from autopar.cost.build_tables import build_cost_tables
from autopar.cost.evaluate import evaluate
from autopar.cost.iteration import checkpoint_blocks
from autopar.cost.memory import activation_intervals
from autopar.cost.weighted_tables import table_costs, with_training
from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Role
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig
from autopar.models import build

MESH = Mesh(Cluster.parse("1x4"), (2, 2))


@pytest.mark.parametrize(
    ("k", "mode", "code"),
    [
        (0, "off", "bad_micro_batches"),
        (True, "off", "bad_micro_batches"),
        (2.0, "off", "bad_micro_batches"),
        (1, "some", "bad_checkpointing"),
    ],
)
def test_bad_configurations_name_the_value(k: object, mode: str, code: str) -> None:
    with pytest.raises(ConfigError) as err:
        TrainingConfig(k, mode)  # type: ignore[arg-type]
    assert err.value.code == code and repr(k if code == "bad_micro_batches" else mode) in str(err.value)
    assert isinstance(err.value, ValueError)


def test_iteration_is_k_micro_batches_plus_what_runs_once_per_step() -> None:
    g = build("tiny-mt5")
    plan = baseline_plan("data-parallel", g, MESH, 2)
    one = evaluate(g, plan)
    assert one.iteration_time_s == one.step_time_s  # K = 1, off: today's step, exactly
    assert one.micro_batch_time_s + one.once_per_step_time_s == pytest.approx(one.step_time_s)
    for k in (8, 32):
        ev = evaluate(g, plan, training=TrainingConfig(k))
        assert ev.step_time_s == one.step_time_s
        assert ev.micro_batch_time_s == pytest.approx(one.micro_batch_time_s)
        assert ev.iteration_time_s == pytest.approx(k * one.micro_batch_time_s + one.once_per_step_time_s)
        # the reduction overlaps the last micro-batch's backward only
        assert ev.iteration_time_s - ev.iteration_time_overlapped_s == pytest.approx(
            one.step_time_s - one.step_time_overlapped_s
        )


def test_oneflow_keeps_a_full_size_accumulation_buffer_under_zero_2_and_ideal_does_not() -> None:
    g = build("tiny-mt5")
    plan = baseline_plan("data-parallel", g, MESH, 2)
    one = evaluate(g, plan)
    eight = evaluate(g, plan, training=TrainingConfig(8))
    # the acc op holds the partial gradient, full size over the data-parallel axes
    assert eight.accumulation_bytes > 0
    assert eight.memory.grads == pytest.approx(one.memory.grads + eight.accumulation_bytes)
    stage0 = evaluate(g, baseline_plan("data-parallel", g, MESH, 0), training=TrainingConfig(8))
    assert stage0.accumulation_bytes == 0  # ZeRO-0 keeps the full gradient anyway
    ideal = dataclasses.replace(plan, runtime="ideal")
    assert evaluate(g, ideal, training=TrainingConfig(8)).accumulation_bytes == 0


def test_full_checkpointing_recomputes_every_block_and_keeps_less_alive() -> None:
    g = build("tiny-gpt")
    blocks = checkpoint_blocks(g, TrainingConfig(1, "full"))
    assert blocks and all(any(part.isdigit() for part in b.split(".")) for b in blocks)
    plan = baseline_plan("megatron", g, MESH, 2)
    off = evaluate(g, plan)
    full = evaluate(g, plan, training=TrainingConfig(1, "full"))
    assert full.recompute_time_s > 0
    forward = sum(o.compute_s for o in off.ops if g.op_by_name[o.name].role is Role.FORWARD)
    assert full.recompute_time_s < forward + off.comm_time_s
    assert full.iteration_time_s == pytest.approx(off.iteration_time_s + full.recompute_time_s)
    assert full.memory.activations < off.memory.activations
    # every span lies within the tensor's unchecked liveness
    intervals = activation_intervals(g)
    for tensor, start, end in activation_spans(g, TrainingConfig(1, "full")):
        assert intervals[tensor][0] <= start <= end


def test_auto_prices_the_blocks_the_plan_records() -> None:
    g = build("tiny-gpt")
    blocks = sorted(checkpoint_blocks(g, TrainingConfig(1, "full")))
    assert checkpoint_blocks(g, TrainingConfig(1, "auto")) == frozenset()
    chosen = TrainingConfig(2, "auto", (blocks[-1], blocks[0], blocks[0]))
    assert chosen.recomputed == (blocks[0], blocks[-1])  # sorted, once each
    assert checkpoint_blocks(g, chosen) == frozenset(chosen.recomputed)
    plan = baseline_plan("megatron", g, MESH, 2)
    off, full = (evaluate(g, plan, training=TrainingConfig(2, m)) for m in ("off", "full"))
    every = evaluate(g, plan, training=TrainingConfig(2, "auto", tuple(blocks)))
    assert every.iteration_time_s == pytest.approx(full.iteration_time_s)
    assert every.memory.activations == pytest.approx(full.memory.activations)
    some = evaluate(g, plan, training=TrainingConfig(2, "auto", (blocks[0],)))
    assert off.iteration_time_s < some.iteration_time_s < full.iteration_time_s
    # re-priced at another K, auto keeps the recorded blocks; another mode drops them
    assert chosen.repriced(8, None) == TrainingConfig(8, "auto", chosen.recomputed)
    assert chosen.repriced(None, "full") == TrainingConfig(2, "full")
    with pytest.raises(ConfigError, match="auto"):
        TrainingConfig(1, "full", (blocks[0],))


def test_the_tables_price_the_same_iteration_as_the_evaluator() -> None:
    g = build("tiny-mt5")
    # a plan of OneFlow's rules, which the tables hold (megatron's has Megatron-LM's own)
    plan = baseline_plan("inferred", g, MESH, 2)
    tables = build_cost_tables(g, MESH, 2)
    training = TrainingConfig(8, "full")
    nodes, edges = table_costs(with_training(tables, training), training)
    order = g.topological_order
    index = {op.name: i for i, op in enumerate(order)}
    choice = [tables.ops[op.name].signatures.index(plan.signatures[op.name]) for op in order]
    total = sum(float(n[c]) for n, c in zip(nodes, choice))
    total += sum(float(m[choice[u], choice[v]]) for u, v, m in edges)
    ev = evaluate(g, plan, training=training)
    assert total == pytest.approx(ev.per_edge_iteration_time_s, rel=1e-9)  # the tables price each edge
    # the default returns the tables' own arrays
    same_nodes, _ = table_costs(tables, TrainingConfig())
    assert all(a is tables.ops[op.name].compute_s for a, op in zip(same_nodes, order))
    assert index  # the order is the tables' topological order


def test_the_plan_records_its_training_configuration() -> None:
    g = build("tiny-gpt")
    plan = Plan.from_assignment(
        g, MESH, 2, baseline_plan("megatron", g, MESH, 2).signatures, training=TrainingConfig(8, "full")
    )
    data = plan.to_dict()
    assert (data["micro_batches"], data["checkpointing"]) == (8, "full")
    back = Plan.from_dict(data)
    assert back.training == TrainingConfig(8, "full")
    assert np.isfinite(evaluate(g, back).iteration_time_s)
    assert "recomputed_blocks" not in data  # only a plan solved with auto records them
    plan.training = TrainingConfig(8, "auto", ("layers.1",))
    data = plan.to_dict()
    assert data["recomputed_blocks"] == ["layers.1"]
    assert Plan.from_dict(data).training == plan.training
    assert "recompute   whole in 1 block (layers.1)" in plan.summary()


# ------------------------------------------------------------------ closed forms, by hand

MESH_4 = Mesh(Cluster.parse("1x4"), (4,))
FP32_GRAD = 4
"""Bytes per element of the accumulated gradient: OneFlow's ``acc`` op sums the fp32 gradient
after the AMP cast (compiled K = 4 job, tests/oneflow/test_amp_gather.py); Megatron-LM's
``main_grad`` is fp32 (``--accumulate-allreduce-grads-in-fp32``, forced for bf16)."""


def _oneflow_shards(shape: tuple[int, ...], n: int, min_size: int) -> bool:
    """OneFlow 0.9 ZeRO shards a replicated variable over ``n`` ranks when its dim-0 shard
    keeps at least ``min_size`` elements (``IsSplitValid``: ``shape[0] / n`` rows, floored)."""
    rows = shape[0] // n
    return rows >= 1 and rows * math.prod(shape[1:]) >= min_size


@pytest.mark.parametrize(
    ("runtime", "min_size"),
    [("oneflow-0.9", 1024), ("oneflow-0.9-shard-min-1", 1), ("megatron-lm", 1), ("ideal", None)],
)
def test_accumulation_buffer_is_the_parameters_times_one_less_one_over_dp(
    runtime: str, min_size: int | None
) -> None:
    """Under ZeRO-2 with K > 1 a runtime that accumulates before reducing keeps the full-size
    gradient beside its 1/N shard: ``buffer = sum Psi_v x 4 x (1 - 1/N_dp)`` over the sharded
    variables (OneFlow: those of at least ``shard_min_size`` elements per shard; Megatron-LM:
    every one, its ``main_grad`` buffer), 0 where the runtime reduces every micro-batch
    into the shard (``ideal``, DeepSpeed) and under ZeRO-0/1 (the gradient is full-size)."""
    g = build("tiny-mt5")
    n = MESH_4.shape[0]
    hand = 0.0
    if min_size is not None:
        shapes = [g.tensors[v.tensor].shape for v in g.variables]
        hand = sum(math.prod(s) * FP32_GRAD * (1 - 1 / n) for s in shapes if _oneflow_shards(s, n, min_size))
    plan = baseline_plan("data-parallel", g, MESH_4, 2, runtime=runtime)
    assert evaluate(g, plan, training=TrainingConfig(8)).accumulation_bytes == pytest.approx(hand, rel=1e-9)
    assert evaluate(g, plan, training=TrainingConfig(1)).accumulation_bytes == 0  # K = 1: no buffer
    for stage in (0, 1):
        zero = baseline_plan("data-parallel", g, MESH_4, stage, runtime=runtime)
        assert evaluate(g, zero, training=TrainingConfig(8)).accumulation_bytes == 0


def test_full_checkpointing_keeps_each_block_input_and_one_blocks_internals() -> None:
    """Recomputing every block keeps each block's input (``b/dp x s x h x itemsize``) and,
    at the peak, one block's internals (its recompute): ``activations(L) = L x input + C``
    with ``C`` the same for every depth and at least one block's saved activations
    without checkpointing (Chen et al. 2016; Megatron-LM ``--recompute-granularity full``).
    Without gradient clipping and dropout: their pre-clip fp32 gradients and masks are other
    terms."""
    cfg = {"clip_grad_max_norm": None, "dropout": 0.0}
    full: dict[int, float] = {}
    off: dict[int, float] = {}
    for layers in (2, 3, 4):
        g = build("tiny-gpt", layers=layers, **cfg)
        plan = baseline_plan("data-parallel", g, MESH_4, 0, runtime="ideal")
        full[layers] = evaluate(g, plan, training=TrainingConfig(1, "full")).memory.activations
        off[layers] = evaluate(g, plan, training=TrainingConfig(1, "off")).memory.activations
    c = g.meta["config"]
    block_input = c["batch"] // MESH_4.shape[0] * c["seq"] * c["hidden"] * 2  # float16
    assert full[3] - full[2] == block_input
    assert full[4] - full[3] == block_input
    constant = full[2] - 2 * block_input
    assert full[4] - 4 * block_input == constant
    internals = off[3] - off[2]  # one more block without checkpointing: its saved activations
    assert internals > block_input
    assert constant >= internals
