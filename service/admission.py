"""Admission control and job ownership.

* A client (its API key when keys are configured, else its address) may have at most
  ``max_jobs_per_client`` unfinished jobs it started; the whole backend at most
  ``max_active_jobs``.  Beyond either: 429 with ``Retry-After``, decided
  *before* the body is parsed (:meth:`Admission.precheck`).  Below the bounds,
  joining a job already in flight (the same request) does not count: it costs
  no solve.
* Every client that asked for a job owns a reference to it.  ``DELETE`` by an
  owner drops that reference; the job is canceled only when no owner is left,
  so one client cannot cancel another's wait.  A client that never asked for
  the job cannot cancel it (403).

Ownership is kept per API process (bounded LRU): behind several API replicas,
a client cancels through the replica it submitted to.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from autopar_service.problems import ApiError
from autopar_service.settings import Settings

if TYPE_CHECKING:
    from autopar_service.jobs import JobManager

__all__ = ["Admission", "client_id"]

_OWNED_LIMIT = 100_000
"""Jobs whose owners one API process remembers (least recently submitted forgotten first)."""


def client_id(api_key: str | None, address: str | None) -> str:
    """A stable, non-secret client identity: a digest of the key, else the address."""
    if api_key:
        return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:16]
    return f"addr:{address or 'unknown'}"


class Admission:
    """Per-client and global bounds on unfinished jobs; owners of each job."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.owners: OrderedDict[str, set[str]] = OrderedDict()
        self._missing_since: dict[str, float] = {}

    def _too_many(self, detail: str) -> ApiError:
        return ApiError(
            429,
            "too_many_jobs",
            detail,
            headers={"Retry-After": str(self.settings.retry_after_s)},
        )

    async def _unfinished_of(self, client: str, jobs: JobManager) -> int:
        count = 0
        for job_id, owners in list(self.owners.items()):
            if client not in owners:
                continue
            info = await jobs.get(job_id)
            if info is None or info.terminal:
                self.owners.pop(job_id, None)
            else:
                count += 1
        return count

    async def precheck(self, client: str, jobs: JobManager, *, parsing: int = 0) -> None:
        """Refuse (429) before parsing a body when this client or the server is at its bound.

        Shedding load before the parse is the point: a large graph takes seconds to read.
        A client at its bound can still follow its jobs (``GET /v1/jobs/{id}``) and get
        byte-identical cache hits (answered before this check).  The client's bodies still
        being parsed (``parsing``) count as unfinished jobs: a parse may start one.
        """
        await self._check_bounds(client, jobs, parsing)

    async def _check_bounds(self, client: str, jobs: JobManager, parsing: int = 0) -> None:
        if await self._unfinished_of(client, jobs) + parsing >= self.settings.max_jobs_per_client:
            raise self._too_many(
                f"you have {self.settings.max_jobs_per_client} unfinished jobs, the most one client "
                "may have; wait for one to end (or cancel one) and retry"
            )
        if await jobs.active() >= self.settings.max_active_jobs:
            raise self._too_many(
                f"the server has {self.settings.max_active_jobs} unfinished jobs, its limit; retry later"
            )

    async def admit(self, client: str, job_id: str, jobs: JobManager, *, new: bool) -> None:
        """Raise 429 when starting a ``new`` job would exceed a bound; record ``client`` as owner.

        The owners of an ended job are forgotten when a new job starts under its id; a job
        still running keeps its owners (a ``refresh`` of it joins it, it does not take it over).
        """
        if new:
            await self._check_bounds(client, jobs)
            current = await jobs.get(job_id)
            if current is None or current.terminal:
                self.owners.pop(job_id, None)
        self.owners.setdefault(job_id, set()).add(client)
        self.owners.move_to_end(job_id)
        while len(self.owners) > _OWNED_LIMIT:
            self.owners.popitem(last=False)

    def lost(self, job_id: str) -> bool:
        """Whether a job this process submitted has had no record for ``worker_lost_after_s``.

        Called when the backend has no record of it: a worker still solving it puts
        the record back within a heartbeat, so only a job missing that long is lost.
        """
        if job_id not in self.owners:
            return False
        now = time.monotonic()
        since = self._missing_since.setdefault(job_id, now)
        if len(self._missing_since) > _OWNED_LIMIT:
            self._missing_since = {k: v for k, v in self._missing_since.items() if k in self.owners}
        return now - since >= self.settings.worker_lost_after_s

    def release(self, client: str, job_id: str) -> bool:
        """Drop ``client``'s reference; True when no owner is left (the job should be canceled).

        403 when ``client`` does not own the job.
        """
        owners = self.owners.get(job_id)
        if owners is None or client not in owners:
            raise ApiError(
                403,
                "not_job_owner",
                "only a client that submitted this job can cancel it (through the same API server)",
            )
        owners.discard(client)
        if owners:
            return False
        del self.owners[job_id]
        return True
