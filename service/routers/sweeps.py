"""``POST /v1/sweeps`` (a what-if table: one plan per point) and ``GET /v1/sweeps/{id}``."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from autopar_cache import codec
from autopar_service import schemas, work_tasks
from autopar_service.body import BodyRoute, DecodedRequest
from autopar_service.deps import Auth, Client, Key, ServiceDep
from autopar_service.jobs import DETERMINISTIC_ERRORS, JobStatus, finite
from autopar_service.openapi import SWEEP_LINKS, WRITE_ERRORS, json_body, problem_responses, ref
from autopar_service.problems import ApiError
from autopar_service.routers.common import deadline_after, in_worker
from autopar_service.state import Service

__all__ = ["router", "sweep_table"]

router = APIRouter(route_class=BodyRoute, tags=["sweeps"])

_NEVER = 1 << 62


async def _row(service: Service, p: dict[str, Any]) -> dict[str, Any]:
    key = p["key"]
    row: dict[str, Any] = {
        "mesh_shape": p["mesh_shape"],
        "memory_budget_bytes": p["memory_budget_bytes"],
        "zero_stage": p["zero_stage"],
        # sweeps stored before the iteration options were single micro-batches without checkpointing
        "micro_batches": p.get("micro_batches", 1),
        "checkpointing": p.get("checkpointing", "off"),
        "key": key,
        "status": "queued",
        "iteration_time_s": None,
        "micro_batch_time_s": None,
        "step_time_s": None,  # deprecated alias, kept one version: the iteration at K = 1
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
            iteration_time_s=((data.get("plan") or {}).get("predicted") or {}).get("iteration_time_s"),
            micro_batch_time_s=((data.get("plan") or {}).get("predicted") or {}).get("micro_batch_time_s"),
            memory_per_device_bytes=data.get("memory_per_device_bytes"),
            chosen_mesh_shape=data.get("mesh_shape"),
            gap=(data.get("solver") or {}).get("gap"),
        )
        row["links"]["plan"] = f"/v1/plans/{key}"
        return finite(row)
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
    return finite(row)


async def sweep_view(service: Service, sweep_id: str, points: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [await _row(service, p) for p in points]
    return {
        "id": sweep_id,
        "complete": all(r["status"] not in ("queued", "running") for r in rows),
        "rows": rows,
        "table": sweep_table(rows),
        "links": {"self": f"/v1/sweeps/{sweep_id}"},
    }


async def _submit_points(service: Service, client: str, points: list[dict[str, Any]]) -> None:
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
        new = existing is None or existing.terminal
        await service.admission.admit(client, p["key"], service.jobs, new=new)
        await service.jobs.submit(p["key"], p["payload"])


@router.post(
    "/v1/sweeps",
    summary="What-if sweep",
    operation_id="createSweep",
    status_code=202,
    response_class=Response,
    openapi_extra=json_body("SweepBody"),
    responses={
        200: {
            "description": "Every point is done.",
            "content": {"application/json": {"schema": ref("SweepView")}},
            "links": SWEEP_LINKS,
        },
        202: {
            "description": "Some points are still solving (Location: /v1/sweeps/{id}).",
            "content": {"application/json": {"schema": ref("SweepView")}},
            "links": SWEEP_LINKS,
        },
        **problem_responses(*WRITE_ERRORS),
    },
)
async def create_sweep(
    request: Request,
    service: ServiceDep,
    _auth: Auth,
    client: Client,
    wait: Annotated[float, Query(ge=0, le=600, description="Seconds to wait for every point.")] = 0,
) -> Response:
    """Plan every (mesh shape, budget, ZeRO stage) combination; returns step time vs memory."""
    deadline = deadline_after(wait, service)
    assert isinstance(request, DecodedRequest)
    service.pool.check_room(client, body_unread=True)  # at its bound: refused before its body is read
    await service.admission.precheck(client, service.jobs, parsing=service.parsing.get(client, 0))
    # parsed and checked in a worker process, which stores the graph and the sweep's record
    sweep_id, points = await in_worker(
        service, client, work_tasks.prepare_sweep, body=await request.take_body()
    )
    await _submit_points(service, client, points)
    for p in points:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        await service.jobs.wait(p["key"], remaining, after_version=_NEVER)
    view = await sweep_view(service, sweep_id, points)
    status = 200 if view["complete"] else 202
    headers = {"Location": f"/v1/sweeps/{sweep_id}"}
    if status == 202:
        headers["Retry-After"] = str(service.settings.retry_after_s)
    return JSONResponse(view, status_code=status, headers=headers)


@router.get(
    "/v1/sweeps/{sweep_id}",
    summary="A sweep's table",
    operation_id="getSweep",
    response_model=schemas.SweepView,
    responses=problem_responses(401, 404, 422, 503),
)
async def get_sweep(sweep_id: Key, service: ServiceDep, _auth: Auth) -> Response:
    """The sweep's rows as they fill in."""
    raw = await run_in_threadpool(service.store.get, f"sweep:{sweep_id}")
    if raw is None:
        raise ApiError(404, "sweep_not_found", f"no sweep {sweep_id}; it never existed or expired")
    return JSONResponse(await sweep_view(service, sweep_id, codec.decode(raw)))


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """Aligned text: mesh, budget, ZeRO, K, checkpointing, status, iteration and micro-batch time, memory."""
    gib = 1024**3
    lines = [
        f"{'mesh':<10}{'budget GiB':>11}{'ZeRO':>6}{'K':>5}  {'ckpt':<5}  {'status':<11}{'iter ms':>10}"
        f"{'micro ms':>10}{'mem GiB':>9}{'gap':>8}"
    ]
    for r in rows:
        mesh = r["chosen_mesh_shape"] or r["mesh_shape"]
        budget = r["memory_budget_bytes"]
        iteration = r.get("iteration_time_s")
        micro = r.get("micro_batch_time_s")
        mem = r["memory_per_device_bytes"]
        gap = r["gap"]
        lines.append(
            f"{'x'.join(map(str, mesh)) if mesh else 'search':<10}"
            f"{budget / gib if budget else float('nan'):>11.2f}"
            f"{r['zero_stage']:>6}{r.get('micro_batches', 1):>5}  {r.get('checkpointing', 'off'):<5}  "
            f"{r['status']:<11}"
            f"{iteration * 1e3 if iteration is not None else float('nan'):>10.2f}"
            f"{micro * 1e3 if micro is not None else float('nan'):>10.2f}"
            f"{mem / gib if mem is not None else float('nan'):>9.2f}"
            f"{'' if gap is None else f'{100 * gap:.2f}%':>8}"
        )
    return "\n".join(lines)
