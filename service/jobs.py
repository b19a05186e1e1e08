"""Jobs: one solve of one canonical request, identified by its plan key.

The job id *is* the plan key (the content hash of the canonical request), so
identical requests in flight share one job (single-flight) and a finished
job's plan is ``GET /v1/plans/{id}``.

::

    queued ──> running ──> succeeded        (plan stored under plan:{id})
       │          │  └───> failed            (error: code, message, details)
       │          └──────> queued            (worker lost, retries left)
       └─────────────────> canceled          (DELETE /v1/jobs/{id})

Two managers implement :class:`JobManager`: :class:`autopar_service.local_jobs.LocalJobManager`
(solver processes beside the API, no Redis) and :class:`autopar_service.rq_manager.RQJobManager`
(RQ queue, ``autopar worker`` processes anywhere).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, Protocol

__all__ = [
    "DETERMINISTIC_ERRORS",
    "JobInfo",
    "JobManager",
    "JobStatus",
    "finite",
    "gap_of",
]


class JobStatus(str, Enum):
    """Where a job is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED)


DETERMINISTIC_ERRORS = frozenset({"infeasible_budget", "invalid_graph", "bad_config", "invalid_plan"})
"""Error *kinds* (``error["kind"]``) that the same request would hit again: a new
POST answers them from the job record instead of solving again."""


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def gap_of(objective: float | None, bound: float | None) -> float | None:
    """Relative optimality gap ``|objective - bound| / |objective|`` (None when unknown)."""
    if objective is None or bound is None:
        return None
    if not (math.isfinite(objective) and math.isfinite(bound)):
        return None
    if objective == 0:
        return 0.0 if bound == 0 else None
    return abs(objective - bound) / abs(objective)


@dataclass
class JobInfo:
    """The state of one job, as stored and as reported by ``GET /v1/jobs/{id}``."""

    id: str
    status: JobStatus = JobStatus.QUEUED
    phase: str | None = None
    """Solver phase of the last progress report (``cost_tables``, ``solve``, ``done`` ...)."""
    objective: float | None = None
    """Best predicted step time found so far, seconds."""
    bound: float | None = None
    """Proven lower bound on the step time, seconds."""
    elapsed_s: float | None = None
    """Seconds since the current attempt started running."""
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    """How many times the job started running (retries after a lost worker add one)."""
    error: dict[str, Any] | None = None
    """``{"kind", "code", "message", ...details}`` when failed or canceled."""
    result: dict[str, Any] | None = None
    """Short result when succeeded: step time, memory, solver status and gap."""
    version: int = 0
    """Bumped on every change; SSE and long-polls wait for it to move."""
    fence: str | None = None
    """Fencing token of the attempt that may write the job's progress and end (RQ): a fresh
    one per attempt; a requeue clears it, so a superseded attempt's writes are discarded
    (:mod:`autopar_service.rq_jobs`).  Not shown to clients."""

    @property
    def gap(self) -> float | None:
        return gap_of(self.objective, self.bound)

    @property
    def terminal(self) -> bool:
        return self.status.terminal

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobInfo:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = JobStatus(values.get("status", "queued"))
        return cls(**values)

    def view(self) -> dict[str, Any]:
        """The API representation (strict JSON, with links)."""
        now = time.time()
        elapsed = self.elapsed_s
        if self.started_at is not None:
            # the wall clock since the attempt started, never less than a progress report
            # said (a report's clock starts later, inside the worker): it never goes backwards
            end = now if self.status is JobStatus.RUNNING else self.finished_at
            if end is not None:
                elapsed = max(elapsed or 0.0, end - self.started_at)
        links = {"self": f"/v1/jobs/{self.id}", "events": f"/v1/jobs/{self.id}/events"}
        if self.status is JobStatus.SUCCEEDED:
            links["plan"] = f"/v1/plans/{self.id}"
        return finite(
            {
                "id": self.id,
                "status": self.status.value,
                "phase": self.phase,
                "objective": self.objective,
                "bound": self.bound,
                "gap": self.gap,
                "elapsed_s": elapsed,
                "created_at": self.created_at,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
                "attempts": self.attempts,
                "error": self.error,
                "result": self.result,
                "links": links,
            }
        )


class JobManager(Protocol):
    """Runs solves off the API's event loop and tracks them."""

    kind: str
    """``"local"`` or ``"rq"``."""

    async def start(self) -> None:
        """Start background machinery (called once, in the API's lifespan)."""
        ...

    async def close(self) -> None:
        """Stop background machinery; running local solves are terminated."""
        ...

    async def submit(self, job_id: str, payload: dict[str, Any], *, refresh: bool = False) -> JobInfo:
        """Start a job for ``payload`` unless one with ``job_id`` is in flight (single-flight).

        A succeeded job is returned as is (its plan is cached) unless ``refresh``;
        failed and canceled jobs are started again.
        """
        ...

    async def get(self, job_id: str) -> JobInfo | None:
        """The job's current state, or None when unknown (never submitted, or expired)."""
        ...

    async def wait(self, job_id: str, timeout_s: float, after_version: int = -1) -> JobInfo | None:
        """Return when the version passes ``after_version``, the job ends, or at the timeout."""
        ...

    async def cancel(self, job_id: str) -> JobInfo | None:
        """Cancel a queued or running job (a terminal job is returned unchanged)."""
        ...

    async def health(self) -> dict[str, Any]:
        """``{"ok": bool, ...}``: whether jobs can run now (workers alive, pool up)."""
        ...

    async def active(self) -> int:
        """How many jobs are queued or running now (the whole backend)."""
        ...

    async def solves_started(self) -> int:
        """How many solve attempts have started (all processes sharing the backend)."""
        ...
