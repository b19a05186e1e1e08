"""The plan explorer: a small web page for experimenting, and plan reports over HTTP.

::

    GET /                              the experimenter page (service/static/index.html)
    GET /ui/{file}                     its script and style, and plotly.js (served from the Python package)
    GET /v1/explorer/options           bundled models, device presets, ZeRO stages (for the page's form)
    GET /v1/models/{name}/graph        a bundled model's training-step graph (autopar.graph/v1 JSON)
    GET /v1/plans/{key}/report         the HTML report of a cached plan (:mod:`autopar_service.report`)

The page is plain HTML and JavaScript (no build step).  It talks to the same
API as any client: ``POST /v1/plans``, the job's server-sent events read with
``fetch`` (so the ``X-API-Key`` header travels with it), ``POST /v1/sweeps``.
Every ``/v1`` route here needs the API key (when keys are configured); the page and its
files do not.  A bundled model's graph is built once per process and kept
(:func:`autopar_service.graphs.model_json`: room for every bundled model), so clients
cycling through models cannot force rebuilds.  The report
is memoized per plan and canonical compare set, is rendered in a worker process
(:mod:`autopar_service.work_pool`), at most ``max_report_renders`` at a time (429 beyond),
and needs the plan's graph, which the service keeps for ``job_ttl_s`` after a solve.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from autopar.baselines.problem import BASELINES
from autopar.hardware.cluster import PRESETS
from autopar_service import work_tasks
from autopar_service.deps import Auth, Client
from autopar_service.graphs import model_json
from autopar_service.problems import PROBLEM_JSON, ApiError
from autopar_service.report import plotly_js
from autopar_service.routers.common import in_worker

__all__ = ["router"]

STATIC_DIR = Path(__file__).parent / "static"
_STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
REPORT_MEMO_SIZE = 4
"""Rendered reports kept in memory per app (each is a few MB, mostly plotly.js)."""

router = APIRouter()


def _problems(**descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses: ``_404="..."`` -> a 404 problem+json answer with that description."""
    return {
        int(code.lstrip("_")): {
            "description": text,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for code, text in descriptions.items()
    }


def _service(request: Request) -> Any:
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise ApiError(
            503, "starting", "the service is starting; retry shortly", headers={"Retry-After": "1"}
        )
    return service


@functools.lru_cache(maxsize=1)
def _plotly_bytes() -> bytes:
    return plotly_js().encode()


@router.get("/", include_in_schema=False)
async def index() -> Response:
    """The experimenter page."""
    return HTMLResponse((STATIC_DIR / "index.html").read_bytes(), headers={"Cache-Control": "no-cache"})


@router.get("/ui/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    """The page's script and style, and plotly.js."""
    if name == "plotly.min.js":
        return Response(
            _plotly_bytes(), media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"}
        )
    path = STATIC_DIR / name
    kind = _STATIC_TYPES.get(path.suffix)
    if kind is None or "/" in name or name.startswith(".") or not path.is_file():
        raise ApiError(404, "not_found", f"no file {name!r} under /ui/")
    return Response(path.read_bytes(), media_type=kind, headers={"Cache-Control": "no-cache"})


@router.get(
    "/v1/explorer/options",
    summary="Choices for the explorer page's form",
    responses=_problems(_401="Missing or wrong X-API-Key (when the server has keys)."),
)
async def options(_auth: Auth) -> dict[str, Any]:
    """Bundled model names, device presets with their memory, ZeRO stages, baselines to compare."""
    from autopar.models import MODEL_NAMES

    return {
        "models": list(MODEL_NAMES),
        "presets": {name: {"memory_bytes": spec.memory_bytes} for name, spec in sorted(PRESETS.items())},
        "zero_stages": [0, 1, 2, 3],
        "baselines": list(BASELINES),
    }


@router.get(
    "/v1/models/{name}/graph",
    summary="A bundled model's graph",
    response_class=Response,
    responses={
        200: {"description": "The graph.", "content": {"application/json": {"schema": {"type": "object"}}}},
        **_problems(
            _401="Missing or wrong X-API-Key (when the server has keys).",
            _404="No bundled model of that name.",
        ),
    },
)
async def model_graph(name: str, _auth: Auth) -> Response:
    """The training-step graph of a bundled model, ready to send as ``graph`` in ``POST /v1/plans``."""
    from autopar.models import MODEL_NAMES

    if name not in MODEL_NAMES:
        raise ApiError(
            404, "model_not_found", f"no bundled model {name!r}; choose one of {list(MODEL_NAMES)}"
        )
    body = await run_in_threadpool(model_json, name)
    # private: with keys configured it needs one, so no shared cache may keep it for others
    return Response(body, media_type="application/json", headers={"Cache-Control": "private, max-age=3600"})


@router.get(
    "/v1/plans/{key}/report",
    summary="A cached plan's HTML report",
    response_class=HTMLResponse,
    responses=_problems(
        _401="Missing or wrong X-API-Key (when the server has keys).",
        _404="Unknown plan, or its graph is no longer stored.",
        _422="Bad key or an unknown baseline in compare.",
        _429="Too many reports are being rendered at once; retry after Retry-After.",
        _503="The service is starting, or the cache is unavailable.",
    ),
)
async def plan_report(
    request: Request,
    key: Annotated[str, PathParam(pattern=r"^[0-9a-f]{64}$", description="64 hex digits")],
    _auth: Auth,
    client: Client,
    compare: Annotated[
        list[str] | None,
        Query(description=f"Baselines to show side by side: {', '.join(BASELINES)} (default megatron)."),
    ] = None,
) -> Response:
    """A self-contained HTML page: headline, communication, memory timeline, per-layer layouts;
    of a pipeline plan also its stages (blocks, devices, mesh, time and memory per stage), the
    baselines priced in the same stages."""
    service = _service(request)
    # the canonical compare set: another order or a repeat is the same report (one memo entry)
    kinds = tuple(sorted(set(compare if compare is not None else ["megatron"])))
    bad = [k for k in kinds if k not in BASELINES]
    if bad:
        raise ApiError(
            422, "invalid_request", f"compare={bad[0]!r} is not a baseline; choose from {BASELINES}"
        )
    memo: OrderedDict[tuple[str, tuple[str, ...]], bytes] | None = getattr(
        request.app.state, "report_memo", None
    )
    if memo is None:
        memo = request.app.state.report_memo = OrderedDict()
    body = memo.get((key, kinds))
    if body is None:
        body = await _render_bounded(request, service, client, key, kinds)
        memo[(key, kinds)] = body
        while len(memo) > REPORT_MEMO_SIZE:
            memo.popitem(last=False)
    return HTMLResponse(body, headers={"Cache-Control": "private, max-age=3600"})


async def _render_bounded(
    request: Request, service: Any, client: str, key: str, kinds: tuple[str, ...]
) -> bytes:
    """Render in a worker process (:func:`autopar_service.work_tasks.render_report`, in turn with
    the other clients' work), at most ``max_report_renders`` at once (429 beyond: each costs
    seconds), stopped past ``max_render_s``."""
    limit = service.settings.max_report_renders
    state = request.app.state
    rendering = getattr(state, "reports_rendering", 0)
    if rendering >= limit:
        raise ApiError(
            429,
            "too_many_reports",
            f"the server is rendering {limit} reports, its limit; retry shortly",
            headers={"Retry-After": str(service.settings.retry_after_s)},
        )
    state.reports_rendering = rendering + 1
    try:
        page: bytes = await in_worker(
            service,
            client,
            work_tasks.render_report,
            key,
            kinds,
            parse=False,
            timeout_s=service.settings.max_render_s,
        )
        return page
    finally:
        state.reports_rendering -= 1
