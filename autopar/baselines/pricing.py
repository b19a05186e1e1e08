"""Pricing one baseline configuration: a PTD-P pipeline or one mesh, evaluated.

What ``autopar plan --compare`` (``solver/cli.py``), ``benchmarks/pipeline_suite.py`` and
``benchmarks/scale_suite.py`` hand to :func:`autopar.baselines.configs.best_config` as its
``price``::

    BaselineConfig (autopar.baselines.configs)
          │  pipeline > 1: autopar.baselines.megatron.pipeline.pipeline_baseline (equal stages, 1F1B)
          │  pipeline = 1: autopar.baselines.plans.baseline_plan on Mesh(cluster, mesh_shape),
          │                evaluated (kept in a cache folder when one is given)
          v
    Plan | PipelinePlan                    iteration_time_s, memory_per_device_bytes

Its own module: :mod:`autopar.baselines.megatron.pipeline` imports :mod:`autopar.baselines.configs`.
"""

from __future__ import annotations

import os
from pathlib import Path

from autopar.baselines import plans as baselines
from autopar.baselines.configs import BaselineConfig
from autopar.baselines.megatron.pipeline import pipeline_baseline
from autopar.cost.evaluate import attach_evaluation, evaluate
from autopar.cost.iteration import baseline_training
from autopar.cost.model_version import COST_MODEL_VERSION, model_digest
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.content_key import content_key
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig
from autopar.pipeline.plan import PipelinePlan

__all__ = ["baseline_evaluated", "price_baseline_config"]


def price_baseline_config(
    graph: Graph,
    cluster: Cluster,
    config: BaselineConfig,
    training: TrainingConfig,
    cache: Path | None = None,
) -> Plan | PipelinePlan:
    """``config`` (a :class:`~autopar.baselines.configs.BaselineConfig` of ``graph`` on
    ``cluster``) built as its system runs it and evaluated by autopar's cost model.

    * ``config.pipeline > 1``: Megatron-LM's PTD-P, ``config.pipeline`` equal stages each on
      ``config.mesh_shape`` under 1F1B (:func:`autopar.baselines.megatron.pipeline.pipeline_baseline`;
      Narayanan et al. 2021); not cached.
    * ``config.pipeline == 1``: ``config.kind``'s layout on the one mesh
      ``Mesh(cluster, config.mesh_shape)`` (:func:`baseline_evaluated`), kept in ``cache``
      (a folder; None: not kept).

    ``training``: the request's K; the checkpointing becomes the one the real system runs
    (:func:`autopar.cost.iteration.baseline_training`: ``full`` for megatron and inferred when
    ``training`` has ``off`` or ``auto``).  Returns the evaluated plan: its
    ``iteration_time_s`` (seconds per optimizer step of K micro-batches) and
    ``memory_per_device_bytes`` (bytes, the largest stage for a pipeline); the printable
    configuration is ``config.describe()``.  Over the memory budget is reported, not refused;
    an :class:`~autopar.errors.AutoparError` (a degree the graph's shapes or blocks cannot
    split) propagates, for :func:`~autopar.baselines.configs.best_config` to record."""
    training = baseline_training(config.kind, training)
    if config.pipeline > 1:
        return pipeline_baseline(graph, cluster, config, training)
    mesh = Mesh(cluster, config.mesh_shape)
    return baseline_evaluated(config.kind, graph, mesh, config.zero_stage, cache, config.runtime, training)


def baseline_evaluated(
    kind: str,
    graph: Graph,
    mesh: Mesh,
    zero_stage: int,
    cache: Path | None,
    runtime: str,
    training: TrainingConfig | None = None,
) -> Plan:
    """The ``kind`` baseline of ``graph`` on ``mesh``, evaluated; kept in ``cache`` (a folder)
    under a key of the graph's content, the mesh and cluster, the ZeRO stage, the runtime
    profile, the iteration priced and the versions of autopar and its cost model, so it is
    evaluated once.  ``training``: the plan's K, with the checkpointing the real system
    uses (:func:`autopar.cost.iteration.baseline_training`)."""
    from autopar.version import __version__ as autopar_version

    training = baseline_training(kind, training or TrainingConfig())
    key = content_key(
        {
            "baseline": kind,
            "graph": graph.content_hash(),
            "mesh": mesh.key(),
            "zero_stage": zero_stage,
            "runtime": runtime,
            "boxing": "grouped by (tensor, layout)",
            **({} if training.is_default else {"training": training.to_dict()}),
            "versions": {
                "autopar": autopar_version,
                "cost_model": COST_MODEL_VERSION,
                "model": model_digest(),
            },
        }
    )[:32]
    path = cache / f"{key}.json" if cache is not None else None
    if path is not None and path.exists():
        try:
            return Plan.load(str(path))
        except Exception:  # a damaged entry is recomputed
            path.unlink(missing_ok=True)
    b = baselines.baseline_plan(kind, graph, mesh, zero_stage, runtime=runtime)  # by the module: patchable
    b.training = training
    attach_evaluation(
        b, evaluate(graph, b)
    )  # one boxing per (tensor, layout), as runtimes run it
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            b.save(str(tmp))
            tmp.replace(path)
        except OSError:
            pass  # an unwritable cache only costs the next run the evaluation
    return b
