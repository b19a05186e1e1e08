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

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from autopar_cache import codec
from autopar_service.problems import ApiError
from autopar_service.settings import Settings

__all__ = [
    "BodyRoute",
    "DecodedRequest",
    "graph_object_budget",
    "json_depth",
    "json_shape",
    "parse_json_model",
]

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger("autopar.service")

_ENCODINGS = ("identity", "gzip", "zstd")
_JSON_TYPES = ("application/json", "")


_SCAN_CHUNK = 1 << 19
"""Bytes scanned per numpy step: bounds the scan's memory (a few MB) whatever the body's size."""
GRAPH_ITEM_DEPTH = 4
"""Nesting depth of one op, tensor or variable of a request's graph: ``{"graph": {"ops": [{``."""
_QUOTE, _BACKSLASH, _OPENS, _CLOSES = ord('"'), ord("\\"), (ord("["), ord("{")), (ord("]"), ord("}"))


@dataclass
class _Scan:
    """What one chunk of :func:`json_shape` hands the next."""

    in_string: int = 0
    backslashes: int = 0
    """Backslashes ending the previous chunk (they may escape this chunk's first quote)."""
    depth: int = 0
    deepest: int = 0
    objects: int = 0


def _unescaped_quotes(b: np.ndarray, st: _Scan) -> np.ndarray:
    """Where ``b`` has a quote not escaped by an odd run of backslashes (carried over chunks)."""
    is_bs = b == _BACKSLASH
    quote = b == _QUOTE
    if not is_bs.any():
        if st.backslashes % 2:
            quote[0] = False  # escaped by the previous chunk's last backslash
        st.backslashes = 0
        return quote
    idx = np.arange(len(b), dtype=np.int64)
    last_plain = np.maximum.accumulate(np.where(is_bs, -1, idx))  # last non-backslash at or before i
    before = np.concatenate(([-1], last_plain[:-1]))
    run = idx - 1 - before + np.where(before < 0, st.backslashes, 0)  # backslashes just before i
    trailing = len(b) - 1 - int(last_plain[-1])
    st.backslashes = trailing + (st.backslashes if last_plain[-1] < 0 else 0)
    return quote & (run % 2 == 0)


def _scan_chunk(b: np.ndarray, st: _Scan) -> None:
    """Advance ``st`` over the bytes ``b``: unescaped quotes toggle strings; brackets outside
    strings move the depth.  (A backslash outside a string is invalid JSON: the parser stops
    there, so the depth scanned up to it is what it could reach.)"""
    quote = _unescaped_quotes(b, st)
    quotes = np.cumsum(quote, dtype=np.int64)
    outside = (st.in_string + quotes - quote) % 2 == 0
    is_object = b == _OPENS[1]
    opens = (is_object | (b == _OPENS[0])) & outside
    closes = ((b == _CLOSES[0]) | (b == _CLOSES[1])) & outside
    depth = st.depth + np.cumsum(opens.view(np.int8) - closes.view(np.int8), dtype=np.int64)
    st.deepest = max(st.deepest, int(depth.max()))
    st.objects += int(np.count_nonzero(opens & is_object & (depth == GRAPH_ITEM_DEPTH)))
    st.depth = int(depth[-1])
    st.in_string = int(st.in_string + quotes[-1]) % 2


def json_shape(raw: bytes) -> tuple[int, int]:
    """Deepest ``[``/``{`` nesting of JSON text and how many objects open at :data:`GRAPH_ITEM_DEPTH`.

    Non-recursive and without building anything: strings are skipped, the bytes scanned in
    chunks of :data:`_SCAN_CHUNK`.  The object count bounds the ops, tensors and variables of
    a body's graph (and a plan's entries) before any parser builds them.
    """
    state = _Scan()
    view = memoryview(raw)
    for start in range(0, len(raw), _SCAN_CHUNK):
        _scan_chunk(np.frombuffer(view[start : start + _SCAN_CHUNK], dtype=np.uint8), state)
    return state.deepest, state.objects


def json_depth(raw: bytes) -> int:
    """Deepest ``[``/``{`` nesting of JSON text, without recursion (strings are skipped)."""
    return json_shape(raw)[0]


def graph_object_budget(settings: Settings) -> int:
    """Most objects a body may hold at :data:`GRAPH_ITEM_DEPTH`: ops and tensors at their
    caps, as many variables as tensors and plan entries as ops (``POST /v1/evaluate``)."""
    return 2 * (settings.max_graph_ops + settings.max_graph_tensors)


def parse_json_model(model: type[M], raw: bytes, max_depth: int, max_objects: int | None = None) -> M:
    """``raw`` validated strictly into ``model`` (400 bad JSON, 422 too deep or invalid fields).

    ``max_objects`` (see :func:`graph_object_budget`): 413 ``graph_too_large`` when the body
    holds more graph items, decided by a scan before the body is parsed (a refused graph is
    never built in memory).
    """
    depth, objects = json_shape(raw)
    if depth > max_depth:
        raise ApiError(
            422,
            "json_too_deep",
            f"the body nests {depth} levels deep; this server accepts at most {max_depth}",
            limit=max_depth,
        )
    if max_objects is not None and objects > max_objects:
        raise ApiError(
            413,
            "graph_too_large",
            f"the body holds {objects} ops, tensors and variables; this server reads at most "
            f"{max_objects} (AUTOPAR_MAX_GRAPH_OPS, AUTOPAR_MAX_GRAPH_TENSORS)",
            limit=max_objects,
        )
    return _validate(model, raw)


def _validate(model: type[M], raw: bytes) -> M:
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

    async def _read_raw(self, limit: int, idle_s: float) -> bytes:
        """The body as sent: 413 beyond ``limit`` bytes, 408 when no part of it arrives for
        ``idle_s`` (shorter than its Content-Length), 499 when the client hangs up."""
        buffer = bytearray()
        parts = self.stream().__aiter__()
        while True:
            try:
                chunk = await asyncio.wait_for(parts.__anext__(), idle_s)
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise ApiError(
                    408,
                    "body_timeout",
                    f"no part of the body arrived for {idle_s:g} s ({len(buffer)} bytes read; "
                    "is the Content-Length right?); send the whole body",
                    headers={"Connection": "close"},
                ) from None
            except ClientDisconnect:
                log.info("%s %s: the client hung up during the upload", self.method, self.url.path)
                raise ApiError(499, "client_closed_request", "the client closed the connection") from None
            if len(buffer) + len(chunk) > limit:
                raise _too_large(limit, "the body is larger")
            buffer += chunk
        return bytes(buffer)

    async def _read_decoded(self, settings: Settings) -> bytes:
        encoding = self._encoding()
        limit = settings.max_compressed_body_bytes
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit, f"the body has {declared} bytes")
        raw = await self._read_raw(limit, settings.body_read_timeout_s)
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
