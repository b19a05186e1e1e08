"""Response helpers shared by the routers: plans with ETags, jobs, waiting, parsing off the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from autopar_cache.plans import PlanRecord
from autopar_service.cancel import CancelToken
from autopar_service.jobs import DETERMINISTIC_ERRORS, JobInfo, JobStatus
from autopar_service.problems import ApiError, from_job_error
from autopar_service.state import Service

__all__ = [
    "etag_matches",
    "in_thread_bounded",
    "job_response",
    "known_job",
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


def _busy(code: str, detail: str, retry_after_s: int) -> ApiError:
    return ApiError(429, code, detail, headers={"Retry-After": str(retry_after_s)})


async def in_thread_bounded(service: Service, fn: Callable[[], T], client: str | None = None) -> T:
    """``fn()`` in a worker thread, at most ``max_concurrent_parses`` at once, and at most
    ``max_parses_per_client`` of one ``client`` (429 ``too_many_parses`` at once beyond).

    429 ``server_busy`` when no slot frees within ``max_parse_s``; 503 ``parse_timeout`` when
    ``fn`` then takes longer than ``max_parse_s``.  A timed-out parse frees its slot at once
    and is canceled: it stops at its next phase (:func:`autopar_service.cancel.checkpoint`),
    each phase bounded by the body's pre-parse limits.
    """
    settings = service.settings
    if client is not None and service.parsing.get(client, 0) >= settings.max_parses_per_client:
        raise _busy(
            "too_many_parses",
            f"you have {settings.max_parses_per_client} request bodies being parsed, the most one "
            "client may have; wait for one to be answered",
            settings.retry_after_s,
        )
    with service.parsing_by(client):
        return await _in_slot(service, fn)


async def _in_slot(service: Service, fn: Callable[[], T]) -> T:
    settings = service.settings
    slots = service.parse_slots
    try:
        await asyncio.wait_for(slots.acquire(), settings.max_parse_s)
    except asyncio.TimeoutError:
        raise _busy(
            "server_busy",
            f"the server is parsing {settings.max_concurrent_parses} request bodies, its limit; retry later",
            settings.retry_after_s,
        ) from None
    token = CancelToken()
    work = asyncio.ensure_future(run_in_threadpool(token.run, fn))

    def finished(done: asyncio.Future[T]) -> None:
        if not done.cancelled():
            done.exception()  # retrieved: a failure after a 503 is not "never retrieved"

    work.add_done_callback(finished)
    try:
        return await asyncio.wait_for(asyncio.shield(work), settings.max_parse_s)
    except asyncio.CancelledError:  # the request itself was dropped: nobody waits for the parse
        token.cancel()
        raise
    except asyncio.TimeoutError:
        token.cancel()
        service.metrics.parse_canceled()
        raise ApiError(
            503,
            "parse_timeout",
            f"parsing and checking the body took more than {settings.max_parse_s:.0f} s; "
            "send a smaller graph or retry later",
            headers={"Retry-After": str(settings.retry_after_s)},
        ) from None
    finally:
        slots.release()


async def refuse_known_failure(service: Service, key: str) -> None:
    """Answer a request whose job already failed deterministically with that failure (no new solve)."""
    existing = await service.jobs.get(key)
    if (
        existing is not None
        and existing.status is JobStatus.FAILED
        and (existing.error or {}).get("kind") in DETERMINISTIC_ERRORS
    ):
        raise from_job_error(key, existing.error or {})


async def settle(service: Service, key: str, info: JobInfo, deadline: float) -> Response:
    """200 with the plan, 422 for a deterministic failure, else 202 with the job.

    Waits for the job until ``deadline`` (``time.monotonic()``), never longer.
    """
    remaining = deadline - time.monotonic()
    if remaining > 0 and not info.terminal:
        info = await service.jobs.wait(key, remaining, after_version=_NEVER) or info
    if info.status is JobStatus.SUCCEEDED:
        record = await run_in_threadpool(service.plans.get, key)
        if record is not None:
            return plan_response(record)
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
