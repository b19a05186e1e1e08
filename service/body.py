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
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from autopar_cache import codec
from autopar_service.problems import ApiError
from autopar_service.settings import Settings

__all__ = [
    "Body",
    "BodyRoute",
    "DecodedRequest",
    "JsonStats",
    "graph_object_budget",
    "json_depth",
    "json_shape",
    "json_stats",
    "parse_json_model",
]

M = TypeVar("M", bound=BaseModel)


@dataclass
class Body:
    """A request body as the parts it arrived in, never joined in the API process: joining (or
    appending to a growing buffer) copied each 10 MB body on the event loop; the parts go to a
    worker process as they are (:mod:`autopar_service.work_pool`), which joins them."""

    parts: list[bytes]
    size: int = 0

    @classmethod
    def of(cls, data: bytes) -> Body:
        return cls([data], len(data))

    def __len__(self) -> int:
        return self.size

    def join(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)

    def digest(self) -> str:
        """BLAKE2b (20 bytes, hex) of the body; hashlib lets go of the GIL over large parts."""
        hashed = hashlib.blake2b(digest_size=20)
        for part in self.parts:
            hashed.update(part)
        return hashed.hexdigest()

    def clear(self) -> None:
        self.parts.clear()
        self.size = 0


log = logging.getLogger("autopar.service")

_ENCODINGS = ("identity", "gzip", "zstd")
_JSON_TYPES = ("application/json", "")


_SCAN_CHUNK = 1 << 19
"""Bytes scanned per numpy step: bounds the scan's memory (a few MB) whatever the body's size."""
GRAPH_ITEM_DEPTH = 4
"""Nesting depth of one op, tensor or variable of a request's graph: ``{"graph": {"ops": [{``."""
_QUOTE, _BACKSLASH, _OPENS, _CLOSES = ord('"'), ord("\\"), (ord("["), ord("{")), (ord("]"), ord("}"))
_COMMA = ord(",")
VALUES_PER_ITEM = 64
"""JSON values a body may hold per graph item (op, tensor, variable), beyond
:data:`FREE_VALUES`: the bundled models hold about 6.  Bounds the Python objects a parse builds
(so its memory) by the body's shape, before any parser runs."""
FREE_VALUES = 65_536
"""JSON values any body may hold whatever its graph items (a small graph, its meta, options)."""


@dataclass
class _Scan:
    """What one chunk of :func:`json_shape` hands the next."""

    in_string: int = 0
    backslashes: int = 0
    """Backslashes ending the previous chunk (they may escape this chunk's first quote)."""
    depth: int = 0
    deepest: int = 0
    objects: int = 0
    values: int = 0
    """Commas outside strings: one fewer than the values in the body's arrays and objects."""
    item_open_at: int = -1
    """Byte offset of the container open at :data:`GRAPH_ITEM_DEPTH` (-1: none)."""
    largest_item: int = 0
    """Bytes of the largest container at :data:`GRAPH_ITEM_DEPTH` (an op, tensor, variable,
    a value of ``meta``, a plan entry)."""


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


def _item_spans(st: _Scan, opens: np.ndarray, closes: np.ndarray, offset: int, end: int) -> None:
    """Pair the chunk's opens and closes at :data:`GRAPH_ITEM_DEPTH` (they alternate in valid
    JSON) with the one carried over, and keep the largest span; one may stay open."""
    starts = np.flatnonzero(opens) + offset
    ends = np.flatnonzero(closes) + offset
    if st.item_open_at >= 0:
        starts = np.concatenate(([st.item_open_at], starts))
    pairs = min(len(starts), len(ends))
    if pairs:
        st.largest_item = max(st.largest_item, int((ends[:pairs] - starts[:pairs]).max()) + 1)
    st.item_open_at = int(starts[-1]) if len(starts) > len(ends) else -1
    if st.item_open_at >= 0:
        st.largest_item = max(st.largest_item, end - st.item_open_at)


def _scan_chunk(b: np.ndarray, st: _Scan, offset: int = 0) -> None:
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
    at_item = depth == GRAPH_ITEM_DEPTH
    st.objects += int(np.count_nonzero(opens & is_object & at_item))
    st.values += int(np.count_nonzero((b == _COMMA) & outside))
    _item_spans(st, opens & at_item, closes & (depth == GRAPH_ITEM_DEPTH - 1), offset, offset + len(b))
    st.depth = int(depth[-1])
    st.in_string = int(st.in_string + quotes[-1]) % 2


@dataclass(frozen=True)
class JsonStats:
    """What :func:`json_stats` learns of JSON text without parsing it."""

    depth: int
    """Deepest ``[``/``{`` nesting."""
    items: int
    """Objects opened at :data:`GRAPH_ITEM_DEPTH` (ops, tensors, variables, plan entries)."""
    values: int
    """Commas outside strings (about the number of values in arrays and objects)."""
    largest_item: int
    """Bytes of the largest array or object at :data:`GRAPH_ITEM_DEPTH`."""


def json_stats(raw: bytes) -> JsonStats:
    """Depth, graph items, values and the largest item of JSON text, scanned in chunks of
    :data:`_SCAN_CHUNK` without recursion and without building anything (strings skipped)."""
    state = _Scan()
    view = memoryview(raw)
    for start in range(0, len(raw), _SCAN_CHUNK):
        _scan_chunk(np.frombuffer(view[start : start + _SCAN_CHUNK], dtype=np.uint8), state, start)
    return JsonStats(state.deepest, state.objects, state.values, state.largest_item)


def json_shape(raw: bytes) -> tuple[int, int]:
    """Deepest ``[``/``{`` nesting of JSON text and how many objects open at :data:`GRAPH_ITEM_DEPTH`.

    Non-recursive and without building anything: strings are skipped, the bytes scanned in
    chunks of :data:`_SCAN_CHUNK`.  The object count bounds the ops, tensors and variables of
    a body's graph (and a plan's entries) before any parser builds them.
    """
    stats = json_stats(raw)
    return stats.depth, stats.items


def json_depth(raw: bytes) -> int:
    """Deepest ``[``/``{`` nesting of JSON text, without recursion (strings are skipped)."""
    return json_shape(raw)[0]


def graph_object_budget(settings: Settings) -> int:
    """Most objects a body may hold at :data:`GRAPH_ITEM_DEPTH`: ops and tensors at their
    caps, as many variables as tensors and plan entries as ops (``POST /v1/evaluate``)."""
    return 2 * (settings.max_graph_ops + settings.max_graph_tensors)


def parse_json_model(
    model: type[M],
    raw: bytes,
    max_depth: int,
    max_objects: int | None = None,
    max_item_bytes: int | None = None,
) -> M:
    """``raw`` validated strictly into ``model`` (400 bad JSON, 422 too deep or invalid fields).

    Decided by a scan before anything is parsed (:func:`json_stats`), so a refused body is
    never built in memory and a parse's memory is bounded by the body's shape:

    * ``max_objects`` (see :func:`graph_object_budget`): 413 ``graph_too_large`` beyond;
    * 413 ``too_many_values`` beyond :data:`VALUES_PER_ITEM` per graph item plus :data:`FREE_VALUES`;
    * ``max_item_bytes``: 413 ``graph_item_too_large`` when one op, tensor, variable or value
      of ``meta`` is larger (its attrs are inside it).

    The parse itself refuses duplicate keys (422 ``duplicate_key``) and numbers that are not
    finite (422 ``non_finite_number``: ``NaN``, ``Infinity``, ``1e999``).
    """
    stats = json_stats(raw)
    _check_stats(stats, max_depth, max_objects, max_item_bytes)
    return _validate(model, raw)


def _check_stats(
    stats: JsonStats, max_depth: int, max_objects: int | None, max_item_bytes: int | None
) -> None:
    if stats.depth > max_depth:
        raise ApiError(
            422,
            "json_too_deep",
            f"the body nests {stats.depth} levels deep; this server accepts at most {max_depth}",
            limit=max_depth,
        )
    if max_objects is not None and stats.items > max_objects:
        raise ApiError(
            413,
            "graph_too_large",
            f"the body holds {stats.items} ops, tensors and variables; this server reads at most "
            f"{max_objects} (AUTOPAR_MAX_GRAPH_OPS, AUTOPAR_MAX_GRAPH_TENSORS)",
            limit=max_objects,
        )
    most_values = VALUES_PER_ITEM * stats.items + FREE_VALUES
    if stats.values > most_values:
        raise ApiError(
            413,
            "too_many_values",
            f"the body holds about {stats.values} JSON values for {stats.items} graph items; this "
            f"server reads at most {VALUES_PER_ITEM} per item plus {FREE_VALUES} ({most_values}): "
            "move bulky data out of attrs and meta",
            limit=most_values,
        )
    if max_item_bytes is not None and stats.largest_item > max_item_bytes:
        raise ApiError(
            413,
            "graph_item_too_large",
            f"one op, tensor, variable or meta value of the body has {stats.largest_item} bytes; this "
            f"server reads at most {max_item_bytes} (AUTOPAR_MAX_GRAPH_ITEM_BYTES): keep attrs small",
            limit=max_item_bytes,
        )


class _BadValue(ValueError):
    """A duplicate key or a non-finite number met by the parser (:func:`_load`)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _BadValue(
            "duplicate_key", f"the key {duplicate[:80]!r} appears twice in one object; send it once"
        )
    return obj


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadValue("non_finite_number", f"the number {text[:40]} is out of range; send finite numbers")
    return value


def _no_constant(text: str) -> float:
    raise _BadValue("non_finite_number", f"{text} is not a JSON number; send finite numbers")


MAX_INT_DIGITS = 19
"""Most digits of an integer in a body: every count, size and seed the API reads is below
2**63 (19 digits), so a longer one is refused before Python builds it (a 5,000-digit one
would otherwise raise past the parser: Python's int digit limit)."""
_LARGEST_INT = 2**63 - 1
_KEY_BEFORE = re.compile(rb'"((?:[^"\\]|\\.){1,80})"\s*:\s*\[?[\s\d,.eE+-]*$')
"""The last ``"key":`` before a position, through the array the number may sit in."""
_FIELD_WINDOW = 4096
"""Bytes before a refused number searched for its field's name."""


class _HugeInt(_BadValue):
    """An integer past :data:`MAX_INT_DIGITS` digits or 2**63 (its text, for the field's name)."""

    def __init__(self, text: str) -> None:
        digits = len(text.lstrip("-"))
        shown = text if len(text) <= 24 else f"{text[:12]}...({digits} digits)"
        super().__init__(
            "number_too_large",
            f"the integer {shown} is out of range: this server reads integers below 2**63 "
            f"(at most {MAX_INT_DIGITS} digits); send the value in range",
        )
        self.text = text


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _HugeInt(text)
    value = int(text)
    if abs(value) > _LARGEST_INT:
        raise _HugeInt(text)
    return value


def _field_of(raw: bytes, number: str) -> str | None:
    """The name of the field a refused number is the value of (or in the array of): the last
    ``"key":`` before the number's first occurrence as a JSON value, or None."""
    needle = re.compile(rb"[:\[,]\s*" + re.escape(number.encode()) + rb"(?![0-9])")
    found = needle.search(raw)
    if found is None:
        return None
    window = raw[max(0, found.start() - _FIELD_WINDOW) : found.start() + 1]
    keys = list(_KEY_BEFORE.finditer(window))
    if not keys:
        return None
    return keys[-1].group(1).decode("utf-8", "replace")


def _load(raw: bytes) -> Any:
    """JSON text as Python objects: duplicate keys, non-finite numbers and integers out of
    range (anywhere: fields, graph attrs and shapes, plans) refused (422)."""
    try:
        return json.loads(
            raw,
            object_pairs_hook=_unique_keys,
            parse_float=_finite,
            parse_int=_bounded_int,
            parse_constant=_no_constant,
        )
    except _HugeInt as exc:
        field = _field_of(raw, exc.text)
        where = f"field {field!r}: " if field else ""
        raise ApiError(422, exc.code, where + exc.detail, field=field) from None
    except _BadValue as exc:
        raise ApiError(422, exc.code, exc.detail) from None
    except UnicodeDecodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not UTF-8 text: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, "invalid_json", f"the body is not valid JSON: {exc.msg} at byte {exc.pos}"
        ) from None
    except ValueError as exc:  # any other number the parser cannot build: still the client's body
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {str(exc)[:200]}") from None


def _validate(model: type[M], raw: bytes) -> M:
    data = _load(raw)
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        errors = json.loads(exc.json(include_url=False, include_input=False))
        first = errors[0] if errors else {}
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


DIGEST_IN_THREAD_ABOVE = 1 << 16
"""Bodies larger than this are hashed in a thread (hashlib lets go of the GIL), not on the loop."""


class DecodedRequest(Request):
    """A request whose ``body()`` is the decompressed body within the server's limits."""

    async def _payload(self) -> Body:
        if not hasattr(self, "_decoded"):
            self._decoded = await self._read_decoded(_settings_of(self))
        return self._decoded

    async def body(self) -> bytes:
        """The body as ``bytes`` (joined; the routes use :meth:`take_body` and :meth:`digest`)."""
        return (await self._payload()).join()

    async def take_body(self) -> Body:
        """The body, which this request then no longer holds: the caller's reference is the last,
        so a body handed on (to a worker process) is freed as soon as it is sent.  Its parts as
        they arrived (:class:`Body`), not joined here."""
        body = await self._payload()
        del self._decoded
        return body

    async def digest(self) -> str:
        """A digest of the body (BLAKE2b, 20 bytes, hex); a large body is hashed off the loop."""
        body = await self._payload()
        if len(body) <= DIGEST_IN_THREAD_ABOVE:
            return body.digest()
        return await run_in_threadpool(body.digest)

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

    async def _read_raw(self, limit: int, idle_s: float) -> Body:
        """The body as sent, in the parts it arrived in: 413 beyond ``limit`` bytes, 408 when no
        part of it arrives for ``idle_s`` (shorter than its Content-Length), 499 when the client
        hangs up."""
        body = Body([])
        try:
            await self._read_into(body, limit, idle_s)
        except BaseException:
            body.clear()  # freed now, whatever keeps this frame (the error's traceback)
            raise
        return body

    async def _read_into(self, body: Body, limit: int, idle_s: float) -> None:
        parts = self.stream().__aiter__()
        while True:
            try:
                chunk = await asyncio.wait_for(parts.__anext__(), idle_s)
            except StopAsyncIteration as end:
                # its traceback holds wait_for's frame, which holds the task holding it: a cycle
                # that kept this frame, and the whole body, until a full collection
                end.__traceback__ = None
                return
            except asyncio.TimeoutError:
                raise ApiError(
                    408,
                    "body_timeout",
                    f"no part of the body arrived for {idle_s:g} s ({body.size} bytes read; "
                    "is the Content-Length right?); send the whole body",
                    headers={"Connection": "close"},
                ) from None
            except ClientDisconnect:
                log.info("%s %s: the client hung up during the upload", self.method, self.url.path)
                raise ApiError(499, "client_closed_request", "the client closed the connection") from None
            if body.size + len(chunk) > limit:
                raise _too_large(limit, "the body is larger")
            if chunk:
                body.parts.append(chunk)
                body.size += len(chunk)

    async def _read_decoded(self, settings: Settings) -> Body:
        encoding = self._encoding()
        limit = settings.max_compressed_body_bytes
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and (len(declared) > MAX_INT_DIGITS or int(declared) > limit):
            raise _too_large(limit, f"the body has {declared} bytes")
        raw = await self._read_raw(limit, settings.body_read_timeout_s)
        if encoding == "identity":
            if len(raw) > settings.max_body_bytes:
                raise _too_large(settings.max_body_bytes, "the body is larger")
            body = raw
        else:
            body = Body.of(await run_in_threadpool(_inflate, raw, encoding, settings.max_body_bytes))
        self.state.body_done = time.perf_counter()
        return body


def _inflate(raw: Body, encoding: str, max_bytes: int) -> bytes:
    return codec.decompress(raw.join(), encoding, max_bytes)


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters of a route and all its dependencies."""
    names: set[str] = set()
    pending = [dependant]
    while pending:
        current = pending.pop()
        names.update(param.alias for param in current.query_params)
        pending.extend(current.dependencies)
    return names


class BodyRoute(APIRoute):
    """Routes whose endpoints receive a :class:`DecodedRequest`; a query parameter the route
    does not take is refused (422 ``unknown_query_parameter``), not ignored."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()
        known = _query_names(self.dependant)

        async def handler(request: Request) -> Response:
            unknown = [name for name in request.query_params if name not in known]
            if unknown:
                allowed = ", ".join(sorted(known)) or "none"
                raise ApiError(
                    422,
                    "unknown_query_parameter",
                    f"query parameter {unknown[0][:40]!r} is not one this route takes (allowed: {allowed})",
                )
            return await original(DecodedRequest(request.scope, request.receive))

        return handler
