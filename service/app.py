"""The planning API (FastAPI), versioned under ``/v1``: a short factory over the routers.

::

    POST   /v1/plans               200 plan (cache hit) | 202 job (Location, Retry-After)
    GET    /v1/plans/{key}         a cached plan (immutable, ETag / If-None-Match)
    GET    /v1/jobs/{id}           job status (?wait=N: until it ends; &since=V: until it changes)
    GET    /v1/jobs/{id}/events    server-sent events: progress until the job ends
    DELETE /v1/jobs/{id}           withdraw your request (the job stops when nobody waits)
    POST   /v1/evaluate            evaluate a given plan with the independent evaluator
    POST   /v1/sweeps              what-if table over budgets / ZeRO stages / mesh shapes
    GET    /v1/sweeps/{id}         the table as it fills in
    GET    /livez  /readyz  /metrics  /docs

Routes live in :mod:`autopar_service.routers` (one module per resource), shared
dependencies in :mod:`autopar_service.deps`, body decoding in :mod:`autopar_service.body`,
error handlers in :mod:`autopar_service.handlers`.  Solves run in the job manager:
local processes without Redis, RQ workers with it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Sequence

from fastapi import APIRouter, FastAPI
from starlette.concurrency import run_in_threadpool

from autopar.errors import ConfigError
from autopar.version import __version__
from autopar_cache import open_store
from autopar_cache.base import Store
from autopar_cache.plans import code_versions
from autopar_service.handlers import install_handlers
from autopar_service.jobs import JobManager
from autopar_service.metrics import Metrics
from autopar_service.middleware import TimingMiddleware
from autopar_service.openapi import install_docs, install_openapi
from autopar_service.routers import ROUTERS
from autopar_service.settings import Settings, load_settings
from autopar_service.state import Service

__all__ = ["create_app", "start_service"]

DESCRIPTION = (
    "Auto-parallel planning: N-D SBP plans for a training graph on a device mesh under a ZeRO-aware "
    "per-device memory budget.  With API keys configured every `/v1` route and `/metrics` needs "
    "`X-API-Key`.  Errors are RFC 9457 problem+json with a stable `code`."
)


def _job_manager(settings: Settings, store: Store, versions: dict[str, str]) -> JobManager:
    if settings.uses_redis:
        from autopar_cache.redis_store import RedisStore
        from autopar_service.rq_manager import RQJobManager

        if not isinstance(store, RedisStore):
            raise ConfigError("bad_settings", "AUTOPAR_REDIS_URL is set but the store is not Redis")
        return RQJobManager(settings, store)
    from autopar_service.local_jobs import LocalJobManager

    return LocalJobManager(settings, store, versions)


async def start_service(settings: Settings, store: Store) -> Service:
    """The shared state with its job manager started."""
    versions = await run_in_threadpool(code_versions)
    jobs = _job_manager(settings, store, versions)
    service = Service(settings, store, jobs, versions)
    jobs.on_terminal = service.on_terminal  # type: ignore[attr-defined]
    await jobs.start()
    await service.pool.start()
    return service


def create_app(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    routers: Sequence[APIRouter] = ROUTERS,
) -> FastAPI:
    """The API.  ``store`` defaults to Redis (``settings.redis_url``) or the embedded cache."""
    settings = settings or load_settings()
    holder: dict[str, Service] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        the_store = store or open_store(
            settings.redis_url,
            settings.cache_dir,
            size_limit_bytes=settings.cache_size_limit_bytes,
            socket_timeout_s=settings.redis_timeout_s,
            max_connections=settings.redis_max_connections,
        )
        service = await start_service(settings, the_store)
        holder["service"] = app.state.service = service
        if settings.freeze_gc:
            gc.collect()
            gc.freeze()  # what start built lives as long as the app: no collection walks it again
        try:
            yield
        finally:
            await service.pool.close()
            await service.jobs.close()
            holder.pop("service", None)
            if store is None:
                the_store.close()

    app = FastAPI(
        title="autopar planning service",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )

    def current_metrics() -> Metrics | None:
        service = holder.get("service")
        return service.metrics if service is not None else None

    app.add_middleware(TimingMiddleware, metrics_of=current_metrics)
    install_handlers(app, settings.retry_after_s)
    for router in routers:
        app.include_router(router)
    install_docs(app)
    install_openapi(app)
    return app
