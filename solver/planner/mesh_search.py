"""Mesh search: every candidate logical mesh shape, bounded first, the most promising solved
first, the fastest verified plan wins.

::

    bound phase (at most BOUND_SHARE of the limit): per shape, its cost tables and a proven
    lower bound on its step time (:mod:`.shape_bounds`); shapes proven infeasible drop out
        │  order by bound, least first (shapes without one last)
        v
    solve phase: per shape in that order, skipped as "proved worse" when its bound is >= the
    best verified plan's step time, else solved with an equal share of the time left among
    the bounded shapes still worth solving (a shape that finishes early leaves its rest to
    the next); shapes without a bound (no time in the bound phase) share what is left after

Every shape is listed in ``plan.diagnostics["mesh_search"]`` with its bound and outcome
(solved, proved worse, no plan); ``plan.solver["stats"]["mesh_search"]`` lists the shapes
solved and the shapes pruned with their bounds.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from autopar.cluster import Mesh, candidate_mesh_shapes
from autopar.cost_tables import CostTables
from autopar.errors import InfeasibleError, TimeLimitError
from autopar.plan import Plan
from autopar.progress import Deadline, Progress, ProgressFn
from autopar.store import KeyValueStore, MemoryStore
from autopar_solver.planner.context import MIN_SOLVE_S, PlanContext
from autopar_solver.planner.on_mesh import solve_mesh
from autopar_solver.planner.request import PlanRequest
from autopar_solver.planner.shape_bounds import ShapeBound, shape_bound, shape_tables

__all__ = ["BOUND_SHARE", "mesh_search"]

BOUND_SHARE = 0.5
"""Most of the time limit the bound phase takes (most of it builds the cost tables, which
the solves then use; the TRW-S sweeps are capped at :data:`.shape_bounds.BOUND_SWEEPS`)."""
PROVED_WORSE = "proved worse"


def mesh_search(request: PlanRequest, ctx: PlanContext) -> Plan:
    """The fastest verified plan of ``request`` over :func:`candidate_mesh_shapes`."""
    t0 = time.perf_counter()
    deadline = ctx.deadline
    shapes = candidate_mesh_shapes(request.cluster)
    deadline.report(ctx.progress, "mesh_search", detail={"shapes": [list(s) for s in shapes]})
    # the tables are built once per shape: kept here between the two phases when there is no memo
    store: KeyValueStore = ctx.store if ctx.store is not None else MemoryStore()
    bounds, bound_limit_s = _bound_phase(request, shapes, store, ctx)
    order = sorted(
        (b for b in bounds if b.error is None),
        key=lambda b: (b.bound_s is None, b.bound_s if b.bound_s is not None else 0.0),
    )
    rows: dict[tuple[int, ...], dict[str, Any]] = {b.shape: _error_row(b) for b in bounds if b.error}
    best: float = math.inf
    for i, b in enumerate(order):
        if b.bound_s is not None and b.bound_s >= best:
            rows[b.shape] = {
                "shape": list(b.shape),
                "bound_s": b.bound_s,
                "outcome": PROVED_WORSE,
                "wall_s": b.wall_s,
            }
            continue
        worth = _worth_solving(order[i:], best)
        share = Deadline(min(deadline.left() / worth, deadline.left()))
        rows[b.shape] = {**_solve_row(request, b, share, store, ctx), "shared_by": worth}
        b.tables = None  # solved: its tables are not needed any more
        if "plan" in rows[b.shape]:
            best = min(best, rows[b.shape]["plan"].step_time_s)
    results = [rows[s] for s in shapes]
    chosen = _fastest(results, deadline)
    if chosen.solver is not None:
        chosen.solver["mesh_search_wall_s"] = time.perf_counter() - t0
        chosen.solver.setdefault("stats", {})["mesh_search"] = _search_stats(
            results, bounds, bound_limit_s, deadline
        )
    return chosen


def _worth_solving(rest: list[ShapeBound], best: float) -> int:
    """How many shapes share the time left: the bounded ones whose bound is under ``best``;
    once none is left, the shapes the bound phase had no time for (they would otherwise
    starve the bounded ones: mt5-base on 4x8 at 30 s bounds 3 of its 11 shapes)."""
    bounded = sum(1 for o in rest if o.bound_s is not None and o.bound_s < best)
    return bounded or sum(1 for o in rest if o.bound_s is None)


def _bound_phase(
    request: PlanRequest, shapes: list[tuple[int, ...]], store: KeyValueStore, ctx: PlanContext
) -> tuple[list[ShapeBound], float]:
    """Each shape's tables and proven lower bound, each within an equal share of what is
    left of :data:`BOUND_SHARE` of the limit (deterministic runs: of the whole limit); and
    the phase's limit, seconds."""
    deadline = ctx.deadline
    phase = deadline.left() if request.options.deterministic else BOUND_SHARE * deadline.left()
    phase_deadline = Deadline(phase)
    out = []
    for i, shape in enumerate(shapes):
        share = Deadline(min(phase_deadline.left() / (len(shapes) - i), deadline.left()))
        relay = _ShapeRelay(ctx.progress, deadline, shape) if ctx.progress else None
        b = shape_bound(request, shape, store, ctx.for_shape(shape, share, relay))
        if isinstance(b.error, TimeLimitError):
            b.error = None  # no time for its tables or bound here: the solve phase tries again
        out.append(b)
        ctx.relay().report("mesh_search:bound", detail={"shape": list(shape), "bound_s": b.bound_s})
    return out, phase


def _solve_row(
    request: PlanRequest, b: ShapeBound, deadline: Deadline, store: KeyValueStore, ctx: PlanContext
) -> dict[str, Any]:
    """Solve shape ``b`` within ``deadline``: its row, with the plan or the error."""
    started = time.perf_counter()
    shape = b.shape
    relay = _ShapeRelay(ctx.progress, ctx.deadline, shape) if ctx.progress else None
    shape_ctx = ctx.for_shape(shape, deadline, relay)
    row: dict[str, Any] = {"shape": list(shape), "bound_s": b.bound_s}
    try:
        tables = b.tables if b.tables is not None else shape_tables(request, shape, store, shape_ctx)
        p = _solve_shape(request, shape, deadline, shape_ctx, tables)
    except (InfeasibleError, TimeLimitError) as exc:
        row.update(error=exc.to_dict(), outcome="no plan")
    else:
        row.update(plan=p, outcome="solved")
    row["wall_s"] = time.perf_counter() - started + b.wall_s
    row["share_s"] = deadline.limit_s
    return row


def _error_row(b: ShapeBound) -> dict[str, Any]:
    assert b.error is not None
    return {
        "shape": list(b.shape),
        "bound_s": None,
        "error": b.error.to_dict(),
        "outcome": "no plan",
        "wall_s": b.wall_s,
    }


def _search_stats(
    results: list[dict[str, Any]], bounds: list[ShapeBound], bound_limit_s: float, deadline: Deadline
) -> dict[str, Any]:
    """``solver.stats.mesh_search``: the shapes solved and the shapes proved worse, with their
    bounds (seconds), and the bound phase's wall time."""
    return {
        "solved": [
            {k: r[k] for k in ("shape", "bound_s", "share_s", "shared_by")}
            for r in results
            if r["outcome"] != PROVED_WORSE and "share_s" in r
        ],
        "proved_worse": [
            {"shape": r["shape"], "bound_s": r["bound_s"]} for r in results if r["outcome"] == PROVED_WORSE
        ],
        "no_plan": [r["shape"] for r in results if r["outcome"] == "no plan"],
        "bound_phase_s": sum(b.wall_s for b in bounds),
        "bound_phase_limit_s": bound_limit_s,
        "limit_s": deadline.limit_s,
    }


def _solve_shape(
    request: PlanRequest, shape: tuple[int, ...], deadline: Deadline, ctx: PlanContext, tables: CostTables
) -> Plan:
    """The plan of ``request`` on mesh ``shape`` from its ``tables``, within ``deadline``
    (the shape's share)."""
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
        tables=tables,
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
            "lower_bound_s": r["bound_s"],
            "outcome": r["outcome"],
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
