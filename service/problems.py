"""Errors as RFC 9457 problem details (``application/problem+json``) with a stable code.

Every error response has ``type`` (``urn:autopar:problem:{code}``), ``title``,
``status``, ``detail`` (what was wrong and what to do), ``code`` and, where it
helps, extension members (``op`` for an invalid graph, ``min_feasible_bytes``
for an infeasible budget, ``limit_bytes`` for a body too large ...).

==============================  ======  =====================================
raised                          status  code
==============================  ======  =====================================
GraphError                      422     invalid_graph (or the graph's code)
InfeasibleError                 422     infeasible_budget
ConfigError / PlanError         422     the error's code
body too large                  413     body_too_large
Content-Encoding not supported  415     unsupported_media_type
unknown job / plan / sweep      404     job_not_found / plan_not_found / ...
missing or wrong X-API-Key      401     unauthorized
Redis / cache unreachable       503     cache_unavailable (with Retry-After)
==============================  ======  =====================================
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import Response

from autopar.errors import (
    AutoparError,
    ConfigError,
    GraphError,
    InfeasibleError,
    PlanError,
    VerificationError,
)
from autopar_cache.codec import DecodeError
from autopar_cache.errors import CacheUnavailable
from autopar_service.jobs import finite

__all__ = ["PROBLEM_JSON", "ApiError", "from_autopar", "from_job_error", "problem"]

PROBLEM_JSON = "application/problem+json"

_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    408: "Request timeout",
    409: "Conflict",
    413: "Content too large",
    415: "Unsupported media type",
    422: "Unprocessable content",
    429: "Too many requests",
    499: "Client closed request",
    500: "Internal server error",
    503: "Service unavailable",
}


class ApiError(Exception):
    """An HTTP error answered as problem+json."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title or _TITLES.get(status, "Error")
        self.headers = headers or {}
        self.extra = extra

    def response(self, instance: str | None = None) -> Response:
        return problem(
            self.status,
            self.code,
            self.detail,
            title=self.title,
            instance=instance,
            headers=self.headers,
            **self.extra,
        )


def problem(
    status: int,
    code: str,
    detail: str,
    *,
    title: str | None = None,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    """A problem+json response."""
    body: dict[str, Any] = {
        "type": f"urn:autopar:problem:{code}",
        "title": title or _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance:
        body["instance"] = instance
    for key, value in extra.items():
        if key not in body and value is not None:
            body[key] = value
    return Response(
        json.dumps(finite(body), default=str),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def from_autopar(exc: AutoparError, retry_after_s: int = 2) -> ApiError:
    """The API error of a library error."""
    details = {k: v for k, v in exc.details.items() if k not in ("code", "message")}
    if isinstance(exc, DecodeError):
        if exc.code == "too_large":
            return ApiError(413, "body_too_large", exc.message, **details)
        if exc.code == "unsupported_encoding":
            return ApiError(415, "unsupported_media_type", exc.message)
        return ApiError(400, "bad_encoding", exc.message)
    if isinstance(exc, CacheUnavailable):
        # the message names the Redis host: it goes to the log, not to clients
        return ApiError(
            503,
            exc.code,
            f"the plan cache / job queue is unavailable; retry after {retry_after_s} s",
            headers={"Retry-After": str(retry_after_s)},
        )
    if isinstance(exc, InfeasibleError):
        return ApiError(422, exc.code, exc.message, title="Infeasible memory budget", **details)
    if isinstance(exc, GraphError):
        return ApiError(422, exc.code, exc.message, title="Invalid graph", kind="invalid_graph", **details)
    if isinstance(exc, (ConfigError, PlanError)):
        return ApiError(422, exc.code, exc.message, **details)
    if isinstance(exc, VerificationError):
        return ApiError(500, exc.code, exc.message, title="Plan verification failed", **details)
    return ApiError(400, exc.code, exc.message, **details)


def from_job_error(job_id: str, error: dict[str, Any]) -> ApiError:
    """The API error for a job that failed deterministically (answered again on a re-POST)."""
    extra = {k: v for k, v in error.items() if k not in ("code", "message")}
    status = (
        422
        if error.get("kind") in {"infeasible_budget", "invalid_graph", "bad_config", "invalid_plan"}
        else 500
    )
    title = "Infeasible memory budget" if error.get("kind") == "infeasible_budget" else None
    return ApiError(
        status,
        str(error.get("code", "job_failed")),
        str(error.get("message", "the job failed")),
        title=title,
        job=f"/v1/jobs/{job_id}",
        **extra,
    )
