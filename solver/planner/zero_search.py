"""``--zero auto``: the ZeRO stage searched, as a user of the runtime would try it.

Which ZeRO stage is fastest depends on the layout and the budget: sharding the parameters too
(ZeRO-3, Megatron-FSDP's choice) frees their memory for less tensor parallelism or less
recomputation, at the price of gathering them every micro-batch; sharding only the optimizer
states (ZeRO-1, Megatron-LM's distributed optimizer) gathers once per step.  The stage changes the
memory rows and the once-per-micro-batch work of every variable, so each is its own problem:
:func:`plan_zero_stages` solves the stages of :data:`ZERO_AUTO` one after the other, each with an
equal share of the time left (a solve that reaches its gap early leaves its time to the next), and
keeps the fastest verified plan as its runtime runs it (``achieved_iteration_time_s``: ZeRO-3's
per-micro-batch gathers are partly hidden behind the forward under ``megatron-lm``).  Its bound is
the least of the stages' proven bounds (of the iteration as solved), so the gap it reports is over
every stage tried; a stage without a plan and without a bound leaves the gap unproven (None).
Every row is kept in ``diagnostics["zero_search"]`` and printed (:func:`zero_search_text`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from autopar.errors import AutoparError
from autopar.infra.progress import Deadline
from autopar.ir.plan import Plan
from autopar.pipeline.plan import PipelinePlan

__all__ = ["ZERO_AUTO", "plan_zero_stages", "zero_search_text"]

ZERO_AUTO = (1, 3)
"""The ZeRO stages ``auto`` tries, in order: the optimizer states sharded (gathers and reductions
once per step under ``megatron-lm``), then everything sharded (parameters gathered every
micro-batch).  ZeRO-0 needs more memory than ZeRO-1 for the same work, and ZeRO-2 sits between
the two ends."""

Solve = Callable[[int, Deadline], Plan | PipelinePlan]


def _bound(result: Plan | PipelinePlan) -> float | None:
    """The least iteration ``result``'s solve proved for its ZeRO stage (the stage search's bound
    when it searched stages), or None."""
    solver = result.solver or {}
    bound = solver.get("stage_search_bound", solver.get("bound"))
    return float(bound) if isinstance(bound, (int, float)) and math.isfinite(bound) else None


def plan_zero_stages(stages: tuple[int, ...], solve: Solve, deadline: Deadline) -> Plan | PipelinePlan:
    """The fastest of ``solve(zero, its deadline)`` over ``stages`` (module docstring); the last
    error when none has a plan."""
    rows: list[dict[str, Any]] = []
    best: Plan | PipelinePlan | None = None
    best_zero: int | None = None
    last_error: AutoparError | None = None
    for i, zero in enumerate(stages):
        left = deadline.left()
        share = Deadline(left / (len(stages) - i)) if math.isfinite(left) else Deadline()
        started = time.perf_counter()
        try:
            result = solve(zero, share)
        except AutoparError as exc:
            last_error = exc
            rows.append(
                {"zero_stage": zero, "outcome": "no plan", "error": exc.line(), "wall_s": _since(started)}
            )
            continue
        rows.append(
            {
                "zero_stage": zero,
                "outcome": "solved",
                "iteration_time_s": result.iteration_time_s,
                "achieved_iteration_time_s": result.achieved_iteration_time_s,
                "memory_per_device_bytes": result.memory_per_device_bytes,
                "bound_s": _bound(result),
                "wall_s": _since(started),
            }
        )
        if best is None or result.achieved_iteration_time_s < best.achieved_iteration_time_s:
            best, best_zero = result, zero
    if best is None:
        assert last_error is not None
        raise last_error
    for row in rows:
        row["chosen"] = row["zero_stage"] == best_zero
    best.diagnostics["zero_search"] = rows
    bounds = [r.get("bound_s") for r in rows]
    if best.solver is not None and all(b is not None for b in bounds):
        it = best.iteration_time_s
        least = min(min(float(b) for b in bounds if b is not None), it)
        best.solver["zero_search_bound"] = least
        best.solver["zero_search_gap"] = (it - least) / it if it > 0 else 0.0
    return best


def _since(started: float) -> float:
    return time.perf_counter() - started


def zero_search_text(rows: list[dict[str, Any]]) -> str:
    """The ``zero search:`` lines: per ZeRO stage its iteration, memory and bound, or why it has
    no plan."""
    from autopar.ir.plan import format_bytes

    lines = ["zero search (--zero auto; each stage solved in turn with an equal share of the time left):"]
    for r in rows:
        if r["outcome"] == "solved":
            bound = "" if r.get("bound_s") is None else f", bound {r['bound_s'] * 1e3:.2f} ms"
            chosen = " (chosen)" if r.get("chosen") else ""
            lines.append(
                f"  ZeRO-{r['zero_stage']}{chosen}: iteration {r['iteration_time_s'] * 1e3:.2f} ms "
                f"({r['achieved_iteration_time_s'] * 1e3:.2f} ms as the runtime runs it), "
                f"{format_bytes(r['memory_per_device_bytes'])}/dev{bound} ({r['wall_s']:.1f} s)"
            )
        else:
            lines.append(f"  ZeRO-{r['zero_stage']}: no plan: {r['error']} ({r['wall_s']:.1f} s)")
    return "\n".join(lines) + "\n"
