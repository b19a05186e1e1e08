"""``/livez``, ``/readyz`` (no infrastructure addresses) and ``/metrics`` (behind the API key)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from autopar_cache.errors import CacheUnavailable
from autopar_service import schemas
from autopar_service.deps import Auth, ServiceDep
from autopar_service.jobs import finite
from autopar_service.metrics import CONTENT_TYPE_LATEST
from autopar_service.openapi import problem_responses, ref
from autopar_service.state import Service

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/livez", summary="Liveness", operation_id="liveness", response_model=schemas.Liveness)
async def livez() -> dict[str, str]:
    """The process answers."""
    return {"status": "alive"}


async def _cache_check(service: Service) -> dict[str, Any]:
    try:
        await run_in_threadpool(service.store.ping)
        return {"ok": True, "backend": service.store.backend}
    except CacheUnavailable:
        return {"ok": False, "backend": service.store.backend, "detail": "the cache does not answer"}


async def _checks(service: Service) -> dict[str, dict[str, Any]]:
    # at once: under a stalled Redis each waits out one socket timeout, together one
    cache, jobs = await asyncio.gather(_cache_check(service), service.jobs.health())
    return {"cache": cache, "jobs": jobs}


@router.get(
    "/readyz",
    summary="Readiness",
    operation_id="readiness",
    response_model=schemas.Readiness,
    responses={
        503: {"description": "Not ready.", "content": {"application/json": {"schema": ref("Readiness")}}}
    },
)
async def readyz(request: Request) -> Response:
    """Whether the cache answers and jobs can run (Redis and workers when configured)."""
    service: Service | None = getattr(request.app.state, "service", None)
    if service is None:
        body = {"status": "not_ready", "checks": {"service": {"ok": False, "detail": "starting"}}}
        return JSONResponse(body, status_code=503)
    checks = await _checks(service)
    ok = all(c.get("ok") for c in checks.values())
    return JSONResponse(
        {"status": "ready" if ok else "not_ready", "checks": finite(checks)}, status_code=200 if ok else 503
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    operation_id="metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **problem_responses(401),
    },
)
async def metrics(service: ServiceDep, _auth: Auth) -> Response:
    """Requests, cache hits, solve time and gap."""
    try:
        started: int | None = await service.jobs.solves_started()
    except CacheUnavailable:
        started = None
    return Response(service.metrics.render(started), media_type=CONTENT_TYPE_LATEST)
