"""The API's routers, one per resource; :data:`ROUTERS` is what ``create_app`` includes."""

from __future__ import annotations

from fastapi import APIRouter

from autopar_service import explorer
from autopar_service.routers import evaluate, health, jobs, plans, sweeps

__all__ = ["ROUTERS"]

ROUTERS: list[APIRouter] = [
    plans.router,
    jobs.router,
    sweeps.router,
    evaluate.router,
    health.router,
    explorer.router,
]
