"""The work of one job, shared by the local solver processes and the RQ workers.

:func:`run_job` loads the graph the API stored under ``graph:{hash}``, rebuilds
the request from the job payload, checks that its plan key equals the job id
(same request, same code versions on API and worker), runs
:func:`autopar_solver.planner.plan` (with ``options.stages`` != 1
:func:`autopar_solver.planner.stage_search.plan_stages`, a pipeline) with the cost-table memo
in the shared store, and
stores the plan record under ``plan:{id}`` (only if cheaper than a stored one).

:func:`error_of` turns any exception into the job's ``error`` dict.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from autopar.cost.remote_tables import RemoteTableBuilder
from autopar.errors import (
    AutoparError,
    ConfigError,
    GraphError,
    InfeasibleError,
    PlanError,
    VerificationError,
    one_line,
)
from autopar.infra.progress import Deadline, ProgressFn
from autopar.infra.store import KeyValueStore
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.pipeline.plan import PipelinePlan
from autopar.pipeline.schedule import one_f_one_b_iteration
from autopar_cache import codec
from autopar_cache.base import PrefixedStore, Store
from autopar_cache.errors import CacheUnavailable
from autopar_cache.plans import PlanCache, plan_key
from autopar_service.jobs import finite
from autopar_service.requests import key_dict_of, request_from_payload, stage_mesh_shape_of
from autopar_service.settings import Settings
from autopar_solver.planner import PlanRequest, Progress, plan

__all__ = [
    "Reporter",
    "error_of",
    "graph_key",
    "iteration_fields",
    "plan_record",
    "run_job",
    "stage_fields",
    "with_retries",
]

T = TypeVar("T")

log = logging.getLogger("autopar.service.tasks")

Reporter = Callable[[dict[str, Any]], None]
"""Receives ``{"phase", "objective", "bound", "elapsed_s"}`` progress dicts."""

_KINDS: tuple[tuple[type[AutoparError], str], ...] = (
    (InfeasibleError, "infeasible_budget"),
    (GraphError, "invalid_graph"),
    (PlanError, "invalid_plan"),
    (ConfigError, "bad_config"),
    (VerificationError, "verification_failed"),
    (CacheUnavailable, "cache_unavailable"),
)


def graph_key(content_hash: str) -> str:
    """Store key of an uploaded graph."""
    return f"graph:{content_hash}"


def error_of(exc: BaseException) -> dict[str, Any]:
    """The job ``error`` dict of ``exc``: ``kind`` (family), ``code``, ``message`` (one line of at
    most :data:`autopar.errors.MAX_LINE` characters: what the explorer, a sweep's table and
    ``autopar submit`` show), details; a message that had to be shortened is kept whole in
    ``full_message``."""
    error = _error_dict(exc)
    message = str(error.get("message", ""))
    shown = one_line(message)
    if shown != message:
        error = {**error, "message": shown, "full_message": message}
    return error


def _error_dict(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, CacheUnavailable):  # its message names the Redis host: keep it in the log
        log.warning("job failed: %s", exc.message)
        return {
            "kind": "cache_unavailable",
            "code": exc.code,
            "message": "the plan cache / job queue was unavailable for too long; submit the request again",
        }
    if isinstance(exc, AutoparError) and exc.code == "graph_missing":
        return finite({"kind": "lost", **exc.to_dict()})  # not the request's fault: a new POST solves
    if isinstance(exc, AutoparError):
        kind = next((k for cls, k in _KINDS if isinstance(exc, cls)), "autopar_error")
        return finite({"kind": kind, **exc.to_dict()})
    return {
        "kind": "internal_error",
        "code": "internal_error",
        "message": f"the solve failed unexpectedly: {type(exc).__name__}: {exc}",
        "traceback": traceback.format_exception_only(type(exc), exc)[-1].strip(),
    }


def with_retries(fn: Callable[[], T], grace_s: float, what: str) -> T:
    """``fn()``, retried with backoff (0.1 s doubling to 2 s) while the cache is unavailable,
    for up to ``grace_s`` seconds: a finished solve outlives a Redis restart."""
    deadline = time.monotonic() + grace_s
    delay = 0.1
    while True:
        try:
            return fn()
        except CacheUnavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("cannot %s yet (%s); retrying in %.1f s", what, exc.code, delay)
            time.sleep(delay)
            delay = min(2 * delay, 2.0)


def iteration_fields(result: Plan | PipelinePlan) -> dict[str, float]:
    """The time fields of a plan record and a job result: one optimizer step as the job runs
    it (K micro-batches plus once per step) and its parts; ``step_time_s`` is deprecated,
    kept one version (one micro-batch with its once-per-step work).

    Of a pipeline: its 1F1B iteration (:func:`autopar.pipeline.schedule.one_f_one_b_iteration`), the
    slowest stage's micro-batch (the pace of the steady state), the largest once-per-step
    work (the stages run it at once after the flush), and the iteration at K = 1 (one
    micro-batch through every stage and back, plus that work)."""
    if isinstance(result, PipelinePlan):
        rows = result.predicted.get("stages") or []
        micro = [float(r["micro_batch_time_s"]) for r in rows]
        once = [float(r["once_per_step_time_s"]) for r in rows]
        return {
            "iteration_time_s": result.iteration_time_s,
            "micro_batch_time_s": max(micro, default=math.nan),
            "once_per_step_s": max(once, default=math.nan),
            "step_time_s": one_f_one_b_iteration(micro, once, 1) if micro else math.nan,
        }
    return {
        "iteration_time_s": result.iteration_time_s,
        "micro_batch_time_s": result.micro_batch_time_s,
        "once_per_step_s": result.once_per_step_s,
        "step_time_s": result.step_time_s,
    }


def stage_fields(result: Plan | PipelinePlan) -> dict[str, Any]:
    """The pipeline fields of a plan record and a job result (none for one stage, whose record
    stays as it was): ``num_stages``, ``bubble_fraction`` and the predicted ``stages`` rows
    (stage, blocks, first and last block, devices, mesh, time per micro-batch, receives,
    once-per-step work, memory per device, stash, micro-batches in flight)."""
    if not isinstance(result, PipelinePlan):
        return {}
    return {
        "num_stages": result.num_stages,
        "bubble_fraction": result.predicted.get("bubble_fraction"),
        "stages": [dict(row) for row in result.predicted.get("stages") or []],
    }


def _first_stage(result: Plan | PipelinePlan) -> Plan:
    """The plan whose mesh and ZeRO stage the record shows: a pipeline's first stage (every
    stage runs on a mesh of that shape)."""
    return result.stages[0] if isinstance(result, PipelinePlan) else result


def plan_record(
    key: str,
    key_dict: dict[str, Any],
    request: PlanRequest,
    result: Plan | PipelinePlan,
    versions: dict[str, str],
) -> dict[str, Any]:
    """What ``GET /v1/plans/{key}`` returns; of a pipeline, ``mesh_shape`` is a stage's and
    ``plan`` the ``autopar.pipeline/v1`` document (:func:`stage_fields` adds its stages)."""
    solver = dict(result.solver or {})
    solver.pop("stats", None)
    # the time this plan was solved with: a request allowing no more is answered by it
    # (requests.answers_within_gap)
    solver["time_limit_s"] = request.options.time_limit_s
    first = _first_stage(result)
    return finite(
        {
            "key": key,
            "created_at": time.time(),
            "graph": {"name": result.graph_name, "hash": result.graph_hash},
            "request": key_dict,
            "versions": versions,
            "mesh_shape": list(first.mesh.shape),
            "zero_stage": first.zero_stage,
            "memory_budget_bytes": request.memory_budget_bytes,
            **iteration_fields(result),
            "memory_per_device_bytes": result.memory_per_device_bytes,
            **stage_fields(result),
            "solver": solver,
            "summary": _summary_text(result),
            "plan": result.to_dict(),
        }
    )


def _summary_text(result: Plan | PipelinePlan) -> str:
    """The plan's summary, with every number of stages ``--stages auto`` tried (its row, or
    why it has no plan), as ``autopar plan`` prints them."""
    from autopar_solver.planner.stage_search import stage_search_text

    rows = result.diagnostics.get("stage_search")
    text = result.summary()
    return text + "\n" + stage_search_text(list(rows)).rstrip("\n") if rows else text


def _plan_stages(request: PlanRequest, store: KeyValueStore, progress: ProgressFn) -> Plan | PipelinePlan:
    """The plan of a request with ``options.stages`` != 1
    (:func:`autopar_solver.planner.stage_search.plan_stages`), within its time limit: S > 1
    stages on the stage mesh shape the client named (:class:`ServiceRequest`), or ``auto``,
    whose one-stage candidate takes the request's own mesh shape."""
    from autopar_solver.planner.stage_search import plan_stages

    stages = request.options.stages
    shape = stage_mesh_shape_of(request) if stages is not None else request.mesh_shape
    whole = dataclasses.replace(request, mesh_shape=None)
    deadline = Deadline(request.options.time_limit_s)
    return plan_stages(whole, stages, deadline, store=store, progress=progress, stage_mesh_shape=shape)


class _Throttle:
    """Forward progress at most every ``interval_s``, but always on a phase change or ``done``."""

    def __init__(self, report: Reporter, interval_s: float = 0.2) -> None:
        self.report = report
        self.interval_s = interval_s
        self.last_time = 0.0
        self.last_phase: str | None = None

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        phase = str(p.phase)
        major = phase.split(":", 1)[0]
        if major == self.last_phase and now - self.last_time < self.interval_s and phase != "done":
            return
        self.last_time, self.last_phase = now, major
        self.report(
            finite(
                {
                    "phase": phase,
                    "objective": p.objective,
                    "bound": p.bound,
                    "elapsed_s": p.elapsed_s,
                }
            )
        )


def run_job(
    job_id: str,
    payload: dict[str, Any],
    store: Store,
    settings: Settings,
    versions: dict[str, str],
    report: Reporter,
    remote_tables: RemoteTableBuilder | None = None,
) -> dict[str, Any]:
    """Solve the job and store its plan; return the short result for the job record.
    ``remote_tables`` builds missing cost-table entries on the other workers (RQ).

    Raises the planner's errors (:class:`InfeasibleError`, ...) and
    :class:`ConfigError` ``version_mismatch`` when this process runs other code
    than the API that computed the job id.
    """
    report({"phase": "loading", "objective": None, "bound": None, "elapsed_s": 0.0})
    graph = _load_job_graph(payload, store, settings)
    request = request_from_payload(payload, graph)
    key_dict = key_dict_of(request)
    _check_job_key(job_id, plan_key(key_dict, versions), payload, versions)
    plans = PlanCache(store, settings.plan_ttl_s)
    hint: Plan | None = None
    if payload.get("refresh") and request.options.stages == 1:
        cached = plans.get(job_id)
        if cached is not None:
            hint = Plan.from_dict(cached.data()["plan"])
    costs = PrefixedStore(store, "cost:", settings.cost_ttl_s, tolerant=True)
    t0 = time.perf_counter()
    result: Plan | PipelinePlan
    if request.options.stages != 1:
        result = _plan_stages(request, costs, _Throttle(report))
    else:
        # refresh: solve again (from the solve memo's entry and the cached plan), not recall
        result = plan(
            request,
            store=costs,
            progress=_Throttle(report),
            hint=hint,
            resolve=bool(payload.get("refresh")),
            remote_tables=remote_tables,
        )
    wall = time.perf_counter() - t0
    record = plan_record(job_id, key_dict, request, result, versions)
    # a checkpoint before the plan is stored: an attempt superseded meanwhile stops here (RQ)
    report({"phase": "storing", "objective": None, "bound": None, "elapsed_s": wall})
    stored = with_retries(
        lambda: plans.put(job_id, record, result.iteration_time_s), settings.outage_grace_s, "store the plan"
    )
    log.info("job %s solved in %.2f s (stored=%s)", job_id[:12], wall, stored)
    return _job_result(result, wall, stored)


def _load_job_graph(payload: dict[str, Any], store: Store, settings: Settings) -> Graph:
    """The job's graph from ``store`` (validated); ``ConfigError`` ``graph_missing`` when it
    is no longer stored."""
    raw = with_retries(
        lambda: store.get(graph_key(payload["graph"])), settings.outage_grace_s, "load the graph"
    )
    if raw is None:
        raise ConfigError(
            "graph_missing",
            f"the graph {payload['graph'][:12]}... of this job is no longer stored "
            "(expired or evicted); submit the request again",
        )
    return Graph.from_dict(codec.decode(raw)).validate()


def _check_job_key(job_id: str, key: str, payload: dict[str, Any], versions: dict[str, str]) -> None:
    """``ConfigError`` ``version_mismatch`` unless the payload's request, under this
    process's code ``versions``, has the plan ``key`` ``job_id`` the API computed."""
    if key != job_id:
        theirs = payload.get("versions")
        raise ConfigError(
            "version_mismatch",
            f"this worker runs code versions {versions} but the API computed the job with "
            f"{theirs}; run the same autopar version on API and workers"
            if theirs != versions
            else "the job payload does not describe the job id's request; submit it again",
        )


def _job_result(result: Plan | PipelinePlan, wall: float, stored: bool) -> dict[str, Any]:
    """The short result of a solved job for its job record."""
    solver = result.solver or {}
    return finite(
        {
            **iteration_fields(result),
            "memory_per_device_bytes": result.memory_per_device_bytes,
            "mesh_shape": list(_first_stage(result).mesh.shape),
            **({"num_stages": result.num_stages} if isinstance(result, PipelinePlan) else {}),
            "solver_status": solver.get("status"),
            "gap": solver.get("gap"),
            "objective": solver.get("objective"),
            "bound": solver.get("bound"),
            "solve_wall_s": wall,
            "stored": stored,
        }
    )
