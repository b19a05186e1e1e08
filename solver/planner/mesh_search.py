"""Mesh search: every candidate logical mesh shape in turn, the fastest verified plan wins.

Each shape is solved in this process with all the workers and given an equal share of
the time still left (a shape that finishes early leaves its rest to the next); reports
carry the shape.  Shapes that fit no plan or run out of time are listed with their
error in ``plan.diagnostics["mesh_search"]``.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from autopar.cluster import Mesh, candidate_mesh_shapes
from autopar.errors import InfeasibleError, TimeLimitError
from autopar.plan import Plan
from autopar.progress import Deadline, Progress, ProgressFn
from autopar_solver.planner.context import MIN_SOLVE_S, PlanContext
from autopar_solver.planner.on_mesh import solve_mesh
from autopar_solver.planner.request import PlanRequest

__all__ = ["mesh_search"]


def mesh_search(request: PlanRequest, ctx: PlanContext) -> Plan:
    """The fastest verified plan of ``request`` over :func:`candidate_mesh_shapes`."""
    t0 = time.perf_counter()
    deadline = ctx.deadline
    shapes = candidate_mesh_shapes(request.cluster)
    deadline.report(ctx.progress, "mesh_search", detail={"shapes": [list(s) for s in shapes]})
    results: list[dict[str, Any]] = []
    for i, shape in enumerate(shapes):
        share = deadline.left() / (len(shapes) - i)
        shape_deadline = Deadline(min(share, deadline.left()))
        started = time.perf_counter()
        relay = _ShapeRelay(ctx.progress, deadline, shape) if ctx.progress else None
        try:
            p = _solve_shape(request, shape, shape_deadline, ctx.for_shape(shape, shape_deadline, relay))
        except (InfeasibleError, TimeLimitError) as exc:
            results.append(
                {"shape": list(shape), "error": exc.to_dict(), "wall_s": time.perf_counter() - started}
            )
            continue
        results.append({"shape": list(shape), "plan": p, "wall_s": time.perf_counter() - started})
    chosen = _fastest(results, deadline)
    if chosen.solver is not None:
        chosen.solver["mesh_search_wall_s"] = time.perf_counter() - t0
    return chosen


def _solve_shape(request: PlanRequest, shape: tuple[int, ...], deadline: Deadline, ctx: PlanContext) -> Plan:
    """The plan of ``request`` on mesh ``shape``, within ``deadline`` (the shape's share)."""
    options = (
        request.options
        if request.options.deterministic
        else replace(request.options, time_limit_s=max(MIN_SOLVE_S, deadline.limit_s))
    )
    return solve_mesh(
        request.graph,
        Mesh(request.cluster, shape),
        request.memory_budget_bytes,
        request.zero_stage,
        options,
        ctx,
        tie_layers=request.tie_layers,
    )


class _ShapeRelay:
    """Reports of one shape's solve, stamped with the whole search's clock and the shape."""

    def __init__(self, progress: ProgressFn, deadline: Deadline, shape: tuple[int, ...]) -> None:
        self.progress = progress
        self.deadline = deadline
        self.shape = shape

    def __call__(self, p: Progress) -> None:
        left = self.deadline.left()
        self.progress(
            replace(
                p,
                elapsed_s=self.deadline.elapsed(),
                time_left_s=None if math.isinf(left) else left,
                shape=self.shape,
            )
        )


def _fastest(results: list[dict[str, Any]], deadline: Deadline) -> Plan:
    """The plan of least step time among ``results``, with every shape's row in its
    diagnostics; when no shape has a plan, the error that says why."""
    feasible = [r for r in results if "plan" in r]
    if not feasible:
        _raise_no_shape(results, deadline)
    chosen: Plan = min(feasible, key=lambda r: r["plan"].step_time_s)["plan"]
    chosen.diagnostics["mesh_search"] = [
        {
            "shape": r["shape"],
            "step_time_s": r["plan"].step_time_s if "plan" in r else None,
            "memory_per_device_bytes": r["plan"].memory_per_device_bytes if "plan" in r else None,
            "gap": r["plan"].solver["gap"] if "plan" in r and r["plan"].solver else None,
            "wall_s": r["wall_s"],
            "error": r.get("error", {}).get("message"),
        }
        for r in results
    ]
    return chosen


def _raise_no_shape(results: list[dict[str, Any]], deadline: Deadline) -> None:
    """:class:`TimeLimitError` when every shape ran out of time, else :class:`InfeasibleError`
    with the least memory any shape needs."""
    if all(r["error"].get("code") == "time_limit" for r in results):
        raise TimeLimitError(
            "time_limit",
            f"the time limit ({round(deadline.limit_s, 2):g} s) ran out before any mesh shape "
            "had a verified plan: " + "; ".join(f"{r['shape']}: {r['error']['message']}" for r in results),
        )
    infeasible = [r["error"] for r in results if r["error"].get("code") != "time_limit"]
    best_err = min(infeasible, key=lambda e: e.get("min_feasible_bytes", math.inf) or math.inf)
    raise InfeasibleError(
        None,
        "no mesh shape fits the budget: "
        + "; ".join(f"{r['shape']}: {r['error']['message']}" for r in results),
        min_feasible_bytes=best_err.get("min_feasible_bytes"),
        proven=best_err.get("proven", False),
    )
