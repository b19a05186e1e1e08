"""Response helpers shared by the routers: plans with ETags (and the caller's graph name), jobs,
waiting, work in the service's worker processes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from autopar_cache.plans import PlanRecord
from autopar_service.body import Body
from autopar_service.jobs import DETERMINISTIC_ERRORS, JobInfo, JobStatus
from autopar_service.problems import ApiError, from_job_error
from autopar_service.state import Service

__all__ = [
    "etag_matches",
    "in_worker",
    "job_response",
    "known_job",
    "named_record",
    "plan_response",
    "refuse_known_failure",
    "settle",
]

T = TypeVar("T")
_NEVER = 1 << 62
"""``after_version`` that no change passes: wait for the job to end."""


def plan_response(record: PlanRecord, status: int = 200) -> Response:
    return Response(
        record.body,
        status_code=status,
        media_type="application/json",
        headers={
            "ETag": record.etag,
            "Content-Location": f"/v1/plans/{record.key}",
            "Cache-Control": "private, max-age=31536000, immutable",
        },
    )


def etag_matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison: ``W/"x"`` matches ``"x"``; ``*`` matches anything."""
    if if_none_match.strip() == "*":
        return True
    opaque = etag.removeprefix("W/")
    return any(t.strip().removeprefix("W/") == opaque for t in if_none_match.split(","))


def job_response(service: Service, info: JobInfo, status: int = 202) -> Response:
    headers = {"Location": f"/v1/jobs/{info.id}"}
    if not info.terminal:
        headers["Retry-After"] = str(service.settings.retry_after_s)
    return JSONResponse(info.view(), status_code=status, headers=headers)


async def in_worker(
    service: Service,
    client: str,
    task: Callable[..., T],
    *args: Any,
    body: Body | None = None,
    parse: bool = True,
    timeout_s: float | None = None,
) -> T:
    """``task(context, *args[, body=body])`` in a worker process of the service's pool
    (:mod:`autopar_service.work_pool`: a FIFO per client served in turn; 429 ``too_many_parses``
    past ``max_parses_per_client`` jobs of one client, 429 ``server_busy`` when no worker frees
    within ``max_parse_s``, 503 ``parse_timeout`` past ``timeout_s``, its worker killed).

    A body's parse (``parse``) counts toward its client's unfinished jobs while it runs (it may
    start one); the body is handed to the pool and no longer held here.
    """
    run = service.pool.run(client, task, *args, body=body, timeout_s=timeout_s, versions=service.versions)
    del body  # the pool's job holds it until it is sent, then nothing does
    with service.parsing_by(client if parse else None):
        value: T = await run
        return value


_NEUTRAL_NAME = re.compile(rb'"graph":\{"name":"(graph-[0-9a-f]{12})"')
"""Where a record names its graph when it is no bundled model's (near the record's start)."""


def named_record(record: PlanRecord, name: str | None) -> PlanRecord:
    """``record`` as the answer to a request that gives its graph ``name``: the shared record's
    ``graph-{hash}`` written ``name`` (graph, plan, summary); a bundled model's plan keeps its
    model's name (:func:`autopar_service.graphs.request_graph_name` decides which names show)."""
    if name is None:
        return record
    found = _NEUTRAL_NAME.search(record.body, 0, 4096)
    return record.renamed(found.group(1).decode(), name) if found is not None else record


async def refuse_known_failure(service: Service, key: str) -> None:
    """Answer a request whose job already failed deterministically with that failure (no new solve)."""
    existing = await service.jobs.get(key)
    if (
        existing is not None
        and existing.status is JobStatus.FAILED
        and (existing.error or {}).get("kind") in DETERMINISTIC_ERRORS
    ):
        raise from_job_error(key, existing.error or {})


async def settle(
    service: Service, key: str, info: JobInfo, deadline: float, name: str | None = None
) -> Response:
    """200 with the plan (its graph called ``name``: :func:`named_record`), 422 for a
    deterministic failure, else 202 with the job.

    Waits for the job until ``deadline`` (``time.monotonic()``), never longer.
    """
    remaining = deadline - time.monotonic()
    if remaining > 0 and not info.terminal:
        info = await service.jobs.wait(key, remaining, after_version=_NEVER) or info
    if info.status is JobStatus.SUCCEEDED:
        record = await run_in_threadpool(service.plans.get, key)
        if record is not None:
            return plan_response(named_record(record, name))
    if info.status is JobStatus.FAILED and (info.error or {}).get("kind") in DETERMINISTIC_ERRORS:
        raise from_job_error(key, info.error or {})
    return job_response(service, info)


async def known_job(service: Service, job_id: str) -> JobInfo:
    """The job; a succeeded one when only its plan is left; a failed one when the backend lost it.

    A job this process submitted whose record is gone (Redis restarted without
    persistence) ends ``failed`` with the reason, rather than vanishing (404).
    """
    info = await service.jobs.get(job_id)
    if info is not None:
        return info
    if await run_in_threadpool(service.plans.get, job_id) is not None:
        return JobInfo(job_id, JobStatus.SUCCEEDED, phase="done", version=1)
    if job_id in service.admission.owners:
        if not service.admission.lost(job_id):
            # the backend has no record yet; a worker solving it puts it back within a heartbeat
            return JobInfo(job_id, JobStatus.QUEUED, phase="recovering", version=0)
        error = {
            "kind": "lost",
            "code": "job_lost",
            "message": "the job queue lost this job (Redis restarted without its data); "
            "submit the request again",
        }
        return JobInfo(job_id, JobStatus.FAILED, error=error, version=1)
    raise ApiError(404, "job_not_found", f"no job {job_id}; it never existed or its record expired")


def deadline_after(wait_s: float, service: Service) -> float:
    """The monotonic time a request asking to wait ``wait_s`` must answer by."""
    return time.monotonic() + min(wait_s, service.settings.max_wait_s)
