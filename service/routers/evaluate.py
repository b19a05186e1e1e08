"""``POST /v1/evaluate``: the independent evaluator on a given plan."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from autopar.errors import AutoparError, PlanError
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan, check_plan_graph
from autopar.pipeline.plan import FORMAT as PIPELINE_FORMAT
from autopar_service import schemas
from autopar_service.body import BodyRoute, graph_object_budget, parse_json_model
from autopar_service.cancel import checkpoint
from autopar_service.deps import Auth, Client, ServiceDep
from autopar_service.graphs import parse_graph
from autopar_service.jobs import finite
from autopar_service.openapi import WRITE_ERRORS, json_body, problem_responses
from autopar_service.problems import ApiError
from autopar_service.report_page import check_plan_fits
from autopar_service.requests import EvaluateBody
from autopar_service.routers.common import in_thread_bounded
from autopar_service.state import Service

__all__ = ["check_plan_fits", "router"]

router = APIRouter(route_class=BodyRoute, tags=["plans"])


def _plan_of(data: Any) -> Plan:
    try:
        return Plan.from_dict(data)
    except AutoparError:
        raise
    except Exception as exc:  # the plan reader missed it: still the client's plan
        raise PlanError("bad_plan", f"malformed plan: {type(exc).__name__}: {str(exc)[:200]}") from None


def evaluate_body(service: Service, raw: bytes) -> dict[str, Any]:
    """Parse, check and evaluate (runs in a thread)."""
    from autopar.cost.evaluate import evaluate

    body = parse_json_model(
        EvaluateBody,
        raw,
        service.settings.max_json_depth,
        graph_object_budget(service.settings),
        service.settings.max_graph_item_bytes,
    )
    checkpoint()
    graph = parse_graph(body.graph, service.settings)
    checkpoint()
    if body.plan is not None:
        data = body.plan
    elif body.plan_key is not None:
        record = service.plans.get(body.plan_key)
        if record is None:
            raise ApiError(404, "plan_not_found", f"no plan is cached under {body.plan_key}")
        data = record.data()["plan"]
    else:
        raise ApiError(422, "invalid_request", "give either `plan` or `plan_key`")
    if isinstance(data, dict) and data.get("format") == PIPELINE_FORMAT:
        return evaluate_pipeline_body(graph, data, body)
    plan = _plan_of(data)
    check_plan_graph(graph, plan, "POST /v1/plans")
    check_plan_fits(graph, plan)
    # any plan at another iteration: K and checkpointing as asked, else the plan's own
    plan.training = plan.training.repriced(body.micro_batches, body.checkpointing)
    try:
        result: dict[str, Any] = finite(evaluate(graph, plan).to_dict())
    except AutoparError:
        raise
    except Exception as exc:  # a plan that fits the ports but not the rules (e.g. a bad SBP)
        raise PlanError(
            "plan_unusable", f"the plan cannot be evaluated: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    return result


def evaluate_pipeline_body(graph: Graph, data: dict[str, Any], body: EvaluateBody) -> dict[str, Any]:
    """An ``autopar.pipeline/v1`` plan re-checked on ``graph``
    (:func:`autopar.pipeline.evaluate.evaluate_pipeline`): the 1F1B iteration, the bubble, the
    largest stage's memory and one row per stage, at the plan's K and checkpointing or at the ones
    the body gives."""
    from autopar.pipeline.evaluate import evaluate_pipeline, priced
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
        ev = evaluate_pipeline(graph, plan)
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


@router.post(
    "/v1/evaluate",
    summary="Evaluate a plan",
    operation_id="evaluatePlan",
    response_model=schemas.Evaluation,
    openapi_extra=json_body("EvaluateBody"),
    responses=problem_responses(*WRITE_ERRORS, 404),
)
async def evaluate_plan(request: Request, service: ServiceDep, _auth: Auth, client: Client) -> Response:
    """Recompute validity, step time, iteration time, communication and memory of a plan on its
    graph, at the plan's micro-batches and checkpointing or at the ones the body gives; of an
    `autopar.pipeline/v1` plan, the 1F1B iteration, bubble and one row per stage."""
    raw = await request.body()
    return JSONResponse(await in_thread_bounded(service, lambda: evaluate_body(service, raw), client))
