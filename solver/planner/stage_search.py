"""The stage dimension of the search: one stage (today's plan) against pipelines of ``S`` stages.

``stages`` = 1 plans as before (:func:`autopar_solver.planner.plan`); ``S > 1`` plans the
pipeline of :mod:`.pipeline_search`; ``None`` (``--stages auto``, the default) plans one
stage on one node (a pipeline there pays its bubble only to save memory, which recomputation
and sharding also do), and on several nodes searches every number of stages whose stages get
at least one block (:func:`.pipeline_search.stage_candidates`)::

    each S: a bound on every pipeline of S stages, any cut
            (:func:`.pipeline_bounds.stage_count_bound`, within a share of the limit; for one
            stage on its default mesh, a promise only)
          v
    by promise: the most promising S with half the time left, the others an equal share of
    what is left, each skipped when its proven bound reaches the best plan so far
    ("proved worse") or the time left cannot reach a plan ("no time")
          v
    the fastest verified plan; the least proven bound over every S (solved: its own; not
    solved: its stage-count bound) gives the search's gap

Every row (its bound, iteration, memory, gap, or why it has no plan) is kept in the chosen
plan's ``diagnostics["stage_search"]`` and printed (:func:`stage_search_text`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from autopar.errors import AutoparError, ConfigError, InfeasibleError, TimeLimitError
from autopar.infra.progress import Deadline, ProgressFn
from autopar.infra.store import KeyValueStore, MemoryStore
from autopar.ir.plan import Plan
from autopar.pipeline.evaluate import stage_cluster
from autopar.pipeline.plan import PipelinePlan
from autopar_solver.planner.pipeline_bounds import stage_count_bound
from autopar_solver.planner.pipeline_search import default_stage_shape, solve_pipeline, stage_candidates
from autopar_solver.planner.request import PlanRequest

__all__ = ["BOUND_SHARE", "LEAD_SHARE", "MIN_SHARE_S", "parse_stages", "plan_stages", "stage_search_text"]

BOUND_SHARE = 0.2
"""Most of the time limit the bounds of the numbers of stages take before any is solved."""
LEAD_SHARE = 0.5
"""Share of the time left the most promising number of stages is solved with."""
MIN_SHARE_S = 2.0
"""Least time a number of stages is tried with (seconds): below it a row says "no time"."""


def parse_stages(text: str) -> int | None:
    """``--stages``: a positive integer, or ``auto`` (None)."""
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError("bad_stages", f"--stages must be a positive integer or auto, got {text!r}")
    return int(text)


def _row(stages: int, result: Plan | PipelinePlan | None, wall_s: float, error: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"stages": stages, "wall_s": wall_s}
    if result is not None:
        solver = result.solver or {}
        gap, bound = solver.get("gap"), solver.get("bound")
        row.update(
            iteration_time_s=result.iteration_time_s,
            achieved_iteration_time_s=result.achieved_iteration_time_s,
            memory_per_device_bytes=result.memory_per_device_bytes,
            gap=gap if isinstance(gap, (int, float)) and math.isfinite(gap) else None,
            bound_s=bound if isinstance(bound, (int, float)) and math.isfinite(bound) else None,
            mesh_shape=list((result.stages[0] if isinstance(result, PipelinePlan) else result).mesh.shape),
        )
        if isinstance(result, PipelinePlan):
            row["bubble_fraction"] = result.predicted.get("bubble_fraction")
            row["block_counts"] = list(result.counts)
            row["virtual_stages"] = result.virtual_stages
    if error is not None:
        row["error"] = error
    return row


def plan_stages(
    request: PlanRequest,
    stages: int | None,
    deadline: Deadline,
    *,
    store: KeyValueStore | None = None,
    progress: ProgressFn | None = None,
    stage_mesh_shape: tuple[int, ...] | None = None,
) -> Plan | PipelinePlan:
    """The plan of ``request`` with ``stages`` stages (None: the best of one stage and the
    candidates; module docstring), within ``deadline``."""
    from autopar_solver.planner import plan

    def one_stage(limit_s: float) -> Plan:
        options = dataclasses.replace(request.options, time_limit_s=limit_s)
        req = dataclasses.replace(request, mesh_shape=stage_mesh_shape, options=options)
        return plan(req, store=store, progress=progress)

    if stages == 1 or (stages is None and request.cluster.nodes == 1):
        return one_stage(deadline.left())  # auto on one node: one stage
    if stages is not None:
        return solve_pipeline(
            request, stages, deadline, store=store, progress=progress, stage_mesh_shape=stage_mesh_shape
        )
    return _auto(request, deadline, store or MemoryStore(), progress, stage_mesh_shape)


def _promises(
    request: PlanRequest, candidates: list[int], store: KeyValueStore, deadline: Deadline
) -> dict[int, tuple[float | None, bool]]:
    """Each number of stages' bound, seconds, and whether it is a proof (a pipeline's is, on its
    stages' default mesh; one stage's on its default mesh is only a promise when the mesh is
    searched); None where the time ran out first."""
    out: dict[int, tuple[float | None, bool]] = {}
    for n, s in enumerate(candidates):
        share = Deadline(deadline.left() / (len(candidates) - n))
        if deadline.expired():
            out[s] = (None, False)
            continue
        sub = stage_cluster(request.cluster, s)
        named = request.mesh_shape if s == 1 else None
        shape = tuple(named) if named else default_stage_shape(sub)
        try:
            bound = stage_count_bound(
                request.graph, request.cluster, s, shape, request.zero_stage, request.options, store, share
            )
        except AutoparError:
            out[s] = (None, False)
            continue
        out[s] = (bound, s > 1 or named is not None)
    return out


def _auto(
    request: PlanRequest,
    deadline: Deadline,
    store: KeyValueStore,
    progress: ProgressFn | None,
    stage_mesh_shape: tuple[int, ...] | None,
) -> Plan | PipelinePlan:
    """``--stages auto`` (module docstring)."""
    from autopar_solver.planner import plan

    candidates = [1, *stage_candidates(request)]
    promises = _promises(request, candidates, store, Deadline(deadline.left() * BOUND_SHARE))
    order = sorted(candidates, key=lambda s: (promises[s][0] is None, promises[s][0] or 0.0, s))
    rows: dict[int, dict[str, Any]] = {}
    best: Plan | PipelinePlan | None = None
    failures: list[AutoparError] = []
    for n, s in enumerate(order):
        bound, proven = promises[s]
        if best is not None and proven and bound is not None and bound >= best.iteration_time_s:
            rows[s] = {
                "stages": s,
                "stage_count_bound_s": bound,
                "wall_s": 0.0,
                "outcome": "proved worse by its bound",
            }
            continue
        share = deadline.left() * LEAD_SHARE if n == 0 else deadline.left() / (len(order) - n)
        if share < MIN_SHARE_S:
            rows[s] = {
                "stages": s,
                **({"stage_count_bound_s": bound} if proven and bound is not None else {}),
                "wall_s": 0.0,
                "outcome": f"no time: {share:.1f} s left for it, under the {MIN_SHARE_S:.0f} s a try needs",
            }
            continue
        t0 = time.perf_counter()
        result: Plan | PipelinePlan | None = None
        error = None
        try:
            if s == 1:
                options = dataclasses.replace(request.options, time_limit_s=share)
                req = dataclasses.replace(request, mesh_shape=stage_mesh_shape, options=options)
                result = plan(req, store=store, progress=progress)
            else:
                result = solve_pipeline(request, s, Deadline(share), store=store, progress=progress)
        except AutoparError as exc:
            error = f"[{exc.code}] {exc.message}"
            failures.append(exc)
        rows[s] = _row(s, result, time.perf_counter() - t0, error)
        rows[s]["outcome"] = "solved" if result is not None else "no plan"
        if proven and bound is not None:
            rows[s]["stage_count_bound_s"] = bound
        if result is not None and (
            best is None or result.achieved_iteration_time_s < best.achieved_iteration_time_s
        ):
            best = result
    ordered = [rows[s] for s in candidates if s in rows]
    if best is None and failures and all(isinstance(f, InfeasibleError) for f in failures):
        first = failures[0]  # the most promising number of stages': its floor and advice
        tried = ", ".join(str(r["stages"]) for r in ordered if r.get("outcome") == "no plan")
        raise InfeasibleError(
            first.code, f"no number of stages tried ({tried}) fits: {first.message}", **first.details
        )
    if best is None:
        raise TimeLimitError(
            "time_limit",
            "no number of stages found a verified plan in the time limit (each row: --verbose or the "
            "plan JSON); give more time (--time-limit) or name --stages",
            phase="stage_search",
        )
    best.diagnostics["stage_search"] = ordered
    _search_bound(best, ordered)
    return best


def _search_bound(best: Plan | PipelinePlan, rows: list[dict[str, Any]]) -> None:
    """Record on ``best`` the least proven bound over every number of stages and the gap to it:
    a pipeline's bound over every cut (its stage-count bound), one stage's its solve's
    (``bound_s``); nothing when some number of stages has none (no time for its bound)."""
    bounds: list[float | None] = []
    for r in rows:
        if r["stages"] == 1:
            bounds.append(r.get("bound_s") if r.get("outcome") == "solved" else r.get("stage_count_bound_s"))
        else:
            bounds.append(
                r.get("stage_count_bound_s", r.get("bound_s") if "iteration_time_s" not in r else None)
            )
    if best.solver is None or not bounds or any(b is None for b in bounds):
        return
    it = best.iteration_time_s
    least = min(min(float(b) for b in bounds if b is not None), it)
    best.solver["stage_search_bound"] = least
    best.solver["stage_search_gap"] = (it - least) / it if it > 0 else 0.0


def stage_search_text(rows: list[dict[str, Any]]) -> str:
    """The ``stage search:`` lines: per number of stages, its iteration, bubble, memory and gap,
    or why it has no plan (a proven bound, no time, no plan found)."""
    from autopar.ir.plan import format_bytes

    lines = ["stage search (every number of stages, most promising first; iteration as solved):"]
    for r in rows:
        if "iteration_time_s" in r:
            gap = "" if r.get("gap") is None else f", gap {100 * r['gap']:.1f} %"
            bubble = r.get("bubble_fraction")
            bubble_text = "" if bubble is None else f", bubble {100 * bubble:.1f} %"
            chunks = f", {r['virtual_stages']} chunks each" if r.get("virtual_stages", 1) > 1 else ""
            lines.append(
                f"  {r['stages']:>2} stage(s) x {r['mesh_shape']}{chunks}: "
                f"iteration {r['iteration_time_s'] * 1e3:.2f} ms{bubble_text}, "
                f"{format_bytes(r['memory_per_device_bytes'])}/dev{gap} ({r['wall_s']:.1f} s)"
            )
        elif r.get("outcome") == "proved worse by its bound":
            bound_ms = r["stage_count_bound_s"] * 1e3
            lines.append(
                f"  {r['stages']:>2} stage(s): proved worse: any cut takes at least {bound_ms:.2f} ms"
            )
        else:
            why = r.get("error") or r.get("outcome", "no plan")
            lines.append(f"  {r['stages']:>2} stage(s): no plan: {_one_line(str(why))} ({r['wall_s']:.1f} s)")
    return "\n".join(lines) + "\n"


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line of at most ``limit`` characters (the rest in the plan JSON)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
