"""The ``single-device`` baseline: every op replicated, each device does the work of one."""

from __future__ import annotations

from autopar.baselines.problem import Baseline, BaselineKind, _Layout, _Problem
from autopar.ir.sbp import B, Signature


class SingleDeviceBaseline(Baseline):
    """Every op replicated (all ``B``): each device does the work of one."""

    kind = BaselineKind.SINGLE_DEVICE

    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        layout = _Layout({v.op: problem.replicated for v in problem.graph.variables}, problem.replicated)
        chosen: dict[str, Signature] = {}
        for op in problem.graph.topological_order:
            if op.name in layout.variables or op.type in ("variable", "input", "pipeline_recv"):
                chosen[op.name] = problem.source_signature(op, layout)
            else:
                _, sigs = problem.signatures_of(op)
                chosen[op.name] = min(
                    sigs, key=lambda s: sum(v != B for p in (*s.inputs, *s.outputs) for v in p)
                )
        return chosen
