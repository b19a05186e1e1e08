"""The OpenAPI document and the offline Swagger UI.

Routes read their bodies themselves (:mod:`autopar_service.body`), so the request and
response schemas are attached here: :func:`json_body` and
:func:`problem_responses` for each route, and :func:`install_openapi` adds the
models' schemas (the graph field by field) to ``components``.  ``/docs`` is
Swagger UI served from the ``swagger-ui-bundle`` package's files: no CDN.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from autopar_service import schemas
from autopar_service.problems import PROBLEM_JSON
from autopar_service.requests import EvaluateBody, PlanBody, SweepBody

__all__ = [
    "JOB_LINKS",
    "PLAN_LINKS",
    "SWEEP_LINKS",
    "WRITE_ERRORS",
    "install_docs",
    "install_openapi",
    "json_body",
    "problem_responses",
    "ref",
]

WRITE_ERRORS = (400, 401, 413, 415, 422, 429, 503)

_DESCRIPTIONS = {
    400: "Malformed body (not JSON, bad encoding).",
    401: "Missing or wrong X-API-Key.",
    403: "Not allowed (a job only its submitters may cancel).",
    404: "Unknown job, plan or sweep.",
    409: "The job already finished.",
    413: "Body or graph too large.",
    415: "Unsupported content type or Content-Encoding.",
    422: "Invalid request: graph (names the op), configuration, infeasible budget, too deep.",
    429: "Too many unfinished jobs (this client or the server); retry after Retry-After.",
    503: "Cache or queue unavailable, or parsing took too long; retry after Retry-After.",
}

_MODELS: tuple[type[BaseModel], ...] = (
    PlanBody,
    SweepBody,
    EvaluateBody,
    schemas.Problem,
    schemas.JobView,
    schemas.PlanRecordView,
    schemas.SweepView,
    schemas.Readiness,
)


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        s: {"description": _DESCRIPTIONS[s], "content": {PROBLEM_JSON: {"schema": ref("Problem")}}}
        for s in statuses
    }


JOB_LINKS = {
    "GetJob": {"operationId": "getJob", "parameters": {"job_id": "$response.body#/id"}},
    "JobEvents": {"operationId": "jobEvents", "parameters": {"job_id": "$response.body#/id"}},
    "CancelJob": {"operationId": "cancelJob", "parameters": {"job_id": "$response.body#/id"}},
    "GetPlan": {"operationId": "getPlan", "parameters": {"key": "$response.body#/id"}},
}
"""OpenAPI links from a job (202) to what can be done with it (stateful clients and tests)."""
PLAN_LINKS = {
    "GetPlan": {"operationId": "getPlan", "parameters": {"key": "$response.body#/key"}},
    "GetJob": {"operationId": "getJob", "parameters": {"job_id": "$response.body#/key"}},
}
SWEEP_LINKS = {"GetSweep": {"operationId": "getSweep", "parameters": {"sweep_id": "$response.body#/id"}}}


def json_body(model: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "description": "JSON; Content-Encoding gzip or zstd accepted.",
            "content": {"application/json": {"schema": ref(model)}},
        }
    }


def install_openapi(app: FastAPI) -> None:
    """Generate the document once, with every body and response model in ``components``."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        _, defs = models_json_schema(
            [(m, "validation") for m in _MODELS], ref_template="#/components/schemas/{model}"
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(defs.get("$defs", {}))
        components.update(schemas.GRAPH_DEFS)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI with its scripts and styles served by this app (works offline)."""
    import swagger_ui_bundle

    app.mount("/docs/assets", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - docs",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon-32x32.png",
        )
