"""``POST /v1/evaluate``: the independent evaluator on a given plan."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from autopar_service import schemas, work_tasks
from autopar_service.body import BodyRoute, DecodedRequest
from autopar_service.deps import Auth, Client, ServiceDep
from autopar_service.openapi import WRITE_ERRORS, json_body, problem_responses
from autopar_service.report_page import check_plan_fits
from autopar_service.routers.common import in_worker

__all__ = ["check_plan_fits", "router"]

router = APIRouter(route_class=BodyRoute, tags=["plans"])


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
    assert isinstance(request, DecodedRequest)
    service.pool.check_room(client, body_unread=True)  # at its bound: refused before its body is read
    # parsed, checked and evaluated in a worker process (autopar_service.work_tasks.evaluate_plan)
    result = await in_worker(service, client, work_tasks.evaluate_plan, body=await request.take_body())
    return JSONResponse(result)
