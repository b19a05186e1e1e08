"""The stage dimension of the search: one stage (today's plan) against pipelines of ``S`` stages.

``stages`` = 1 plans as before (:func:`autopar_solver.planner.plan`); ``S > 1`` plans the
pipeline of :mod:`.pipeline_search`; ``None`` (``--stages auto``) tries one stage and every
candidate ``S`` up to :data:`MAX_AUTO_STAGES` (:func:`.pipeline_search.stage_candidates`),
each with an equal share of the time left, and keeps the verified plan of least
iteration.  Every row (its iteration, memory, gap, or why it has no plan) is kept in the
chosen plan's ``diagnostics["stage_search"]``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from autopar.errors import AutoparError, ConfigError, TimeLimitError
from autopar.infra.progress import Deadline, ProgressFn
from autopar.infra.store import KeyValueStore
from autopar.ir.plan import Plan
from autopar.pipeline.plan import PipelinePlan
from autopar_solver.planner.pipeline_search import solve_pipeline, stage_candidates
from autopar_solver.planner.request import PlanRequest

__all__ = ["MAX_AUTO_STAGES", "parse_stages", "plan_stages", "stage_search_text"]

MAX_AUTO_STAGES = 8
"""The most stages ``--stages auto`` tries (each stage is one intra-stage solve)."""


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
        gap = (result.solver or {}).get("gap")
        row.update(
            iteration_time_s=result.iteration_time_s,
            memory_per_device_bytes=result.memory_per_device_bytes,
            gap=gap if isinstance(gap, (int, float)) and math.isfinite(gap) else None,
            mesh_shape=list((result.stages[0] if isinstance(result, PipelinePlan) else result).mesh.shape),
        )
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

    if stages == 1:
        return one_stage(deadline.left())
    if stages is not None:
        return solve_pipeline(
            request, stages, deadline, store=store, progress=progress, stage_mesh_shape=stage_mesh_shape
        )
    candidates = [1] + [s for s in stage_candidates(request) if s <= MAX_AUTO_STAGES]
    rows: list[dict[str, Any]] = []
    best: Plan | PipelinePlan | None = None
    for n, s in enumerate(candidates):
        share = deadline.left() / (len(candidates) - n)
        t0 = time.perf_counter()
        result: Plan | PipelinePlan | None = None
        error = None
        try:
            if s == 1:
                result = one_stage(share)
            else:
                result = solve_pipeline(
                    request, s, Deadline(share), store=store, progress=progress, stage_mesh_shape=None
                )
        except AutoparError as exc:
            error = f"[{exc.code}] {exc.message}"
        rows.append(_row(s, result, time.perf_counter() - t0, error))
        if result is not None and (best is None or result.iteration_time_s < best.iteration_time_s):
            best = result
    if best is None:
        raise TimeLimitError(
            "time_limit",
            "no number of stages found a verified plan in the time limit: "
            + "; ".join(f"{r['stages']}: {r.get('error')}" for r in rows)
            + "; give more time (--time-limit) or name --stages",
            phase="stage_search",
        )
    best.diagnostics["stage_search"] = rows
    return best


def stage_search_text(rows: list[dict[str, Any]]) -> str:
    """The ``stage search:`` lines: per number of stages, its iteration, memory and gap, or why
    it has no plan."""
    from autopar.ir.plan import format_bytes

    lines = ["stage search (each number of stages with its share of the time limit):"]
    for r in rows:
        if "iteration_time_s" in r:
            gap = "" if r.get("gap") is None else f", gap {100 * r['gap']:.1f} %"
            lines.append(
                f"  {r['stages']:>2} stage(s) x {r['mesh_shape']}: "
                f"iteration {r['iteration_time_s'] * 1e3:.2f} ms, "
                f"{format_bytes(r['memory_per_device_bytes'])}/dev{gap} ({r['wall_s']:.1f} s)"
            )
        else:
            lines.append(f"  {r['stages']:>2} stage(s): no plan: {r.get('error')} ({r['wall_s']:.1f} s)")
    return "\n".join(lines) + "\n"
