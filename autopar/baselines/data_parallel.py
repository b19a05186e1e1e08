"""The ``data-parallel`` baseline: parameters replicated, data split on every axis, the rest by
the greedy walk.
"""

from __future__ import annotations

from autopar.baselines.greedy_walk import _GreedyWalk
from autopar.baselines.problem import Baseline, BaselineKind, _Layout, _Problem
from autopar.ir.sbp import NdSbp, S, Signature
from autopar.ir.structure import _structure


class DataParallelBaseline(Baseline):
    """Parameters ``B``, data ``S(0)`` on every axis, the rest greedy under Megatron's discipline."""

    kind = BaselineKind.DATA_PARALLEL

    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        graph, ndim = problem.graph, problem.mesh.ndim
        layout = _Layout(
            {v.op: problem.replicated for v in graph.variables}, NdSbp(tuple(S(0) for _ in range(ndim)))
        )
        return _GreedyWalk(problem, layout, _structure(graph), megatron=False).run()
