"""OneFlow 0.9 as a runtime: how it lowers boxing and shards ZeRO (the default for plans)."""

from __future__ import annotations

from autopar.runtimes.profile import Lowering, RuntimeProfile, ZeroSharding

__all__ = ["ONEFLOW_0_9", "ONEFLOW_0_9_SHARD_MIN_1"]

ONEFLOW_0_9 = RuntimeProfile(
    "oneflow-0.9",
    Lowering.ONEFLOW_0_9,
    zero_sharding=ZeroSharding.ONE_AXIS,
    source=(
        "OneFlow v0.9.0 oneflow/core/graph/boxing/hierarchical_sub_task_graph_builder_impl.cpp "
        "(DispatchHierarchicalSubTskGphBuilder, Same2DHierarchySubTskGphBuilder, "
        "Dim0NdSbpMismatchedSubTskGphBuilder, NDNcclSendRecvBoxingSubTskGphBuilder); "
        "oneflow/core/job_rewriter/optimizer_placement_optimization_pass.cpp (ZeRO over one axis); "
        "docs/runtime-profiles.md"
    ),
)
"""OneFlow 0.9 with its defaults: boxing lowered as its sub-task-graph builders insert it
(:class:`~autopar.runtimes.oneflow_09.boxing.OneFlowBoxing`), ZeRO over one more mesh axis with
``shard_min_size = 1024``."""

ONEFLOW_0_9_SHARD_MIN_1 = RuntimeProfile(
    "oneflow-0.9-shard-min-1",
    Lowering.ONEFLOW_0_9,
    zero_sharding=ZeroSharding.ONE_AXIS_SHARD_MIN_1,
    source="oneflow-0.9 with graph.config.enable_zero(shard_min_size=1) (not OneFlow's default)",
)
"""OneFlow 0.9 with ``graph.config.enable_zero(shard_min_size=1)``: every splittable variable sharded."""
