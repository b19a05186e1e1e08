"""ASGI middleware: request metrics, ``Server-Timing``, ``Cache-Control: private`` on keyed answers,
and a last-resort 500 that keeps the connection.

Starlette's outermost error middleware re-raises after answering, which makes
the server drop a keep-alive connection.  :class:`TimingMiddleware` sits inside
it and answers an unexpected exception itself (problem+json 500, logged), so
the client's connection survives even a bug.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autopar_service.metrics import Metrics
from autopar_service.problems import PROBLEM_JSON

__all__ = ["TimingMiddleware"]

log = logging.getLogger("autopar.service")


class TimingMiddleware:
    """Counts requests per route; adds ``Server-Timing`` (``app``: ms after the body arrived);
    makes every keyed answer (``/v1/...``, ``/metrics``) ``Cache-Control: private``."""

    def __init__(self, app: ASGIApp, metrics_of: Callable[[], Metrics | None]) -> None:
        self.app = app
        self.metrics_of = metrics_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                now = time.perf_counter()
                body_done = scope.get("state", {}).get("body_done")
                timing = f"total;dur={(now - start) * 1e3:.2f}"
                if body_done is not None:
                    timing += f", app;dur={(now - body_done) * 1e3:.2f}"
                headers = [*message.get("headers", []), (b"server-timing", timing.encode())]
                if _keyed(scope["path"]):
                    headers = _private(headers)
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if started:
                raise
            await _internal_error(send, scope["path"], exc)
        finally:
            metrics = self.metrics_of()
            if metrics is not None:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                metrics.observe_request(scope["method"], route, status, time.perf_counter() - start)


KEYED_PREFIXES = ("/v1/", "/metrics")
"""Paths whose answers need the API key when keys are configured: never for a shared cache."""
DEFAULT_CACHE_CONTROL = b"private, no-cache"
"""What a keyed answer that says nothing about caching gets (a job's status changes)."""


def _keyed(path: str) -> bool:
    return path.startswith(KEYED_PREFIXES)


def _private(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``Cache-Control: private``: a ``public`` directive becomes ``private``,
    one without either gets ``private`` in front, none at all :data:`DEFAULT_CACHE_CONTROL`.
    A keyed answer (a plan, a graph, a job) is for the caller's key, not for a shared cache,
    which would hand it to a client without one."""
    out: list[tuple[bytes, bytes]] = []
    found = False
    for name, value in headers:
        if name.lower() == b"cache-control":
            found = True
            directives = [d.strip() for d in value.split(b",") if d.strip()]
            directives = [b"private" if d.lower() == b"public" else d for d in directives]
            if not any(d.lower() in (b"private", b"no-store") for d in directives):
                directives.insert(0, b"private")
            value = b", ".join(directives)
        out.append((name, value))
    if not found:
        out.append((b"cache-control", DEFAULT_CACHE_CONTROL))
    return out


async def _internal_error(send: Send, path: str, exc: Exception) -> None:
    body = json.dumps(
        {
            "type": "urn:autopar:problem:internal_error",
            "title": "Internal server error",
            "status": 500,
            "detail": f"unexpected {type(exc).__name__}; the server log has the traceback",
            "code": "internal_error",
            "instance": path,
        }
    ).encode()
    headers = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": body})
