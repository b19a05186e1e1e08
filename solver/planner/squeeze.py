"""Mesh squeeze and unsqueeze: size-1 axes are solved away and put back.

A size-1 axis splits nothing and its collectives are free, so every price (compute
share, boxing, memory) is the same as on the mesh without it, while the N-D signature
lists (and boxing states) would grow by a factor per size-1 axis for nothing.  A request
for mesh ``[4, 2, 1]`` is solved on ``[4, 2]`` and the plan lifted back, ``B`` on the
size-1 axis, and re-checked by the evaluator on the requested mesh (in a child process
stopped at the deadline, :mod:`.evaluate_child`).
"""

from __future__ import annotations

import math
from typing import Any, cast

from autopar.cost.evaluate import attach_evaluation
from autopar.hardware.mesh import Mesh
from autopar.infra.progress import Deadline
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.sbp import B, NdSbp, SbpValue, Signature
from autopar.ir.wire import MemoryReport, Predicted, SolverReport
from autopar_solver.planner.context import PlanContext
from autopar_solver.planner.evaluate_child import evaluate_within
from autopar_solver.planner.on_mesh import solve_mesh
from autopar_solver.planner.request import PlanRequest
from autopar_solver.planner.verify import SolvedObjective, verify

__all__ = ["solve_squeezed", "squeezed", "unsqueeze"]


def squeezed(mesh: Mesh) -> Mesh:
    """``mesh`` without its size-1 axes (``(1,)`` when every axis is 1)."""
    return Mesh(mesh.cluster, tuple(n for n in mesh.shape if n > 1) or (1,))


def solve_squeezed(graph: Graph, request: PlanRequest, ctx: PlanContext) -> Plan:
    """The plan of ``request`` on its mesh, solved on the squeezed mesh and lifted back."""
    assert request.mesh_shape is not None
    mesh = Mesh(request.cluster, tuple(request.mesh_shape))
    small = squeezed(mesh)
    result = solve_mesh(
        graph,
        small,
        request.memory_budget_bytes,
        request.zero_stage,
        request.options,
        ctx,
        tie_layers=request.tie_layers,
    )
    if small.shape != mesh.shape:
        result = unsqueeze(graph, result, mesh, ctx.deadline)
    return result


def unsqueeze(graph: Graph, solved: Plan, mesh: Mesh, deadline: Deadline | None = None) -> Plan:
    """``solved`` (planned on ``mesh`` without its size-1 axes) as a plan on ``mesh``, with ``B``
    on every size-1 axis, re-checked by the evaluator on ``mesh`` when that fits in the time
    left (``deadline``; the re-check runs in a child process that is stopped at the deadline).

    When the re-check does not finish in time, the plan keeps the squeezed mesh's evaluation
    (already verified against the solver), its per-axis figures moved to the kept axes,
    and ``solver["stats"]["recheck"]`` says so.
    """
    kept = [a for a, n in enumerate(mesh.shape) if n > 1]
    lifted = _lifted(graph, solved, mesh, kept)
    solver = SolverReport(**(solved.solver or {}))
    left = math.inf if deadline is None else deadline.left()
    ev = evaluate_within(graph, lifted, left)
    if ev is not None:
        if "objective" in solver:
            verify(ev, SolvedObjective(solver["objective"]), solved.memory_budget_bytes, graph)
        attach_evaluation(lifted, ev)
    else:
        _keep_squeezed_evaluation(lifted, solved, solver, kept)
    lifted.solver = solver
    lifted.diagnostics["solved_on_mesh"] = list(solved.mesh.shape)
    return lifted


def _lifted(graph: Graph, solved: Plan, mesh: Mesh, kept: list[int]) -> Plan:
    """``solved``'s signatures on ``mesh``: each N-D SBP on the ``kept`` axes, ``B`` elsewhere."""

    def lift(sbp: NdSbp) -> NdSbp:
        values: list[SbpValue] = [B] * mesh.ndim
        for a, v in zip(kept, sbp.values if kept else ()):
            values[a] = v
        return NdSbp(tuple(values))

    signatures = {
        name: Signature(tuple(lift(x) for x in sig.inputs), tuple(lift(x) for x in sig.outputs))
        for name, sig in solved.signatures.items()
    }
    return Plan.from_assignment(
        graph,
        mesh,
        solved.zero_stage,
        signatures,
        memory_budget_bytes=solved.memory_budget_bytes,
        runtime=solved.runtime,
        training=solved.training,
    )


def _keep_squeezed_evaluation(lifted: Plan, solved: Plan, solver: SolverReport, kept: list[int]) -> None:
    """No time for the re-check: ``lifted`` takes ``solved``'s evaluation, per-axis figures
    moved from the squeezed mesh's axes to the ``kept`` axes of ``lifted``'s mesh."""
    mesh = lifted.mesh
    axis = {str(i): str(a) for i, a in enumerate(kept)}

    def moved(per_axis: Any) -> Any:
        if not isinstance(per_axis, dict):
            return per_axis
        out = {str(a): 0.0 for a in range(mesh.ndim)}
        out.update({axis.get(str(k), str(k)): v for k, v in per_axis.items()})
        return out

    lifted.predicted = cast(
        Predicted,
        {k: moved(v) if k.endswith("_per_axis") else v for k, v in (solved.predicted or {}).items()},
    )
    lifted.memory = cast(MemoryReport, dict(solved.memory or {}))
    lifted.diagnostics = {**lifted.diagnostics, **solved.diagnostics}
    stats = dict(solver.get("stats", {}))
    stats["recheck"] = (
        f"evaluated on the squeezed mesh {list(solved.mesh.shape)}; the re-check on "
        f"{list(mesh.shape)} did not finish within the time limit"
    )
    solver["stats"] = stats
