"""The work of requests that runs in the worker processes (:mod:`autopar_service.work_pool`).

Each task is ``task(context, *args, body=raw)``: it reads a request's body (or a cached plan)
and returns small plain data to the API process, never a graph::

    prepare_plan(refresh, body)   POST /v1/plans    -> PreparedPlan: key, job payload, cached?, graph
    evaluate_plan(body)           POST /v1/evaluate -> the evaluator's verdict
    prepare_sweep(body)           POST /v1/sweeps   -> the sweep's id and points (graph and record stored)
    render_report(key, kinds)     GET  /v1/plans/{key}/report -> the HTML page

Every body is parsed by :func:`autopar_service.body.parse_json_model` (depth, size and value
limits before the parse; strict types after) and its graph by
:func:`autopar_service.graphs.parse_graph` (the core's checks and every op's rule).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any

from autopar.errors import AutoparError, PlanError
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan, check_plan_graph
from autopar.pipeline.plan import FORMAT as PIPELINE_FORMAT
from autopar_cache import codec
from autopar_cache.plans import plan_key
from autopar_service.body import graph_object_budget, parse_json_model
from autopar_service.graphs import parse_graph, request_graph_name, shared_graph_data
from autopar_service.jobs import finite
from autopar_service.problems import ApiError
from autopar_service.requests import (
    EvaluateBody,
    PlanBody,
    SweepBody,
    answers_within_gap,
    build_request,
    cluster_of,
    key_dict_of,
    payload_of,
)
from autopar_service.tasks import graph_key
from autopar_service.work_pool import WorkerContext

__all__ = ["PreparedPlan", "evaluate_plan", "prepare_plan", "prepare_sweep", "render_report"]


@dataclass(frozen=True)
class PreparedPlan:
    """A parsed plan request, ready to answer or to submit (what the API process needs of it)."""

    key: str
    payload: dict[str, Any]
    """The job's payload (the resolved request without the graph)."""
    cached: bool
    """A cached plan answers it (and no refresh was asked)."""
    graph_blob: bytes
    """The graph as the workers read it, encoded (:func:`autopar_service.graphs.shared_graph_data`):
    stored when a job solves it (a cached plan evicted in between needs one too)."""
    name: str | None
    """The graph's name as this request gives it, shown in this request's answer; None: the
    stored name (a bundled model's, or ``graph-{hash}``)."""


def _body_of(context: WorkerContext, model: Any, body: bytes) -> Any:
    settings = context.settings
    return parse_json_model(
        model, body, settings.max_json_depth, graph_object_budget(settings), settings.max_graph_item_bytes
    )


def prepare_plan(context: WorkerContext, refresh: bool, *, body: bytes) -> PreparedPlan:
    """``POST /v1/plans``: parse and check the body, key it, look its plan up."""
    settings = context.settings
    request_body = _body_of(context, PlanBody, body)
    del body
    graph = parse_graph(request_body.graph, settings)
    cluster = cluster_of(request_body.cluster, request_body.preset, settings.max_devices)
    request = build_request(
        graph,
        cluster,
        request_body.mesh_shape,
        request_body.memory_budget_bytes,
        request_body.zero_stage,
        request_body.options,
        settings,
    )
    key_dict = key_dict_of(request)
    key = plan_key(key_dict, context.versions)
    payload = payload_of(request, context.versions, graph_hash=key_dict["graph"])
    record = None if refresh else context.plans.get(key)
    cached = record is not None and answers_within_gap(record.data(), request)
    shared = shared_graph_data(request_body.graph, key_dict["graph"])  # a job may still be needed
    return PreparedPlan(
        key, payload, cached, codec.encode(shared), request_graph_name(request_body.graph, key_dict["graph"])
    )


# ------------------------------------------------------------------ POST /v1/evaluate


def _plan_of(data: Any) -> Plan:
    try:
        return Plan.from_dict(data)
    except AutoparError:
        raise
    except Exception as exc:  # the plan reader missed it: still the client's plan
        raise PlanError("bad_plan", f"malformed plan: {type(exc).__name__}: {str(exc)[:200]}") from None


def evaluate_plan(context: WorkerContext, *, body: bytes) -> dict[str, Any]:
    """``POST /v1/evaluate``: parse, check and evaluate."""
    from autopar.cost.evaluate import evaluate
    from autopar_service.report_page import check_plan_fits

    request_body = _body_of(context, EvaluateBody, body)
    del body
    graph = parse_graph(request_body.graph, context.settings)
    if request_body.plan is not None:
        data = request_body.plan
    elif request_body.plan_key is not None:
        record = context.plans.get(request_body.plan_key)
        if record is None:
            raise ApiError(404, "plan_not_found", f"no plan is cached under {request_body.plan_key}")
        data = record.data()["plan"]
    else:
        raise ApiError(422, "invalid_request", "give either `plan` or `plan_key`")
    if isinstance(data, dict) and data.get("format") == PIPELINE_FORMAT:
        return evaluate_pipeline(graph, data, request_body)
    plan = _plan_of(data)
    check_plan_graph(graph, plan, "POST /v1/plans")
    check_plan_fits(graph, plan)
    # any plan at another iteration: K and checkpointing as asked, else the plan's own
    plan.training = plan.training.repriced(request_body.micro_batches, request_body.checkpointing)
    try:
        result: dict[str, Any] = finite(evaluate(graph, plan).to_dict())
    except AutoparError:
        raise
    except Exception as exc:  # a plan that fits the ports but not the rules (e.g. a bad SBP)
        raise PlanError(
            "plan_unusable", f"the plan cannot be evaluated: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    return result


def evaluate_pipeline(graph: Graph, data: dict[str, Any], body: EvaluateBody) -> dict[str, Any]:
    """An ``autopar.pipeline/v1`` plan re-checked on ``graph``
    (:func:`autopar.pipeline.evaluate.evaluate_pipeline`): the 1F1B iteration, the bubble, the
    largest stage's memory and one row per stage, at the plan's K and checkpointing or at the ones
    the body gives."""
    from autopar.pipeline.evaluate import evaluate_pipeline as evaluate_stages
    from autopar.pipeline.evaluate import priced
    from autopar.pipeline.plan import PipelinePlan

    try:
        plan = PipelinePlan.from_dict(data)
    except AutoparError:
        raise
    except Exception as exc:
        raise PlanError(
            "bad_plan", f"malformed pipeline plan: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    if plan.graph_hash and plan.graph_hash != graph.content_hash():
        raise PlanError(
            "plan_graph_mismatch",
            f"the pipeline plan was made for graph {plan.graph_name!r} (content hash "
            f"{plan.graph_hash[:12]}), not for this graph {graph.name!r} ({graph.content_hash()[:12]}); "
            "give the graph the plan was made for, or plan this one: POST /v1/plans",
            plan_graph_hash=plan.graph_hash,
        )
    plan.training = plan.training.repriced(body.micro_batches, body.checkpointing)
    for stage in plan.stages:
        stage.training = stage.training.repriced(body.micro_batches, body.checkpointing)
    try:
        ev = evaluate_stages(graph, plan)
    except AutoparError:
        raise
    except Exception as exc:  # a plan that reads but does not fit the split or the rules
        raise PlanError(
            "plan_unusable", f"the pipeline plan cannot be evaluated: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    predicted = priced(plan, ev).predicted
    return finite(
        {
            "valid": ev.valid,
            "errors": ev.errors,
            "micro_batches": plan.training.micro_batches,
            "checkpointing": plan.training.checkpointing,
            "num_stages": len(ev.stages),
            "iteration_time_s": ev.iteration_time_s,
            "memory_per_device_bytes": ev.memory_per_device_bytes,
            "bubble_fraction": predicted["bubble_fraction"],
            "stages": predicted["stages"],
            # the one-stage fields, not defined for a pipeline: present for the schema
            "step_time_s": None,
            "compute_time_s": None,
            "comm_bytes_per_axis": {},
        }
    )


# ------------------------------------------------------------------ POST /v1/sweeps


def prepare_sweep(context: WorkerContext, *, body: bytes) -> tuple[str, list[dict[str, Any]]]:
    """``POST /v1/sweeps``: parse the sweep, store its graph and record; its id and points."""
    settings = context.settings
    sweep = _body_of(context, SweepBody, body)
    del body
    if sweep.options.stages not in (None, 1):
        raise ApiError(
            422,
            "stages_not_supported",
            f"a sweep plans one stage per point; options.stages {sweep.options.stages!r} is for "
            "POST /v1/plans (one request per number of stages), or leave it out",
        )
    graph = parse_graph(sweep.graph, settings)
    cluster = cluster_of(sweep.cluster, sweep.preset, settings.max_devices)
    product = itertools.product(sweep.mesh_shapes, sweep.memory_budgets_bytes, sweep.zero_stages)
    combos = list(dict.fromkeys((tuple(m) if m else None, b, z) for m, b, z in product))
    if len(combos) > settings.max_sweep_points:
        raise ApiError(
            422,
            "sweep_too_large",
            f"the sweep has {len(combos)} points; this server allows at most "
            f"{settings.max_sweep_points}: split it",
        )
    points: list[dict[str, Any]] = []
    for mesh_shape, budget, zero in combos:
        shape = list(mesh_shape) if mesh_shape else None
        request = build_request(graph, cluster, shape, budget, zero, sweep.options, settings)
        key_dict = key_dict_of(request)
        points.append(
            {
                "mesh_shape": shape,
                "memory_budget_bytes": request.memory_budget_bytes,
                "zero_stage": zero,
                **request.options.training.to_dict(),
                "key": plan_key(key_dict, context.versions),
                "payload": payload_of(request, context.versions, graph_hash=key_dict["graph"]),
            }
        )
    sweep_id = hashlib.sha256("".join(p["key"] for p in points).encode()).hexdigest()
    content_hash = points[0]["payload"]["graph"]
    store = context.store
    shared = codec.encode(shared_graph_data(sweep.graph, content_hash))
    store.put(graph_key(content_hash), shared, settings.job_ttl_s)
    record = [{k: v for k, v in p.items() if k != "payload"} for p in points]
    store.put(f"sweep:{sweep_id}", codec.encode(record), settings.job_ttl_s)
    return sweep_id, points


# ------------------------------------------------------------------ GET /v1/plans/{key}/report


def render_report(context: WorkerContext, key: str, compare: tuple[str, ...]) -> bytes:
    """The HTML report of the plan cached under ``key`` beside the ``compare`` baselines."""
    from autopar.pipeline.plan import PipelinePlan
    from autopar_service.report import baseline_beside, build_pipeline_report, build_report

    record = context.plans.get(key)
    if record is None:
        raise ApiError(404, "plan_not_found", f"no plan is cached under {key}; POST /v1/plans to make one")
    data = record.data()
    graph_hash = (data.get("request") or {}).get("graph") or ""
    raw = context.store.get(graph_key(graph_hash))
    if raw is None:
        raise ApiError(
            404,
            "graph_not_stored",
            f"the graph of plan {key[:12]}... is no longer stored (the service keeps it "
            f"{context.settings.job_ttl_s:.0f} s after a solve); POST /v1/plans with ?refresh=true "
            "to store it again, or run `autopar report GRAPH PLAN` locally",
        )
    graph = Graph.from_dict(codec.decode(raw)).validate()
    if (data.get("plan") or {}).get("format") == PIPELINE_FORMAT:
        # a pipeline: the baselines in its stages (those without a pipeline form say why)
        pipeline = PipelinePlan.from_dict(data["plan"])
        budget = pipeline.memory_budget_bytes or data.get("memory_budget_bytes")
        return build_pipeline_report(graph, pipeline, list(compare), budget).encode()
    plan = Plan.from_dict(data["plan"])
    others = [(kind, baseline_beside(kind, graph, plan)) for kind in compare]  # at the plan's K
    return build_report(
        graph, plan, others, plan.memory_budget_bytes or data.get("memory_budget_bytes")
    ).encode()
