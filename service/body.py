"""Request bodies: decoding (size limits, Content-Encoding) and bounded JSON parsing.

:class:`BodyRoute` is the route class of every router: it hands the endpoint a
:class:`DecodedRequest`, whose ``body()`` enforces the content type (415), the
compressed and decompressed size limits (413) and decompresses gzip or zstd off
the event loop (FastAPI's "custom Request and APIRoute class" recipe).

:func:`parse_json_model` then checks the nesting depth with a non-recursive
scan *before* any recursive parser sees the bytes (422 beyond
``max_json_depth``), and validates the body strictly (no ``true`` -> 1, no
``"2"`` -> 2) into a pydantic model: 400 for malformed JSON, 422 naming the
bad fields.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import numpy as np
from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from autopar_cache import codec
from autopar_service.problems import ApiError
from autopar_service.settings import Settings

__all__ = ["BodyRoute", "DecodedRequest", "json_depth", "parse_json_model"]

M = TypeVar("M", bound=BaseModel)

_ENCODINGS = ("identity", "gzip", "zstd")
_JSON_TYPES = ("application/json", "")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """Deepest ``[``/``{`` nesting of JSON text, without recursion (strings are skipped)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def parse_json_model(model: type[M], raw: bytes, max_depth: int) -> M:
    """``raw`` validated strictly into ``model`` (400 bad JSON, 422 too deep or invalid fields)."""
    depth = json_depth(raw)
    if depth > max_depth:
        raise ApiError(
            422,
            "json_too_deep",
            f"the body nests {depth} levels deep; this server accepts at most {max_depth}",
            limit=max_depth,
        )
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        errors = json.loads(exc.json(include_url=False, include_input=False))
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            raise ApiError(400, "invalid_json", f"the body is not valid JSON: {first.get('msg')}") from None
        where = ".".join(str(p) for p in first.get("loc", [])) or "body"
        raise ApiError(
            422,
            "invalid_request",
            f"{where}: {first.get('msg', 'invalid')} ({len(errors)} problem(s) in the body)",
            errors=errors[:20],
        ) from None
    except (RecursionError, ValueError) as exc:  # defensive: the depth scan makes these unreachable
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {type(exc).__name__}") from None


def _settings_of(request: Request) -> Settings:
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise ApiError(
            503, "starting", "the service is starting; retry shortly", headers={"Retry-After": "1"}
        )
    settings: Settings = service.settings
    return settings


def _too_large(limit: int, what: str) -> ApiError:
    return ApiError(413, "body_too_large", f"{what}; the limit is {limit} bytes", limit_bytes=limit)


class DecodedRequest(Request):
    """A request whose ``body()`` is the decompressed body within the server's limits."""

    async def body(self) -> bytes:
        if not hasattr(self, "_decoded"):
            self._decoded = await self._read_decoded(_settings_of(self))
        return self._decoded

    def _encoding(self) -> str:
        media = self.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media not in _JSON_TYPES:
            raise ApiError(
                415,
                "unsupported_media_type",
                f"content type {media!r} is not supported; send application/json",
            )
        encoding = self.headers.get("content-encoding", "identity").strip().lower() or "identity"
        if encoding not in _ENCODINGS:
            raise ApiError(
                415,
                "unsupported_media_type",
                f"Content-Encoding {encoding!r} is not supported; use gzip, zstd or none",
            )
        return encoding

    async def _read_decoded(self, settings: Settings) -> bytes:
        encoding = self._encoding()
        limit = settings.max_compressed_body_bytes
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit, f"the body has {declared} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in self.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, "the body is larger")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if encoding == "identity":
            if len(raw) > settings.max_body_bytes:
                raise _too_large(settings.max_body_bytes, "the body is larger")
            body = raw
        else:
            body = await run_in_threadpool(codec.decompress, raw, encoding, settings.max_body_bytes)
        self.state.body_done = time.perf_counter()
        return body


class BodyRoute(APIRoute):
    """Routes whose endpoints receive a :class:`DecodedRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            return await original(DecodedRequest(request.scope, request.receive))

        return handler
