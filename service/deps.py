"""FastAPI dependencies shared by the routers: the service, API keys, the client's identity.

With ``api_keys`` configured every ``/v1`` route and ``/metrics`` needs a valid
``X-API-Key`` (reads too: a plan tells what was planned); ``public_plan_reads``
opens ``GET /v1/plans/{key}`` alone.  Without keys the server is open, which
``autopar serve`` allows on loopback only (:func:`autopar_service.settings.check_exposure`).
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import APIKeyHeader

from autopar_service.admission import client_id
from autopar_service.problems import ApiError
from autopar_service.state import Service

__all__ = ["Auth", "Client", "Key", "PlanReadAuth", "ServiceDep", "client_address", "get_service"]

KEY_PATTERN = r"^[0-9a-f]{64}$"


def get_service(request: Request) -> Service:
    """The app's :class:`Service` (503 while the app is still starting)."""
    service: Service | None = getattr(request.app.state, "service", None)
    if service is None:
        raise ApiError(
            503, "starting", "the service is starting; retry shortly", headers={"Retry-After": "1"}
        )
    return service


api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key")

ServiceDep = Annotated[Service, Depends(get_service)]


def _check_key(service: Service, key: str | None) -> None:
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


def require_key(key: Annotated[str | None, Depends(api_key_header)], service: ServiceDep) -> None:
    """401 unless the ``X-API-Key`` is one of the configured keys (no keys: open)."""
    _check_key(service, key)


def require_plan_read(key: Annotated[str | None, Depends(api_key_header)], service: ServiceDep) -> None:
    """Like :func:`require_key`, unless plans are public (``public_plan_reads``)."""
    if not service.settings.public_plan_reads:
        _check_key(service, key)


def client_address(request: Request, header: str | None) -> str | None:
    """The client's address: the last entry of the trusted proxy's ``header`` when configured,
    else the peer address."""
    if header:
        forwarded = request.headers.get(header, "").split(",")[-1].strip()
        if forwarded:
            return forwarded
    return request.client.host if request.client else None


def current_client(
    request: Request, key: Annotated[str | None, Depends(api_key_header)], service: ServiceDep
) -> str:
    """Who is asking: a digest of the API key when keys are configured, else the client's address.

    Without configured keys an ``X-API-Key`` proves nothing (anyone can send a new one per
    request), so it does not name the client: the per-client job cap holds per address.
    """
    settings = service.settings
    if settings.api_keys and key:
        return client_id(key, None)
    return client_id(None, client_address(request, settings.client_address_header))


Auth = Annotated[None, Depends(require_key)]
PlanReadAuth = Annotated[None, Depends(require_plan_read)]
Client = Annotated[str, Depends(current_client)]
Key = Annotated[str, Path(pattern=KEY_PATTERN, description="64 hex digits")]
