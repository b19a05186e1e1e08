"""``POST /v1/evaluate``: the independent evaluator on a given plan."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from autopar.errors import AutoparError, PlanError
from autopar.graph import Graph
from autopar.plan import Plan, check_plan_graph
from autopar_service import schemas
from autopar_service.body import BodyRoute, graph_object_budget, parse_json_model
from autopar_service.cancel import checkpoint
from autopar_service.deps import Auth, Client, ServiceDep
from autopar_service.graphs import parse_graph
from autopar_service.jobs import finite
from autopar_service.openapi import WRITE_ERRORS, json_body, problem_responses
from autopar_service.problems import ApiError
from autopar_service.requests import EvaluateBody
from autopar_service.routers.common import in_thread_bounded
from autopar_service.state import Service

__all__ = ["check_plan_fits", "router"]

router = APIRouter(route_class=BodyRoute, tags=["plans"])


def check_plan_fits(graph: Graph, plan: Plan) -> None:
    """Raise :class:`PlanError` naming the first op the plan lacks or whose ports differ."""
    for op in graph.ops:
        ports = plan.ports.get(op.name)
        if ports is None:
            raise PlanError("plan_mismatch", f"the plan has no signature for op {op.name!r}", op=op.name)
        if list(op.inputs) != ports[0] or list(op.outputs) != ports[1]:
            raise PlanError(
                "plan_mismatch",
                f"op {op.name!r}: the plan's ports {ports} differ from the graph's "
                f"({list(op.inputs)}, {list(op.outputs)})",
                op=op.name,
            )


def _plan_of(data: Any) -> Plan:
    try:
        return Plan.from_dict(data)
    except AutoparError:
        raise
    except Exception as exc:  # the plan reader missed it: still the client's plan
        raise PlanError("bad_plan", f"malformed plan: {type(exc).__name__}: {str(exc)[:200]}") from None


def evaluate_body(service: Service, raw: bytes) -> dict[str, Any]:
    """Parse, check and evaluate (runs in a thread)."""
    from autopar.evaluate import evaluate

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
        plan = _plan_of(body.plan)
    elif body.plan_key is not None:
        record = service.plans.get(body.plan_key)
        if record is None:
            raise ApiError(404, "plan_not_found", f"no plan is cached under {body.plan_key}")
        plan = _plan_of(record.data()["plan"])
    else:
        raise ApiError(422, "invalid_request", "give either `plan` or `plan_key`")
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
    graph, at the plan's micro-batches and checkpointing or at the ones the body gives."""
    raw = await request.body()
    return JSONResponse(await in_thread_bounded(service, lambda: evaluate_body(service, raw), client))
