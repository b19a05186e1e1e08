"""Pricing one baseline configuration: a PTD-P pipeline or one mesh, evaluated.

What ``autopar plan --compare`` (``solver/cli.py``), the suites in ``benchmarks/`` and
:mod:`autopar.baselines.search` price each configuration with::

    BaselineConfig (autopar.baselines.configs)
          │  its recomputation -> the iteration priced (config_training)
          │  pipeline > 1: autopar.baselines.megatron.pipeline.pipeline_baseline (equal stages,
          │                1F1B or interleaved 1F1B)
          │  pipeline = 1: autopar.baselines.plans.baseline_plan on Mesh(cluster, mesh_shape),
          │                evaluated (kept in a cache folder when one is given)
          v
    Plan | PipelinePlan                    iteration_time_s, achieved_iteration_time_s,
                                           memory_per_device_bytes

A :class:`~autopar.baselines.walks.WalkMemo` keeps each layout the walk built, so the same
layout priced at another recomputation, K or interleaving is evaluated, not walked again.
"""

from __future__ import annotations

import os
from pathlib import Path

from autopar.baselines.configs import BaselineConfig
from autopar.baselines.megatron.configs import recompute_blocks, selective_groups
from autopar.baselines.megatron.pipeline import pipeline_baseline
from autopar.baselines.walks import WalkMemo
from autopar.cost.evaluate import attach_evaluation, evaluate
from autopar.cost.iteration import baseline_training, candidate_blocks
from autopar.cost.model_version import COST_MODEL_VERSION, evaluation_digest, model_digest
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.blocks import group_unit
from autopar.ir.content_key import content_key
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.split import ordered_blocks

__all__ = ["baseline_evaluated", "config_training", "price_baseline_config"]


def config_training(config: BaselineConfig, training: TrainingConfig, graph: Graph) -> TrainingConfig:
    """The iteration ``config`` is priced for: the request's K, with the configuration's
    recomputation (``none`` -> ``off``; ``selective``, ``full``; ``full:N`` -> the blocks
    Megatron-LM's block method recomputes, :func:`autopar.baselines.megatron.configs.recompute_blocks`),
    or, when the configuration names none, the system's default for the request
    (:func:`autopar.cost.iteration.baseline_training`)."""
    k = training.micro_batches
    mode = config.recompute
    if not mode:
        return baseline_training(config.kind, training)
    if mode == "none":
        return TrainingConfig(k, "off")
    if mode in ("selective", "full"):
        return TrainingConfig(k, mode)
    if mode.startswith("selective:"):
        groups = selective_groups(mode)
        blocks = candidate_blocks(graph)
        return TrainingConfig(k, "auto", tuple(group_unit(b, g) for b in blocks for g in groups))
    per_chunk = int(mode.split(":", 1)[1])
    units = recompute_blocks(ordered_blocks(graph), config.pipeline, config.virtual_stages, per_chunk)
    return TrainingConfig(k, "auto", units)


def price_baseline_config(
    graph: Graph,
    cluster: Cluster,
    config: BaselineConfig,
    training: TrainingConfig,
    cache: Path | None = None,
    walks: WalkMemo | None = None,
) -> Plan | PipelinePlan:
    """``config`` (a :class:`~autopar.baselines.configs.BaselineConfig` of ``graph`` on
    ``cluster``) built as its system runs it and evaluated by autopar's cost model.

    * ``config.pipeline > 1``: Megatron-LM's PTD-P, ``config.pipeline`` equal stages each on
      ``config.mesh_shape`` under 1F1B, interleaved with ``config.virtual_stages`` chunks
      per device (:func:`autopar.baselines.megatron.pipeline.pipeline_baseline`); not cached.
    * ``config.pipeline == 1``: ``config.kind``'s layout on the one mesh
      ``Mesh(cluster, config.mesh_shape)`` (:func:`baseline_evaluated`), kept in ``cache``
      (a folder; None: not kept).

    ``training``: the request's K (its checkpointing is replaced by the configuration's,
    :func:`config_training`).  Returns the evaluated plan: its ``iteration_time_s``
    (seconds per optimizer step of K micro-batches), ``achieved_iteration_time_s`` (as the
    runtime runs it) and ``memory_per_device_bytes`` (bytes, the largest stage for a
    pipeline).  Over the memory budget is reported, not refused; an
    :class:`~autopar.errors.AutoparError` (a degree the graph's shapes or blocks cannot split)
    propagates, for :func:`~autopar.baselines.configs.best_config` to record."""
    training = config_training(config, training, graph)
    if config.pipeline > 1:
        return pipeline_baseline(graph, cluster, config, training, walks=walks)
    mesh = Mesh(cluster, config.mesh_shape)
    return baseline_evaluated(
        config.kind,
        graph,
        mesh,
        config.zero_stage,
        cache,
        config.runtime,
        training,
        sequence_parallel=config.sequence_parallel,
        walks=walks,
    )


def baseline_evaluated(
    kind: str,
    graph: Graph,
    mesh: Mesh,
    zero_stage: int,
    cache: Path | None,
    runtime: str,
    training: TrainingConfig | None = None,
    *,
    sequence_parallel: bool = False,
    walks: WalkMemo | None = None,
) -> Plan:
    """The ``kind`` baseline of ``graph`` on ``mesh``, evaluated; kept in ``cache`` (a folder)
    under a key of the graph's content, the mesh and cluster, the ZeRO stage, the runtime
    profile, sequence parallelism, the iteration priced and the versions of autopar and its
    cost model, so it is evaluated once.  ``training``: the plan's K and checkpointing
    (default: the system's own, :func:`autopar.cost.iteration.baseline_training`)."""
    from autopar.version import __version__ as autopar_version

    training = training or baseline_training(kind, TrainingConfig())
    key = content_key(
        {
            "baseline": kind,
            "graph": graph.content_hash(),
            "mesh": mesh.key(),
            "zero_stage": zero_stage,
            "runtime": runtime,
            "boxing": "as the runtime runs it",
            **({"sequence_parallel": True} if sequence_parallel else {}),
            **({} if training.is_default else {"training": training.to_dict()}),
            "versions": {
                "autopar": autopar_version,
                "cost_model": COST_MODEL_VERSION,
                "model": model_digest(),
                "evaluation": evaluation_digest(),
            },
        }
    )[:32]
    path = cache / f"{key}.json" if cache is not None else None
    if path is not None and path.exists():
        try:
            return Plan.load(str(path))
        except Exception:  # a damaged entry is recomputed
            path.unlink(missing_ok=True)
    walks = walks or WalkMemo()
    b = walks.plan(kind, graph, mesh, zero_stage, runtime, sequence_parallel)
    b.training = training
    attach_evaluation(b, evaluate(graph, b))
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            b.save(str(tmp))
            tmp.replace(path)
        except OSError:
            pass  # an unwritable cache only costs the next run the evaluation
    return b
