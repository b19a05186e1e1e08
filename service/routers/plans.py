"""``POST /v1/plans`` (cache hit or job), ``GET /v1/plans/{key}`` and ``GET /v1/plan-keys``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from autopar_service import schemas, work_tasks
from autopar_service.body import BodyRoute, DecodedRequest
from autopar_service.deps import Auth, Client, Key, PlanReadAuth, ServiceDep
from autopar_service.graphs import MAX_NAME_CHARS, shown_name
from autopar_service.jobs import JobStatus
from autopar_service.openapi import JOB_LINKS, PLAN_LINKS, WRITE_ERRORS, json_body, problem_responses, ref
from autopar_service.problems import ApiError
from autopar_service.requests import key_context
from autopar_service.routers.common import (
    deadline_after,
    etag_matches,
    in_worker,
    named_record,
    plan_response,
    refuse_known_failure,
    settle,
)

__all__ = ["router"]

router = APIRouter(route_class=BodyRoute, tags=["plans"])


@router.post(
    "/v1/plans",
    summary="Request a plan",
    operation_id="createPlan",
    status_code=202,
    openapi_extra=json_body("PlanBody"),
    responses={
        200: {
            "description": "Cache hit: the plan.",
            "content": {"application/json": {"schema": ref("PlanRecordView")}},
            "links": PLAN_LINKS,
        },
        202: {
            "description": "Accepted: a job solves it (Location: /v1/jobs/{id}, Retry-After).",
            "content": {"application/json": {"schema": ref("JobView")}},
            "links": JOB_LINKS,
        },
        **problem_responses(*WRITE_ERRORS),
    },
    response_class=Response,
)
async def create_plan(
    request: Request,
    service: ServiceDep,
    _auth: Auth,
    client: Client,
    wait: Annotated[float, Query(ge=0, le=600, description="Seconds to wait for the solve.")] = 0,
    refresh: Annotated[bool, Query(description="Solve again (warm-started) even if cached.")] = False,
) -> Response:
    """Return the cached plan (200) or start / join the job that solves it (202)."""
    assert isinstance(request, DecodedRequest)
    deadline = deadline_after(wait, service)
    service.pool.check_room(client, body_unread=True)  # at its bound: refused before its body is read
    digest = await request.digest()
    if not refresh:
        hit = await run_in_threadpool(service.cached_body, digest)
        if hit is not None:
            service.metrics.cache(True)
            return plan_response(named_record(*hit))
    await service.admission.precheck(client, service.jobs, parsing=service.parsing.get(client, 0))
    # parsed in a worker process: the body goes there (in_worker's ``body`` is the last
    # reference this process keeps, dropped as the body is sent)
    prepared = await in_worker(
        service, client, work_tasks.prepare_plan, refresh, body=await request.take_body()
    )
    key = prepared.key
    if prepared.cached:
        record = await run_in_threadpool(service.plans.get, key)
        if record is not None:
            service.bodies.put(digest, key, prepared.name)
            service.metrics.cache(True)
            return plan_response(named_record(record, prepared.name))
    if not refresh:
        await refuse_known_failure(service, key)
    existing = await service.jobs.get(key)
    new = existing is None or existing.terminal  # a refresh of a running job joins it
    await service.admission.admit(client, key, service.jobs, new=new)
    service.metrics.cache(False)
    content_hash = prepared.payload["graph"]
    if new:
        await run_in_threadpool(service.store_graph, prepared.graph_blob, content_hash)
    info = await service.jobs.submit(key, prepared.payload, refresh=refresh)
    if info.status is JobStatus.SUCCEEDED and not refresh:
        record = await run_in_threadpool(service.plans.get, key)
        if record is not None:  # its job ended while this body was parsed
            return plan_response(named_record(record, prepared.name))
        # the job finished but its plan was evicted: solve again
        await run_in_threadpool(service.store_graph, prepared.graph_blob, content_hash)
        info = await service.jobs.submit(key, prepared.payload, refresh=True)
    return await settle(service, key, info, deadline, prepared.name)


@router.get(
    "/v1/plans/{key}",
    summary="Get a cached plan",
    operation_id="getPlan",
    response_class=Response,
    responses={
        200: {"description": "The plan.", "content": {"application/json": {"schema": ref("PlanRecordView")}}},
        304: {"description": "Not modified (If-None-Match)."},
        **problem_responses(401, 404, 422, 503),
    },
)
async def get_plan(
    request: Request,
    key: Key,
    service: ServiceDep,
    _auth: PlanReadAuth,
    name: Annotated[
        str | None,
        Query(
            max_length=MAX_NAME_CHARS,
            description="The name to show for the graph (the stored plan is shared and names a graph "
            "`graph-{hash}`; a bundled model's plan keeps its model's name).",
        ),
    ] = None,
) -> Response:
    """The plan stored under ``key`` (a job id); immutable, with an ETag (weak tags match too)."""
    record = await run_in_threadpool(service.plans.get, key)
    if record is None:
        raise ApiError(404, "plan_not_found", f"no plan is cached under {key}; POST /v1/plans to make one")
    record = named_record(record, shown_name(name))
    if etag_matches(request.headers.get("if-none-match", ""), record.etag):
        return Response(status_code=304, headers={"ETag": record.etag})
    return plan_response(record)


@router.get(
    "/v1/plan-keys",
    summary="What a plan key folds in besides the request",
    operation_id="getPlanKeyContext",
    response_model=schemas.KeyContextView,
    responses=problem_responses(401, 503),
)
async def plan_key_context(service: ServiceDep, _auth: Auth) -> dict[str, Any]:
    """The code versions and option defaults this service keys plans with
    (:class:`autopar.ir.plan_key.KeyContext`): with them a client computes a request's plan key
    itself and asks for the plan by key (``GET /v1/plans/{key}``) before uploading its graph."""
    return key_context(service.settings, service.versions).to_dict()
