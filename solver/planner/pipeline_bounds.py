"""A proven lower bound on a pipeline's iteration that includes the bubble.

Under 1F1B a pipeline of stages ``s`` with per-micro-batch times ``t_s`` and once-per-step
work ``u_s`` runs ``F = sum_s t_s + (K - 1) max_s t_s + max_s u_s``
(:func:`autopar.pipeline.schedule.one_f_one_b_iteration`).  Each stage's solve proves
``LB_s <= K t_s + u_s`` for every plan of the stage; a second, cheaper relaxation proves
``tau_s <= t_s`` (:func:`micro_batch_bound`: the stage's problem with only its per-micro-batch
costs, every op and edge at the cost one micro-batch adds).  Then for every stage ``s*``::

    F >= t_s* + (K - 1) t_s* + u_s* + sum_{s != s*} t_s  >=  LB_s* + sum_{s != s*} tau_s

and with ``u >= 0``, ``F >= sum_s tau_s + (K - 1) max_s tau_s``; the larger of these
(:func:`pipeline_bound`) bounds every plan with these stages, so the gap against it is a real
gap, the bubble included (the old bound, ``max_s LB_s``, left it out: a 24-layer GPT in two
stages reported 11.08 % against a bubble of 10.97 %).

Before any stage is solved, :func:`stage_count_bound` bounds every pipeline of ``S`` stages,
whatever the cut: what ``--stages auto`` orders and prunes the numbers of stages by.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autopar.cost.tables import CostTables
from autopar.cost.weighted_tables import with_training
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline
from autopar.infra.store import KeyValueStore
from autopar.ir.graph import Graph
from autopar.ir.training import TrainingConfig
from autopar.pipeline.split import ordered_blocks
from autopar_solver.bounds import DiffusionBound, LayoutCut
from autopar_solver.options import SolverOptions
from autopar_solver.planner.memory_rows import build_problem
from autopar_solver.planner.pipeline_cuts import virtual_stage_choices
from autopar_solver.problem import Problem, trivial_bound

__all__ = ["MICRO_BOUND_SWEEPS", "micro_batch_bound", "pipeline_bound", "schedule_bound", "stage_count_bound"]

MICRO_BOUND_SWEEPS = 15
"""TRW-S sweeps of a stage's per-micro-batch bound (most of what many more reach: mt5-base
[4, 2] reaches 97 % of its 45-sweep bound in 15, :mod:`.shape_bounds`)."""


def micro_batch_bound(
    tables: CostTables, training: TrainingConfig, deadline: Deadline, deterministic: bool = False
) -> float:
    """A lower bound on one micro-batch's time of every plan of ``tables``' stage, seconds:
    the problem whose costs are what one more micro-batch adds (the iteration's costs at
    ``K = 2`` less those at ``K = 1``: the iteration is linear in ``K``), without memory rows,
    every block kept (recomputing only adds time); the larger of its trivial bound and a
    TRW-S bound after :data:`MICRO_BOUND_SWEEPS` sweeps (fewer when ``deadline`` comes first)."""
    one = build_problem(with_training(tables, _at(training, 1)), None).problem
    two = build_problem(with_training(tables, _at(training, 2)), None).problem
    problem = Problem(
        node_names=list(one.node_names),
        node_costs=[_added(b, a) for a, b in zip(one.node_costs, two.node_costs)],
        edges=[(u, v, _added(m2, m1)) for (u, v, m1), (_, _, m2) in zip(one.edges, two.edges)],
        memory_rows=[],
        budget_bytes=None,
    )
    bound = trivial_bound(problem)
    if not deterministic and deadline.expired():
        return bound
    try:
        run = DiffusionBound(problem, deadline=math.inf if deterministic else deadline.at)
    except LayoutCut:
        return bound
    return max(bound, run.run(MICRO_BOUND_SWEEPS, math.inf if deterministic else deadline.at))


def _at(training: TrainingConfig, k: int) -> TrainingConfig:
    """``training`` at ``K = k``, every block kept under ``auto`` (the relaxation's)."""
    mode = "off" if training.checkpointing == "auto" else training.checkpointing
    return TrainingConfig(k, mode)


def _added(at_two: np.ndarray, at_one: np.ndarray) -> np.ndarray:
    """What one micro-batch adds to each cost: ``at_two - at_one``, ``inf`` where forbidden."""
    out = np.where(np.isfinite(at_two), at_two - np.where(np.isfinite(at_one), at_one, 0.0), np.inf)
    return np.maximum(out, 0.0)


def pipeline_bound(stage_bounds: Sequence[float], micro_bounds: Sequence[float], k: int) -> float:
    """The lower bound of the module docstring, seconds: the larger of
    ``max_s* (LB_s* + sum_{s != s*} tau_s)`` and ``sum_s tau_s + (K - 1) max_s tau_s``."""
    if not stage_bounds:
        return 0.0
    total = math.fsum(micro_bounds)
    through_one = max(lb + total - tau for lb, tau in zip(stage_bounds, micro_bounds, strict=True))
    bubble = total + (k - 1) * max(micro_bounds)
    return max(through_one, bubble)


def schedule_bound(stage_bounds: Sequence[float], micro_bounds: Sequence[float], k: int, v: int) -> float:
    """A lower bound on the iteration of every plan with these stages under ``v`` chunks per
    device, seconds: :func:`pipeline_bound` under 1F1B; under interleaved 1F1B
    (:func:`autopar.pipeline.schedule.interleaved_iteration`, ``F = (K + (S - 1) / v) busy +
    max_s u_s`` with ``busy >= t_s`` for every stage) the larger of
    ``max_s (LB_s + (S - 1) tau_s / v)`` and ``(K + (S - 1) / v) max_s tau_s``."""
    if v == 1 or not stage_bounds:
        return pipeline_bound(stage_bounds, micro_bounds, k)
    lag = (len(stage_bounds) - 1) / v
    through_one = max(lb + lag * tau for lb, tau in zip(stage_bounds, micro_bounds, strict=True))
    return max(through_one, (k + lag) * max(micro_bounds))


def stage_count_bound(
    graph: Graph,
    cluster: Cluster,
    stages: int,
    shape: tuple[int, ...],
    zero_stage: int,
    options: SolverOptions,
    store: KeyValueStore,
    deadline: Deadline,
) -> float:
    """A lower bound on the iteration of every pipeline of ``graph`` in ``stages`` stages of
    ``shape`` (any cut, any schedule the search may choose), seconds: ``(K + (S - 1) / v) tau / S``
    where ``tau`` bounds one micro-batch of the whole graph on one stage's devices
    (:func:`micro_batch_bound`: the stages' micro-batch times sum to at least that, their
    slowest to at least ``1 / S`` of it; under 1F1B ``F >= sum_s t_s + (K - 1) max_s t_s``, under
    interleaved 1F1B ``F >= (K + (S - 1) / v) max_s t_s``) and ``v`` the most chunks per device
    the runtime and ``K`` allow (:func:`.pipeline_cuts.virtual_stage_choices`; 1: 1F1B,
    ``(1 + (K - 1) / S) tau``)."""
    from autopar.cost.build_tables import build_cost_tables
    from autopar.pipeline.evaluate import stage_cluster

    tables = build_cost_tables(
        graph,
        Mesh(stage_cluster(cluster, stages), shape),
        zero_stage,
        store=store,
        workers=options.workers,
        runtime=options.runtime,
        deadline=deadline,
    )
    tau = micro_batch_bound(tables, options.training, deadline, options.deterministic)
    k = options.micro_batches
    v = max(virtual_stage_choices(options.runtime, stages, k, len(ordered_blocks(graph))))
    return (k + (stages - 1) / v) * tau / stages
