"""``GET /v1/jobs/{id}`` (long-poll), ``GET /v1/jobs/{id}/events`` (SSE) and ``DELETE /v1/jobs/{id}``."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from autopar_cache.errors import CacheUnavailable
from autopar_service import schemas
from autopar_service.deps import Auth, Client, Key, ServiceDep
from autopar_service.jobs import JobInfo, JobStatus
from autopar_service.openapi import problem_responses
from autopar_service.problems import ApiError
from autopar_service.routers.common import deadline_after, known_job
from autopar_service.streams import CountedEventSource

__all__ = ["SSE_PERIOD_S", "router"]

router = APIRouter(tags=["jobs"])

SSE_EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["progress", "end", "error"]},
        "id": {"type": "string"},
        "data": {"type": "string", "description": "The job as JSON (JobView); for `error`, code and detail."},
    },
    "required": ["data"],
}
"""One server-sent event (OpenAPI 3.1 describes each event of a ``text/event-stream``)."""

SSE_PERIOD_S = 5.0
"""Longest gap between two server-sent events of a running job, seconds."""


@router.get(
    "/v1/jobs/{job_id}",
    summary="Job status",
    operation_id="getJob",
    response_model=schemas.JobView,
    responses=problem_responses(401, 404, 422, 503),
)
async def get_job(
    job_id: Key,
    service: ServiceDep,
    _auth: Auth,
    wait: Annotated[
        float, Query(ge=0, le=600, description="Long-poll: wait up to N s for the job to end.")
    ] = 0,
    since: Annotated[
        int | None, Query(ge=-1, le=2**62, description="Long-poll: return once the version passes this.")
    ] = None,
) -> Response:
    """Status, phase, objective, bound, gap and elapsed time; a plan link when done."""
    deadline = deadline_after(wait, service)
    info = await known_job(service, job_id)
    if wait > 0 and not info.terminal:
        after = (1 << 62) if since is None else since
        info = await service.jobs.wait(job_id, max(0.0, deadline - time.monotonic()), after) or info
    headers = {"Content-Location": f"/v1/plans/{job_id}"} if info.status is JobStatus.SUCCEEDED else {}
    if not info.terminal:
        headers["Retry-After"] = str(service.settings.retry_after_s)
    return JSONResponse(info.view(), headers=headers)


@router.get(
    "/v1/jobs/{job_id}/events",
    summary="Job progress as server-sent events",
    operation_id="jobEvents",
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "`event: progress` with the job as JSON on every change; "
            "`event: end` with the final job.",
            "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
        },
        **problem_responses(401, 404, 422, 429, 503),
    },
)
async def job_events(job_id: Key, service: ServiceDep, _auth: Auth, client: Client) -> EventSourceResponse:
    """Stream progress until the job succeeds, fails or is canceled.

    One client may hold ``max_streams_per_client`` streams open, the server ``max_streams``
    (429 ``too_many_streams`` beyond); a stream waits for changes without holding a thread.
    """
    first = await known_job(service, job_id)
    release = service.streams.take(client)

    async def stream() -> AsyncIterator[ServerSentEvent]:
        # an event on every change, and at least every SSE_PERIOD_S (elapsed time moves on)
        info: JobInfo | None = first
        while info is not None:
            event = "end" if info.terminal else "progress"
            yield ServerSentEvent(data=json.dumps(info.view()), event=event, id=str(info.version))
            if info.terminal:
                return
            try:
                info = await service.jobs.wait(job_id, SSE_PERIOD_S, info.version)
            except CacheUnavailable as exc:
                yield ServerSentEvent(
                    data=json.dumps({"code": exc.code, "detail": "retry later"}), event="error"
                )
                return

    return CountedEventSource(
        stream(),
        sep="\n",
        ping=15,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        on_close=release,
    )


@router.delete(
    "/v1/jobs/{job_id}",
    summary="Cancel your request for a job",
    operation_id="cancelJob",
    response_model=schemas.JobView,
    responses=problem_responses(401, 403, 404, 409, 422, 503),
)
async def cancel_job(job_id: Key, service: ServiceDep, _auth: Auth, client: Client) -> Response:
    """Withdraw your request; the job is canceled when no other client is waiting for it.

    Only a client that submitted the job may do this (403 otherwise).
    """
    info = await service.jobs.get(job_id)
    if info is None:
        raise ApiError(404, "job_not_found", f"no job {job_id}; it never existed or its record expired")
    if info.status is JobStatus.SUCCEEDED:
        raise ApiError(
            409, "job_finished", "the job already succeeded; its plan is cached", plan=f"/v1/plans/{job_id}"
        )
    if info.terminal:
        return JSONResponse(info.view())
    if service.admission.release(client, job_id):
        info = await service.jobs.cancel(job_id) or info
    return JSONResponse(info.view())
