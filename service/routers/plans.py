"""``POST /v1/plans`` (cache hit or job) and ``GET /v1/plans/{key}``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from autopar.ir.graph import Graph
from autopar_cache.plans import PlanRecord, plan_key
from autopar_service.body import BodyRoute, graph_object_budget, parse_json_model
from autopar_service.cancel import checkpoint
from autopar_service.deps import Auth, Client, Key, PlanReadAuth, ServiceDep
from autopar_service.graphs import check_rules, parse_graph, shared_graph_data
from autopar_service.jobs import JobStatus
from autopar_service.openapi import JOB_LINKS, PLAN_LINKS, WRITE_ERRORS, json_body, problem_responses, ref
from autopar_service.problems import ApiError
from autopar_service.requests import (
    PlanBody,
    answers_within_gap,
    build_request,
    cluster_of,
    key_dict_of,
    payload_of,
)
from autopar_service.routers.common import (
    deadline_after,
    etag_matches,
    in_thread_bounded,
    plan_response,
    refuse_known_failure,
    settle,
)
from autopar_service.state import Service

__all__ = ["Prepared", "prepare", "router"]

router = APIRouter(route_class=BodyRoute, tags=["plans"])


@dataclass
class Prepared:
    """A parsed plan request, ready to submit."""

    key: str
    payload: dict[str, Any]
    cached: PlanRecord | None
    """The cached plan, when there is one (and no refresh was asked)."""
    graph_data: dict[str, Any]
    """The graph as the workers get it (no request-specific name or metadata)."""
    graph: Graph


def prepare(service: Service, raw: bytes, refresh: bool) -> Prepared:
    """Parse and validate a plan body; its key, cached plan and job payload (runs in a thread)."""
    settings = service.settings
    body = parse_json_model(
        PlanBody, raw, settings.max_json_depth, graph_object_budget(settings), settings.max_graph_item_bytes
    )
    checkpoint()
    graph = parse_graph(body.graph, settings)
    checkpoint()
    cluster = cluster_of(body.cluster, body.preset, settings.max_devices)
    request = build_request(
        graph, cluster, body.mesh_shape, body.memory_budget_bytes, body.zero_stage, body.options, settings
    )
    key_dict = key_dict_of(request)
    key = plan_key(key_dict, service.versions)
    checkpoint()
    payload = payload_of(request, service.versions, graph_hash=key_dict["graph"])
    cached = None if refresh else service.plans.get(key)
    if cached is not None and not answers_within_gap(cached.data(), request):
        cached = None  # a larger gap than asked: solved again, from it (the solve memo)
    return Prepared(key, payload, cached, shared_graph_data(body.graph, key_dict["graph"]), graph)


async def _check_new(service: Service, key: str, prepared: Prepared, client: str) -> None:
    """Before a new job: every op's rule must read the graph; then store the graph for the workers."""
    try:
        await in_thread_bounded(service, lambda: check_rules(prepared.graph), client)
    except Exception:
        service.admission.owners.pop(key, None)  # no job will exist
        raise
    await run_in_threadpool(service.store_graph, prepared.graph_data, prepared.payload["graph"])


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
    deadline = deadline_after(wait, service)
    raw = await request.body()
    digest = hashlib.blake2b(raw, digest_size=20).hexdigest()
    if not refresh:
        hit = await run_in_threadpool(service.cached_body, digest)
        if hit is not None:
            service.metrics.cache(True)
            return plan_response(hit)
    await service.admission.precheck(client, service.jobs, parsing=service.parsing.get(client, 0))
    prepared = await in_thread_bounded(service, lambda: prepare(service, raw, refresh), client)
    key = prepared.key
    if prepared.cached is not None:
        service.bodies.put(digest, key)
        service.metrics.cache(True)
        return plan_response(prepared.cached)
    if not refresh:
        await refuse_known_failure(service, key)
    existing = await service.jobs.get(key)
    new = existing is None or existing.terminal  # a refresh of a running job joins it
    await service.admission.admit(client, key, service.jobs, new=new)
    service.metrics.cache(False)
    if new:
        await _check_new(service, key, prepared, client)
    info = await service.jobs.submit(key, prepared.payload, refresh=refresh)
    if info.status is JobStatus.SUCCEEDED and not refresh:
        # the job finished but its plan was evicted: solve again
        await run_in_threadpool(service.store_graph, prepared.graph_data, prepared.payload["graph"])
        info = await service.jobs.submit(key, prepared.payload, refresh=True)
    return await settle(service, key, info, deadline)


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
async def get_plan(request: Request, key: Key, service: ServiceDep, _auth: PlanReadAuth) -> Response:
    """The plan stored under ``key`` (a job id); immutable, with an ETag (weak tags match too)."""
    record = await run_in_threadpool(service.plans.get, key)
    if record is None:
        raise ApiError(404, "plan_not_found", f"no plan is cached under {key}; POST /v1/plans to make one")
    if etag_matches(request.headers.get("if-none-match", ""), record.etag):
        return Response(status_code=304, headers={"ETag": record.etag})
    return plan_response(record)
