"""The cut search's dynamic program (autopar_solver.planner.pipeline_cuts) on hand-made
per-block costs: it finds the cut of least predicted iteration within the budget (checked
against every cut), moves blocks off a heavy stage and out of a memory-bound one, and prices
interleaving where the runtime runs it."""

from __future__ import annotations

import itertools
import random

import pytest

from autopar.pipeline.schedule import interleaved_iteration
from autopar_solver.planner.pipeline_bounds import schedule_bound
from autopar_solver.planner.pipeline_cuts import (
    StageCosts,
    best_cut,
    cut_refusal,
    predict_cut,
    virtual_stage_choices,
)


def _uniform(stages: int, blocks: int, **own: list[float]) -> list[StageCosts]:
    """Blocks of 1 s per micro-batch, 0.1 s once per step, 1 byte of states and 1 byte of stash
    each; ``own`` per stage (``time``, ``memory`` ...), 0 where not given."""
    return [
        StageCosts(
            (1.0,) * blocks,
            (0.1,) * blocks,
            (1.0,) * blocks,
            (1.0,) * blocks,
            **{name: values[s] for name, values in own.items()},
        )
        for s in range(stages)
    ]


def test_a_heavy_last_stage_gives_blocks_away():
    """The head costs the last stage 1.5 s per micro-batch besides its blocks: the even cut
    (2, 2, 2, 2) runs at its pace, 3.5 s; one block less there (and one more on a middle stage)
    makes the slowest 3 s."""
    costs = _uniform(4, 8, time=[0.0, 0.0, 0.0, 1.5])
    even = predict_cut(costs, (2, 2, 2, 2), k=8)
    assert even.iteration_s == pytest.approx(9.5 + 7 * 3.5 + 0.2)
    got = best_cut(costs, k=8)
    assert got is not None and got.counts[-1] == 1 and sum(got.counts) == 8
    assert max(got.micro_batch_s) == pytest.approx(3.0)
    assert got.iteration_s == pytest.approx(9.5 + 7 * 3.0 + 0.3)  # sum t; K - 1 slowest; max u


def test_a_memory_bound_first_stage_holds_fewer_blocks():
    """Stage s keeps min(S - s, K) micro-batches' stash: with 1 byte of states and 1 of stash per
    block, the even cut needs 2 + 4 x 2 = 10 bytes on the first stage, over a budget of 8; the
    cut that fits gives it one block and the last stage (one micro-batch in flight) the most."""
    costs = _uniform(4, 8)
    assert max(predict_cut(costs, (2, 2, 2, 2), k=8).memory_bytes) == pytest.approx(10.0)
    got = best_cut(costs, k=8, budget=8.0)
    assert got is not None and got.counts == (1, 2, 2, 3)
    assert max(got.memory_bytes) <= 8.0
    assert best_cut(costs, k=8, budget=4.0) is None  # one block and 4 in flight: 5 bytes


def _cuts(blocks: int, stages: int, v: int) -> list[tuple[int, ...]]:
    out = []
    for inner in itertools.combinations(range(1, blocks // v), stages - 1):
        edges = (0, *inner, blocks // v)
        out.append(tuple(v * (edges[i + 1] - edges[i]) for i in range(stages)))
    return out


def _random_stage(rng: random.Random, blocks: int) -> StageCosts:
    def draw(lo: float, hi: float) -> tuple[float, ...]:
        return tuple(rng.uniform(lo, hi) for _ in range(blocks))

    own = (rng.uniform(0, 3) for _ in range(5))
    return StageCosts(draw(0.5, 2), draw(0, 1), draw(0, 3), draw(0, 2), *own)


def test_the_program_finds_the_best_of_every_cut():
    """On random costs (uneven blocks, stages, budgets, schedules) the dynamic program's cut is
    the least iteration over every cut that fits, as :func:`predict_cut` prices each."""
    rng = random.Random(42)
    for _ in range(150):
        blocks, stages = rng.randint(2, 9), rng.randint(1, 4)
        stages = min(stages, blocks)
        k, v = rng.randint(1, 9), (rng.choice([1, 2]) if stages > 1 else 1)

        costs = [_random_stage(rng, blocks) for _ in range(stages)]
        budget = rng.choice([None, rng.uniform(10, 40)])
        every = _cuts(blocks, stages, v) if blocks % v == 0 and blocks >= stages * v else []
        priced = [predict_cut(costs, c, k, v) for c in every]
        fits = [p for p in priced if budget is None or max(p.memory_bytes) <= budget]
        got = best_cut(costs, k, v, budget)
        if not fits:
            assert got is None
            continue
        assert got is not None
        assert got.iteration_s == pytest.approx(min(p.iteration_s for p in fits), rel=1e-12)


def test_interleaving_prices_the_bubble_over_v_and_its_sends():
    """Under v chunks per device the iteration is (K + (S - 1) / v) max_s (t_s + (v - 1) r_s)
    + max_s u_s (autopar.pipeline.schedule.interleaved_iteration), with stages of whole chunks."""
    costs = _uniform(4, 8, time=[0.05] * 4, send=[0.05] * 4)  # the receives: in t_s, and one more chunk's
    one = predict_cut(costs, (2, 2, 2, 2), k=8, v=1)
    two = predict_cut(costs, (2, 2, 2, 2), k=8, v=2)
    assert one.iteration_s == pytest.approx((8 + 3) * 2.05 + 0.2)
    assert two.iteration_s == pytest.approx((8 + 3 / 2) * (2.05 + 0.05) + 0.2)
    assert two.iteration_s < one.iteration_s  # the bubble dominates: 3 slots of 2.05 s against 1.5 of 2.1
    assert two.iteration_s == pytest.approx(interleaved_iteration([2.05] * 4, [0.2] * 4, [0.05] * 4, 8, 2))
    got = best_cut(costs, k=8, v=2)
    assert got is not None and got.counts == (2, 2, 2, 2)
    assert best_cut(costs, k=8, v=4) is None  # 4 stages of at least 4 blocks: 16 > 8
    assert cut_refusal((3, 1), 4, 2) is not None and cut_refusal((4, 2), 4, 2) is None


def test_only_a_runtime_that_interleaves_gets_chunks():
    assert virtual_stage_choices("megatron-lm", 4, 8, 24) == [1, 2, 4]  # 8 chunks: 32 blocks
    assert virtual_stage_choices("megatron-lm", 4, 6, 24) == [1]  # K = 6 not in groups of 4
    assert virtual_stage_choices("megatron-lm", 1, 8, 24) == [1]
    assert virtual_stage_choices("oneflow-0.9", 4, 8, 24) == [1]


def test_the_schedule_bound_is_below_every_schedule():
    """With each stage's bound LB_s = K t_s + u_s and tau_s = t_s (the tightest the solves can
    prove), the bound of every schedule is at most its iteration."""
    rng = random.Random(7)
    for _ in range(200):
        n, k = rng.randint(2, 6), rng.randint(1, 16)
        t = [rng.uniform(0.1, 2) for _ in range(n)]
        u = [rng.uniform(0, 1) for _ in range(n)]
        r = [rng.uniform(0, 0.2) for _ in range(n)]
        for v in (1, 2, 4):
            lbs = [k * ts + us for ts, us in zip(t, u)]
            assert schedule_bound(lbs, t, k, v) <= interleaved_iteration(t, u, r, k, v) * (1 + 1e-12)


def test_the_blocks_costs_add_up_to_the_evaluated_stages():
    """Split by block (autopar_solver.planner.pipeline_block_costs), a planned cut's costs give
    back its evaluated iteration and every stage's memory, under 1F1B and interleaved."""
    from autopar.baselines.megatron.configs import megatron_config
    from autopar.baselines.megatron.pipeline import pipeline_baseline
    from autopar.hardware.cluster import Cluster
    from autopar.ir.training import TrainingConfig
    from autopar.models import build
    from autopar.pipeline.evaluate import evaluate_pipeline, rescheduled, stage_link
    from autopar.pipeline.split import ordered_blocks, split_graph
    from autopar_solver.planner.pipeline_block_costs import stage_costs

    graph = build("tiny-gpt", layers=8, vocab=32768)
    cluster = Cluster.parse("2x4")
    plan = pipeline_baseline(
        graph, cluster, megatron_config("tp=2,dp=2,pp=2", cluster), TrainingConfig(4, "full")
    )
    slices = split_graph(graph, plan.counts, stage_link(cluster, 2).crosses_nodes)
    ev = evaluate_pipeline(graph, plan, slices=slices)
    costs = stage_costs(ordered_blocks(graph), slices, plan.stages, ev)
    assert all(c.block_time[0] > 0 and c.block_states[0] > 0 and c.block_stash[0] > 0 for c in costs)
    for v in (1, 2):
        want = rescheduled(ev, plan.counts, 4, v, None)
        got = predict_cut(costs, plan.counts, 4, v)
        assert got.iteration_s == pytest.approx(want.iteration_time_s, rel=1e-12)
        assert got.memory_bytes == pytest.approx([s.memory_bytes for s in want.stages], rel=1e-12)
    # the head's stage costs more besides its blocks: the cut moves a block off it
    assert costs[1].time > costs[0].time
    best = best_cut(costs, 4)
    assert best is not None and best.counts[1] < 4
