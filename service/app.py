"""The planning API (FastAPI), versioned under ``/v1``.

::

    POST   /v1/plans               200 plan (cache hit) | 202 job (Location, Retry-After)
    GET    /v1/plans/{key}         a cached plan (immutable, ETag / If-None-Match)
    GET    /v1/jobs/{id}           job status (?wait=N: until it ends; &since=V: until it changes)
    GET    /v1/jobs/{id}/events    server-sent events: progress until the job ends
    DELETE /v1/jobs/{id}           cancel
    POST   /v1/evaluate            evaluate a given plan with the independent evaluator
    POST   /v1/sweeps              what-if table over budgets / ZeRO stages / mesh shapes
    GET    /v1/sweeps/{id}         the table as it fills in
    GET    /livez  /readyz  /metrics

Request bodies are read by :func:`read_body` (``Content-Encoding`` gzip or zstd;
the compressed and the decompressed size are both capped, 413 beyond) and
parsed in a worker thread: the event loop only awaits.  A cache hit for a
byte-identical body skips parsing entirely (``body:{digest}`` maps it to its
plan key).  Solves run in the job manager: local processes without Redis,
RQ workers with it.  Errors are problem+json (:mod:`service.problems`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autopar import __version__
from autopar.errors import AutoparError, ConfigError, PlanError
from autopar.graph import Graph
from autopar.plan import Plan
from cache import codec, open_store
from cache.base import Store
from cache.errors import CacheUnavailable
from cache.plans import PlanCache, PlanRecord, canonical_json, code_versions, plan_key
from service import explorer, schemas
from service.jobs import DETERMINISTIC_ERRORS, JobInfo, JobManager, JobStatus, finite
from service.metrics import Metrics
from service.problems import PROBLEM_JSON, ApiError, from_autopar, from_job_error, problem
from service.requests import (
    EvaluateBody,
    PlanBody,
    SweepBody,
    build_request,
    cluster_of,
    parse_graph,
    payload_of,
)
from service.settings import Settings, load_settings
from service.tasks import graph_key

__all__ = ["Service", "create_app", "read_body"]

log = logging.getLogger("autopar.service")

KEY_PATTERN = r"^[0-9a-f]{64}$"
SSE_PERIOD_S = 5.0
"""Longest gap between two server-sent events of a running job, seconds."""
_ENCODINGS = ("identity", "gzip", "zstd")
_JSON_TYPES = ("application/json", "")


# ------------------------------------------------------------------ service state


@dataclass
class Prepared:
    """A parsed plan request, ready to submit."""

    key: str
    payload: dict[str, Any]
    cached: PlanRecord | None
    """The cached plan, when there is one (and no refresh was asked)."""


class Service:
    """Everything the routes share: settings, store, plan cache, jobs, metrics."""

    def __init__(self, settings: Settings, store: Store, jobs: JobManager, versions: dict[str, str]):
        self.settings = settings
        self.store = store
        self.plans = PlanCache(store, settings.plan_ttl_s)
        self.jobs = jobs
        self.metrics = Metrics()
        self.versions = versions
        resolution = {
            "versions": versions,
            "default_time_limit_s": settings.default_time_limit_s,
            "solver_workers": settings.solver_workers,
        }
        self.body_tag = hashlib.sha256(canonical_json(resolution)).hexdigest()[:16]

    # ---------------------------------------------------------- sync helpers (worker threads)

    def body_key(self, digest: str) -> str:
        return f"body:{self.body_tag}:{digest}"

    def fast_lookup(self, digest: str) -> PlanRecord | None:
        """The cached plan of a byte-identical earlier body, if any."""
        key = self.store.get(self.body_key(digest))
        return self.plans.get(key.decode()) if key is not None else None

    def prepare(self, raw: bytes, digest: str, refresh: bool) -> Prepared:
        """Parse and validate a plan body; return its key, its cached plan or the job payload.

        The graph is stored (for the job) only when a solve is needed.
        """
        body = parse_json_model(PlanBody, raw)
        graph = parse_graph(body.graph)
        cluster = cluster_of(body.cluster, body.preset, self.settings.max_devices)
        request = build_request(
            graph,
            cluster,
            body.mesh_shape,
            body.memory_budget_bytes,
            body.zero_stage,
            body.options,
            self.settings,
        )
        key_dict = request.to_key_dict()
        key = plan_key(key_dict, self.versions)
        payload = payload_of(request, self.versions, graph_hash=key_dict["graph"])
        self.store.put(self.body_key(digest), key.encode(), self.settings.plan_ttl_s)
        cached = None if refresh else self.plans.get(key)
        if cached is None:
            self.store_graph(body.graph, payload["graph"])
        return Prepared(key, payload, cached)

    def store_graph(self, graph_data: dict[str, Any], content_hash: str) -> None:
        self.store.put(graph_key(content_hash), codec.encode(graph_data), self.settings.job_ttl_s)

    def on_terminal(self, info: JobInfo) -> None:
        result = info.result or {}
        self.metrics.job_finished(info.status.value, result.get("solve_wall_s"), result.get("gap"))


def parse_json_model(model: type[BaseModel], raw: bytes) -> Any:
    """``raw`` JSON validated into ``model``: 400 for bad JSON, 422 naming the bad fields."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = json.loads(exc.json(include_url=False, include_input=False))
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", [])) or "body"
        raise ApiError(
            422,
            "invalid_request",
            f"{where}: {first.get('msg', 'invalid')} ({len(errors)} problem(s) in the body)",
            errors=errors,
        ) from None


# ------------------------------------------------------------------ request plumbing


async def read_body(request: Request, settings: Settings) -> bytes:
    """The request body, decompressed, within the size limits (413) and encodings (415)."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in _JSON_TYPES:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"content type {media!r} is not supported; send application/json",
        )
    encoding = request.headers.get("content-encoding", "identity").strip().lower() or "identity"
    if encoding not in _ENCODINGS:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Encoding {encoding!r} is not supported; use gzip, zstd or none",
        )
    limit = settings.max_compressed_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413,
            "body_too_large",
            f"the body has {declared} bytes; the limit is {limit}",
            limit_bytes=limit,
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(
                413,
                "body_too_large",
                f"the body exceeds the limit of {limit} bytes",
                limit_bytes=limit,
            )
        chunks.append(chunk)
    raw = b"".join(chunks)
    if encoding == "identity":
        if len(raw) > settings.max_body_bytes:
            raise ApiError(
                413,
                "body_too_large",
                f"the body exceeds the limit of {settings.max_body_bytes} bytes",
                limit_bytes=settings.max_body_bytes,
            )
        body = raw
    else:
        body = await run_in_threadpool(codec.decompress, raw, encoding, settings.max_body_bytes)
    request.state.body_done = time.perf_counter()
    return body


class TimingMiddleware:
    """Counts requests per route; adds ``Server-Timing`` (``app``: ms after the body arrived)."""

    def __init__(self, app: ASGIApp, metrics_of: Callable[[], Metrics | None]) -> None:
        self.app = app
        self.metrics_of = metrics_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                now = time.perf_counter()
                body_done = scope.get("state", {}).get("body_done")
                timing = f"total;dur={(now - start) * 1e3:.2f}"
                if body_done is not None:
                    timing += f", app;dur={(now - body_done) * 1e3:.2f}"
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", timing.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            metrics = self.metrics_of()
            if metrics is not None:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                metrics.observe_request(scope["method"], route, status, time.perf_counter() - start)


# ------------------------------------------------------------------ dependencies


def get_service(request: Request) -> Service:
    """The app's :class:`Service` (503 while the app is still starting)."""
    service: Service | None = getattr(request.app.state, "service", None)
    if service is None:
        raise ApiError(
            503,
            "starting",
            "the service is starting; retry shortly",
            headers={"Retry-After": "1"},
        )
    return service


api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key")


def require_key(
    key: Annotated[str | None, Depends(api_key_header)],
    service: Annotated[Service, Depends(get_service)],
) -> None:
    """401 unless the ``X-API-Key`` is one of the configured keys (no keys: open)."""
    keys = service.settings.api_keys
    if not keys:
        return
    if key is None or not any(secrets.compare_digest(key.encode(), k.encode()) for k in keys):
        raise ApiError(
            401,
            "unauthorized",
            "missing or wrong X-API-Key header; ask the operator for a key",
            headers={"WWW-Authenticate": 'ApiKey header="X-API-Key"'},
        )


ServiceDep = Annotated[Service, Depends(get_service)]
Auth = Annotated[None, Depends(require_key)]
Key = Annotated[str, Path(pattern=KEY_PATTERN, description="64 hex digits")]


# ------------------------------------------------------------------ OpenAPI helpers


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        400: "Malformed body (not JSON, bad encoding).",
        401: "Missing or wrong X-API-Key.",
        404: "Unknown job, plan or sweep.",
        409: "The job already finished.",
        413: "Body too large (compressed or decompressed).",
        415: "Unsupported content type or Content-Encoding.",
        422: "Invalid request: graph (names the op), configuration, or infeasible budget.",
        500: "Unexpected server error (the log has the traceback).",
        503: "Cache or queue unavailable (Redis down); retry after Retry-After.",
    }
    return {
        s: {"description": descriptions[s], "content": {PROBLEM_JSON: {"schema": _ref("Problem")}}}
        for s in statuses
    }


def _json_body(model: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "description": "JSON; Content-Encoding gzip or zstd accepted.",
            "content": {"application/json": {"schema": _ref(model)}},
        }
    }


_WRITE_ERRORS = (400, 401, 413, 415, 422, 503)


# ------------------------------------------------------------------ app


def create_app(settings: Settings | None = None, *, store: Store | None = None) -> FastAPI:
    """The API.  ``store`` defaults to Redis (``settings.redis_url``) or the embedded cache."""
    settings = settings or load_settings()
    holder: dict[str, Service] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        versions = await run_in_threadpool(code_versions)
        the_store = store or open_store(
            settings.redis_url, settings.cache_dir, size_limit_bytes=settings.cache_size_limit_bytes
        )
        jobs: JobManager
        service: Service
        if settings.uses_redis:
            from cache.redis_store import RedisStore
            from service.rq_jobs import RQJobManager

            if not isinstance(the_store, RedisStore):
                raise ConfigError("bad_settings", "AUTOPAR_REDIS_URL is set but the store is not Redis")
            rq_jobs = RQJobManager(settings, the_store)
            jobs = rq_jobs
            service = Service(settings, the_store, jobs, versions)
            rq_jobs.on_terminal = service.on_terminal
        else:
            from service.local_jobs import LocalJobManager

            local = LocalJobManager(settings, the_store, versions)
            jobs = local
            service = Service(settings, the_store, jobs, versions)
            local.on_terminal = service.on_terminal
        await jobs.start()
        holder["service"] = service
        app.state.service = service
        try:
            yield
        finally:
            await jobs.close()
            holder.pop("service", None)
            if store is None:
                the_store.close()

    app = FastAPI(
        title="autopar planning service",
        version=__version__,
        description=(
            "Auto-parallel planning: N-D SBP plans for a training graph on a device mesh under "
            "a ZeRO-aware per-device memory budget.  Write endpoints need `X-API-Key` when keys "
            "are configured.  Errors are RFC 9457 problem+json with a stable `code`."
        ),
        lifespan=lifespan,
    )

    def current_metrics() -> Metrics | None:
        service = holder.get("service")
        return service.metrics if service is not None else None

    app.add_middleware(TimingMiddleware, metrics_of=current_metrics)
    app.include_router(explorer.router)

    # ---------------------------------------------------------- error handlers

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return exc.response(instance=request.url.path)

    @app.exception_handler(AutoparError)
    async def _autopar_error(request: Request, exc: AutoparError) -> Response:
        return from_autopar(exc, settings.retry_after_s).response(instance=request.url.path)

    @app.exception_handler(RedisError)
    async def _redis_error(request: Request, exc: RedisError) -> Response:
        return from_autopar(CacheUnavailable(None, f"Redis failed: {exc}"), settings.retry_after_s).response(
            instance=request.url.path
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        errors = json.loads(json.dumps(exc.errors(), default=str))
        for e in errors:
            e.pop("input", None)
            e.pop("url", None)
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", []))
        return problem(
            422,
            "invalid_request",
            f"{where}: {first.get('msg', 'invalid')}",
            instance=request.url.path,
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        codes = {404: "not_found", 405: "method_not_allowed"}
        return problem(
            exc.status_code,
            codes.get(exc.status_code, f"http_{exc.status_code}"),
            str(exc.detail),
            instance=request.url.path,
            headers=dict(exc.headers or {}),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(
            500,
            "internal_error",
            f"unexpected {type(exc).__name__}; the server log has the traceback",
            instance=request.url.path,
        )

    # ---------------------------------------------------------- helpers

    def plan_response(record: PlanRecord, status: int = 200) -> Response:
        return Response(
            record.body,
            status_code=status,
            media_type="application/json",
            headers={
                "ETag": record.etag,
                "Content-Location": f"/v1/plans/{record.key}",
                "Cache-Control": "public, max-age=31536000, immutable",
            },
        )

    def job_response(service: Service, info: JobInfo, status: int = 202) -> Response:
        headers = {"Location": f"/v1/jobs/{info.id}"}
        if not info.terminal:
            headers["Retry-After"] = str(service.settings.retry_after_s)
        return JSONResponse(info.view(), status_code=status, headers=headers)

    async def settle(service: Service, key: str, info: JobInfo, wait_s: float) -> Response:
        """200 with the plan, 422 for a deterministic failure, else 202 with the job."""
        if wait_s > 0 and not info.terminal:
            waited = await service.jobs.wait(
                key, min(wait_s, service.settings.max_wait_s), after_version=1 << 62
            )
            info = waited or info
        if info.status is JobStatus.SUCCEEDED:
            record = await run_in_threadpool(service.plans.get, key)
            if record is not None:
                return plan_response(record)
        if info.status is JobStatus.FAILED and (info.error or {}).get("kind") in DETERMINISTIC_ERRORS:
            raise from_job_error(key, info.error or {})
        return job_response(service, info)

    # ---------------------------------------------------------- plans

    @app.post(
        "/v1/plans",
        summary="Request a plan",
        status_code=202,
        openapi_extra=_json_body("PlanBody"),
        responses={
            200: {
                "description": "Cache hit: the plan.",
                "content": {"application/json": {"schema": _ref("PlanRecordView")}},
            },
            202: {
                "description": "Accepted: a job solves it (Location: /v1/jobs/{id}, Retry-After).",
                "content": {"application/json": {"schema": _ref("JobView")}},
            },
            **_problem_responses(*_WRITE_ERRORS),
        },
        response_class=Response,
    )
    async def create_plan(
        request: Request,
        service: ServiceDep,
        _auth: Auth,
        wait: Annotated[float, Query(ge=0, le=600, description="Seconds to wait for the solve.")] = 0,
        refresh: Annotated[bool, Query(description="Solve again (warm-started) even if cached.")] = False,
    ) -> Response:
        """Return the cached plan (200) or start / join the job that solves it (202)."""
        raw = await read_body(request, service.settings)
        digest = hashlib.blake2b(raw, digest_size=20).hexdigest()
        if not refresh:
            hit = await run_in_threadpool(service.fast_lookup, digest)
            if hit is not None:
                service.metrics.cache(True)
                return plan_response(hit)
        prepared = await run_in_threadpool(service.prepare, raw, digest, refresh)
        key = prepared.key
        if prepared.cached is not None:
            service.metrics.cache(True)
            return plan_response(prepared.cached)
        if not refresh:
            existing = await service.jobs.get(key)
            if (
                existing is not None
                and existing.status is JobStatus.FAILED
                and ((existing.error or {}).get("kind") in DETERMINISTIC_ERRORS)
            ):
                raise from_job_error(key, existing.error or {})
        service.metrics.cache(False)
        info = await service.jobs.submit(key, prepared.payload, refresh=refresh)
        if info.status is JobStatus.SUCCEEDED and not refresh:
            record = await run_in_threadpool(service.plans.get, key)
            if record is not None:
                return plan_response(record)
            info = await service.jobs.submit(key, prepared.payload, refresh=True)
        return await settle(service, key, info, wait)

    @app.get(
        "/v1/plans/{key}",
        summary="Get a cached plan",
        response_class=Response,
        responses={
            200: {
                "description": "The plan.",
                "content": {"application/json": {"schema": _ref("PlanRecordView")}},
            },
            304: {"description": "Not modified (If-None-Match)."},
            **_problem_responses(404, 422, 503),
        },
    )
    async def get_plan(request: Request, key: Key, service: ServiceDep) -> Response:
        """The plan stored under ``key`` (a job id); immutable, with an ETag."""
        record = await run_in_threadpool(service.plans.get, key)
        if record is None:
            raise ApiError(
                404, "plan_not_found", f"no plan is cached under {key}; POST /v1/plans to make one"
            )
        if_none_match = request.headers.get("if-none-match", "")
        if record.etag in [t.strip() for t in if_none_match.split(",")] or if_none_match.strip() == "*":
            return Response(status_code=304, headers={"ETag": record.etag})
        return plan_response(record)

    # ---------------------------------------------------------- jobs

    async def known_job(service: Service, job_id: str) -> JobInfo:
        info = await service.jobs.get(job_id)
        if info is not None:
            return info
        if await run_in_threadpool(service.plans.get, job_id) is not None:
            return JobInfo(job_id, JobStatus.SUCCEEDED, phase="done", version=1)
        raise ApiError(404, "job_not_found", f"no job {job_id}; it never existed or its record expired")

    @app.get(
        "/v1/jobs/{job_id}",
        summary="Job status",
        response_model=schemas.JobView,
        responses=_problem_responses(404, 422, 503),
    )
    async def get_job(
        job_id: Key,
        service: ServiceDep,
        wait: Annotated[
            float, Query(ge=0, le=600, description="Long-poll: wait up to N s for the job to end.")
        ] = 0,
        since: Annotated[
            int | None, Query(ge=-1, description="Long-poll: return once the version passes this.")
        ] = None,
    ) -> Response:
        """Status, phase, objective, bound, gap and elapsed time; a plan link when done."""
        info = await known_job(service, job_id)
        if (wait > 0) and not info.terminal:
            after = (1 << 62) if since is None else since
            info = await service.jobs.wait(job_id, min(wait, service.settings.max_wait_s), after) or info
        headers = {"Content-Location": f"/v1/plans/{job_id}"} if info.status is JobStatus.SUCCEEDED else {}
        if not info.terminal:
            headers["Retry-After"] = str(service.settings.retry_after_s)
        return JSONResponse(info.view(), headers=headers)

    @app.get(
        "/v1/jobs/{job_id}/events",
        summary="Job progress as server-sent events",
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "`event: progress` with the job as JSON on every change; "
                "`event: end` with the final job.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            **_problem_responses(404, 422, 503),
        },
    )
    async def job_events(job_id: Key, service: ServiceDep) -> StreamingResponse:
        """Stream progress until the job succeeds, fails or is canceled."""
        first = await known_job(service, job_id)

        async def stream() -> AsyncIterator[str]:
            # an event on every change, and at least every SSE_PERIOD_S (elapsed time moves on)
            info: JobInfo | None = first
            while info is not None:
                event = "end" if info.terminal else "progress"
                yield f"id: {info.version}\nevent: {event}\ndata: {json.dumps(info.view())}\n\n"
                if info.terminal:
                    return
                try:
                    info = await service.jobs.wait(job_id, SSE_PERIOD_S, info.version)
                except CacheUnavailable as exc:
                    data = json.dumps({"code": exc.code, "detail": exc.message})
                    yield f"event: error\ndata: {data}\n\n"
                    return

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.delete(
        "/v1/jobs/{job_id}",
        summary="Cancel a job",
        response_model=schemas.JobView,
        responses=_problem_responses(401, 404, 409, 422, 503),
    )
    async def cancel_job(job_id: Key, service: ServiceDep, _auth: Auth) -> Response:
        """Cancel a queued or running job (shared by every client that asked for this plan)."""
        info = await service.jobs.cancel(job_id)
        if info is None:
            raise ApiError(404, "job_not_found", f"no job {job_id}; it never existed or its record expired")
        if info.status is JobStatus.SUCCEEDED:
            raise ApiError(
                409,
                "job_finished",
                "the job already succeeded; its plan is cached",
                plan=f"/v1/plans/{job_id}",
            )
        return JSONResponse(info.view())

    # ---------------------------------------------------------- evaluate

    def evaluate_sync(service: Service, raw: bytes) -> dict[str, Any]:
        from autopar.evaluate import evaluate

        body = parse_json_model(EvaluateBody, raw)
        graph = parse_graph(body.graph)
        if body.plan is not None:
            plan = Plan.from_dict(body.plan)
        elif body.plan_key is not None:
            record = service.plans.get(body.plan_key)
            if record is None:
                raise ApiError(404, "plan_not_found", f"no plan is cached under {body.plan_key}")
            plan = Plan.from_dict(record.data()["plan"])
        else:
            raise ApiError(422, "invalid_request", "give either `plan` or `plan_key`")
        check_plan_fits(graph, plan)
        result: dict[str, Any] = finite(evaluate(graph, plan).to_dict())
        return result

    @app.post(
        "/v1/evaluate",
        summary="Evaluate a plan",
        response_model=schemas.Evaluation,
        openapi_extra=_json_body("EvaluateBody"),
        responses=_problem_responses(*_WRITE_ERRORS, 404),
    )
    async def evaluate_plan(request: Request, service: ServiceDep, _auth: Auth) -> Response:
        """Recompute validity, step time, communication and memory of a plan on its graph."""
        raw = await read_body(request, service.settings)
        return JSONResponse(await run_in_threadpool(evaluate_sync, service, raw))

    # ---------------------------------------------------------- sweeps

    def prepare_sweep(service: Service, raw: bytes) -> tuple[str, list[dict[str, Any]]]:
        body = parse_json_model(SweepBody, raw)
        graph = parse_graph(body.graph)
        cluster = cluster_of(body.cluster, body.preset, service.settings.max_devices)
        combos = list(
            dict.fromkeys(
                (tuple(m) if m else None, b, z)
                for m, b, z in itertools.product(
                    body.mesh_shapes, body.memory_budgets_bytes, body.zero_stages
                )
            )
        )
        if len(combos) > service.settings.max_sweep_points:
            raise ApiError(
                422,
                "sweep_too_large",
                f"the sweep has {len(combos)} points; this server allows at most "
                f"{service.settings.max_sweep_points}: split it",
            )
        points = []
        for mesh_shape, budget, zero in combos:
            request = build_request(
                graph,
                cluster,
                list(mesh_shape) if mesh_shape else None,
                budget,
                zero,
                body.options,
                service.settings,
            )
            key_dict = request.to_key_dict()
            points.append(
                {
                    "mesh_shape": list(mesh_shape) if mesh_shape else None,
                    "memory_budget_bytes": request.memory_budget_bytes,
                    "zero_stage": zero,
                    "key": plan_key(key_dict, service.versions),
                    "payload": payload_of(request, service.versions, graph_hash=key_dict["graph"]),
                }
            )
        sweep_id = hashlib.sha256("".join(p["key"] for p in points).encode()).hexdigest()
        service.store_graph(body.graph, points[0]["payload"]["graph"])
        record = [{k: v for k, v in p.items() if k != "payload"} for p in points]
        service.store.put(f"sweep:{sweep_id}", codec.encode(record), service.settings.job_ttl_s)
        return sweep_id, points

    async def sweep_view(service: Service, sweep_id: str, points: list[dict[str, Any]]) -> dict[str, Any]:
        rows = []
        for p in points:
            key = p["key"]
            row: dict[str, Any] = {
                "mesh_shape": p["mesh_shape"],
                "memory_budget_bytes": p["memory_budget_bytes"],
                "zero_stage": p["zero_stage"],
                "key": key,
                "status": "queued",
                "step_time_s": None,
                "memory_per_device_bytes": None,
                "chosen_mesh_shape": None,
                "gap": None,
                "min_feasible_bytes": None,
                "error": None,
                "links": {"job": f"/v1/jobs/{key}"},
            }
            record = await run_in_threadpool(service.plans.get, key)
            if record is not None:
                data = record.data()
                row.update(
                    status="succeeded",
                    step_time_s=data.get("step_time_s"),
                    memory_per_device_bytes=data.get("memory_per_device_bytes"),
                    chosen_mesh_shape=data.get("mesh_shape"),
                    gap=(data.get("solver") or {}).get("gap"),
                )
                row["links"]["plan"] = f"/v1/plans/{key}"
            else:
                info = await service.jobs.get(key)
                if info is not None:
                    error = info.error or {}
                    status = info.status.value
                    if error.get("kind") == "infeasible_budget" and info.status is JobStatus.FAILED:
                        status = "infeasible"
                    row.update(
                        status=status,
                        error=error.get("message") if info.terminal else None,
                        min_feasible_bytes=error.get("min_feasible_bytes"),
                    )
            rows.append(finite(row))
        complete = all(r["status"] not in ("queued", "running") for r in rows)
        return {
            "id": sweep_id,
            "complete": complete,
            "rows": rows,
            "table": sweep_table(rows),
            "links": {"self": f"/v1/sweeps/{sweep_id}"},
        }

    @app.post(
        "/v1/sweeps",
        summary="What-if sweep",
        status_code=202,
        response_class=Response,
        openapi_extra=_json_body("SweepBody"),
        responses={
            200: {
                "description": "Every point is done.",
                "content": {"application/json": {"schema": _ref("SweepView")}},
            },
            202: {
                "description": "Some points are still solving (Location: /v1/sweeps/{id}).",
                "content": {"application/json": {"schema": _ref("SweepView")}},
            },
            **_problem_responses(*_WRITE_ERRORS),
        },
    )
    async def create_sweep(
        request: Request,
        service: ServiceDep,
        _auth: Auth,
        wait: Annotated[float, Query(ge=0, le=600, description="Seconds to wait for every point.")] = 0,
    ) -> Response:
        """Plan every (mesh shape, budget, ZeRO stage) combination; returns step time vs memory."""
        raw = await read_body(request, service.settings)
        sweep_id, points = await run_in_threadpool(prepare_sweep, service, raw)
        for p in points:
            if await run_in_threadpool(service.plans.get, p["key"]) is not None:
                continue
            existing = await service.jobs.get(p["key"])
            if (
                existing is not None
                and existing.status is JobStatus.FAILED
                and ((existing.error or {}).get("kind") in DETERMINISTIC_ERRORS)
            ):
                continue
            await service.jobs.submit(p["key"], p["payload"])
        deadline = time.monotonic() + min(wait, service.settings.max_wait_s)
        for p in points:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await service.jobs.wait(p["key"], remaining, after_version=1 << 62)
        view = await sweep_view(service, sweep_id, points)
        status = 200 if view["complete"] else 202
        headers = {"Location": f"/v1/sweeps/{sweep_id}"}
        if status == 202:
            headers["Retry-After"] = str(service.settings.retry_after_s)
        return JSONResponse(view, status_code=status, headers=headers)

    @app.get(
        "/v1/sweeps/{sweep_id}",
        summary="A sweep's table",
        response_model=schemas.SweepView,
        responses=_problem_responses(404, 422, 503),
    )
    async def get_sweep(sweep_id: Key, service: ServiceDep) -> Response:
        """The sweep's rows as they fill in."""
        raw = await run_in_threadpool(service.store.get, f"sweep:{sweep_id}")
        if raw is None:
            raise ApiError(404, "sweep_not_found", f"no sweep {sweep_id}; it never existed or expired")
        points = codec.decode(raw)
        return JSONResponse(await sweep_view(service, sweep_id, points))

    # ---------------------------------------------------------- health and metrics

    @app.get("/livez", summary="Liveness", response_model=schemas.Liveness)
    async def livez() -> dict[str, str]:
        """The process answers."""
        return {"status": "alive"}

    @app.get(
        "/readyz",
        summary="Readiness",
        response_model=schemas.Readiness,
        responses={
            503: {
                "description": "Not ready.",
                "content": {"application/json": {"schema": _ref("Readiness")}},
            }
        },
    )
    async def readyz(request: Request) -> Response:
        """Whether the cache answers and jobs can run (Redis and workers when configured)."""
        service: Service | None = getattr(request.app.state, "service", None)
        if service is None:
            body = {
                "status": "not_ready",
                "checks": {"service": {"ok": False, "detail": "starting"}},
            }
            return JSONResponse(body, status_code=503)
        checks: dict[str, dict[str, Any]] = {}
        try:
            await run_in_threadpool(service.store.ping)
            checks["cache"] = {"ok": True, "backend": service.store.backend}
        except CacheUnavailable as exc:
            checks["cache"] = {"ok": False, "backend": service.store.backend, "detail": exc.message}
        checks["jobs"] = await service.jobs.health()
        ok = all(c.get("ok") for c in checks.values())
        return JSONResponse(
            {"status": "ready" if ok else "not_ready", "checks": finite(checks)},
            status_code=200 if ok else 503,
        )

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Text exposition format 0.0.4.",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def metrics(service: ServiceDep) -> Response:
        """Requests, cache hits, solve time and gap."""
        try:
            started: int | None = await service.jobs.solves_started()
        except CacheUnavailable:
            started = None
        return Response(service.metrics.render(started), media_type="text/plain; version=0.0.4")

    # ---------------------------------------------------------- OpenAPI

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        _, defs = models_json_schema(
            [
                (m, "validation")
                for m in (
                    PlanBody,
                    SweepBody,
                    EvaluateBody,
                    schemas.Problem,
                    schemas.JobView,
                    schemas.PlanRecordView,
                    schemas.SweepView,
                    schemas.Readiness,
                )
            ],
            ref_template="#/components/schemas/{model}",
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def check_plan_fits(graph: Graph, plan: Plan) -> None:
    """Raise :class:`PlanError` naming the first op the plan lacks or whose ports differ."""
    for op in graph.ops:
        ports = plan.ports.get(op.name)
        if ports is None:
            raise PlanError("plan_mismatch", f"the plan has no signature for op {op.name!r}", op=op.name)
        if list(op.inputs) != ports[0] or list(op.outputs) != ports[1]:
            raise PlanError(
                "plan_mismatch",
                f"op {op.name!r}: the plan's ports {ports} differ from the graph's "
                f"({list(op.inputs)}, {list(op.outputs)})",
                op=op.name,
            )


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """Aligned text: mesh, budget, ZeRO, status, step time, memory."""
    gib = 1024**3
    lines = [
        f"{'mesh':<10}{'budget GiB':>11}{'ZeRO':>6}  {'status':<11}{'step ms':>10}{'mem GiB':>9}{'gap':>8}"
    ]
    for r in rows:
        mesh = r["chosen_mesh_shape"] or r["mesh_shape"]
        budget = r["memory_budget_bytes"]
        step = r["step_time_s"]
        mem = r["memory_per_device_bytes"]
        gap = r["gap"]
        lines.append(
            f"{'x'.join(map(str, mesh)) if mesh else 'search':<10}"
            f"{budget / gib if budget else float('nan'):>11.2f}"
            f"{r['zero_stage']:>6}  {r['status']:<11}"
            f"{step * 1e3 if step is not None else float('nan'):>10.2f}"
            f"{mem / gib if mem is not None else float('nan'):>9.2f}"
            f"{'' if gap is None else f'{100 * gap:.2f}%':>8}"
        )
    return "\n".join(lines)
