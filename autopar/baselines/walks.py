"""Baseline layouts already walked (:class:`WalkMemo`), so one layout priced at several
recomputations, K or interleavings is walked once."""

from __future__ import annotations

import dataclasses

from autopar.baselines import plans as baselines
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan

__all__ = ["WalkMemo"]


class WalkMemo:
    """Baseline layouts already walked, by (kind, graph, mesh, ZeRO stage, runtime, sequence
    parallelism): a layout does not depend on K, the recomputation or the interleaving."""

    def __init__(self) -> None:
        self._plans: dict[tuple[str, ...], Plan] = {}

    def plan(
        self, kind: str, graph: Graph, mesh: Mesh, zero_stage: int, runtime: str, sequence_parallel: bool
    ) -> Plan:
        """A fresh copy of the ``kind`` layout (its evaluation and training are the caller's)."""
        key = (kind, graph.content_hash(), mesh.key(), str(zero_stage), runtime, str(sequence_parallel))
        found = self._plans.get(key)
        if found is None:
            found = self._plans[key] = baselines.baseline_plan(  # by the module: patchable
                kind, graph, mesh, zero_stage, runtime=runtime, sequence_parallel=sequence_parallel
            )
        return dataclasses.replace(found)
