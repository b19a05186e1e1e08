"""Exception handlers: every error becomes problem+json with a stable code.

Library errors map through :func:`autopar_service.problems.from_autopar`; Redis
failures become 503 with ``Retry-After`` and no infrastructure address (the
server log has it); a 405 lists in ``Allow`` the methods of *every* route on
that path; anything unexpected is a logged 500 (a bug to fix: bad input must
never get there, which the hostile and fuzz tests check).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from autopar.errors import AutoparError
from autopar_cache.errors import CacheUnavailable
from autopar_service.problems import ApiError, from_autopar, problem

__all__ = ["install_handlers"]

log = logging.getLogger("autopar.service")


def _methods(routes: Iterable[BaseRoute], scope: Scope) -> set[str]:
    methods: set[str] = set()
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI's include_router wrapper
        if included is not None:
            methods |= _methods(included.routes, scope)
        elif getattr(route, "methods", None) and route.matches(scope)[0] is not Match.NONE:
            methods |= set(route.methods)  # type: ignore[attr-defined]
    return methods


def _allowed(app: FastAPI, request: Request) -> str:
    methods = _methods(app.router.routes, {**request.scope, "method": "GET"})
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def install_handlers(app: FastAPI, retry_after_s: int) -> None:
    """Register the problem+json handlers on ``app``."""

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response(instance=request.url.path)

    async def autopar_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AutoparError)
        if isinstance(exc, CacheUnavailable):
            log.warning("%s %s: %s", request.method, request.url.path, exc.message)
        return from_autopar(exc, retry_after_s).response(instance=request.url.path)

    async def redis_error(request: Request, exc: Exception) -> Response:
        log.warning("%s %s: Redis failed: %s", request.method, request.url.path, exc)
        return from_autopar(CacheUnavailable(None, "Redis failed"), retry_after_s).response(
            instance=request.url.path
        )

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = json.loads(json.dumps(exc.errors(), default=str))
        for e in errors:
            e.pop("input", None)
            e.pop("url", None)
            e.pop("ctx", None)
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", []))
        return problem(
            422,
            "invalid_request",
            f"{where}: {first.get('msg', 'invalid')}",
            instance=request.url.path,
            errors=errors,
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        codes = {404: "not_found", 405: "method_not_allowed"}
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed(app, request)
        return problem(
            exc.status_code,
            codes.get(exc.status_code, f"http_{exc.status_code}"),
            str(exc.detail),
            instance=request.url.path,
            headers=headers,
        )

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(
            500,
            "internal_error",
            f"unexpected {type(exc).__name__}; the server log has the traceback",
            instance=request.url.path,
        )

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(AutoparError, autopar_error)
    app.add_exception_handler(RedisError, redis_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
