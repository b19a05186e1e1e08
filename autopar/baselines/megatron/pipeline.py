"""A baseline with pipeline stages: Megatron-LM's PTD-P as it runs.

Megatron-LM cuts the layers into ``p`` stages of equal size
(``--pipeline-model-parallel-size``; ``num_layers`` must divide by ``p``), the embedding on
the first stage and the head and loss on the last, the word embedding held by both and
its gradients all-reduced once per step; every stage runs Megatron's tensor and data
parallelism on ``N / p`` devices under the 1F1B schedule (``megatron/core/pipeline_parallel/
schedules.py``, ``forward_backward_pipelining_without_interleaving``).  Here: the graph split by
:func:`autopar.pipeline.split.split_graph` at equal block counts, each stage's graph given
the baseline's layout (:func:`autopar.baselines.plans.baseline_plan`) on the stage's mesh, and the
whole priced and re-checked by :func:`autopar.pipeline.evaluate.evaluate_pipeline`.
"""

from __future__ import annotations

from autopar.baselines.configs import BaselineConfig
from autopar.baselines.walks import WalkMemo
from autopar.cost.evaluate import attach_evaluation
from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.training import TrainingConfig
from autopar.pipeline.evaluate import evaluate_pipeline, priced, stage_cluster, stage_link
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.split import ordered_blocks, split_graph

__all__ = ["pipeline_baseline"]


def pipeline_baseline(
    graph: Graph,
    cluster: Cluster,
    config: BaselineConfig,
    training: TrainingConfig,
    memory_budget_bytes: int | None = None,
    walks: WalkMemo | None = None,
) -> PipelinePlan:
    """The ``config.kind`` baseline of ``graph`` in ``config.pipeline`` equal stages, each on
    ``config.mesh_shape``, under 1F1B interleaved with ``config.virtual_stages`` chunks per
    device, with ``config.sequence_parallel``, evaluated as the runtime runs it."""
    blocks = len(ordered_blocks(graph))
    stages = config.pipeline
    if stages < 1 or blocks % stages:
        raise ConfigError(
            "bad_baseline_config",
            f"pp={stages} does not divide the graph's {blocks} blocks (Megatron-LM gives every stage "
            "as many layers)",
        )
    counts = tuple(blocks // stages for _ in range(stages))
    link = stage_link(cluster, stages)
    slices = split_graph(graph, counts, link.crosses_nodes)
    sub = stage_cluster(cluster, stages)
    plans = []
    walks = walks or WalkMemo()
    for sl in slices:
        mesh = Mesh(sub, config.mesh_shape)
        sp = config.sequence_parallel
        p = walks.plan(config.kind, sl.graph, mesh, config.zero_stage, config.runtime, sp)
        p.training = training
        plans.append(p)
    pp = PipelinePlan(
        graph.name,
        graph.content_hash(),
        cluster,
        counts,
        plans,
        training,
        source=f"baseline:{config.kind}",
        memory_budget_bytes=memory_budget_bytes,
        virtual_stages=config.virtual_stages,
    )
    ev = evaluate_pipeline(graph, pp, slices=slices)
    for p, cost in zip(plans, ev.stages):  # each stage's own figures, from the same evaluation
        attach_evaluation(p, cost.evaluation)
    # the baseline is what the system runs: over the budget is reported, not refused
    return priced(pp, ev)
