"""What every route shares: settings, store, plan cache, jobs, metrics, admission.

The :class:`Service` is built in the app's lifespan and reached through the
``get_service`` dependency (:mod:`autopar_service.deps`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from autopar_cache import codec
from autopar_cache.base import Store
from autopar_cache.plans import PlanCache, PlanRecord
from autopar_service.admission import Admission
from autopar_service.jobs import JobInfo, JobManager
from autopar_service.metrics import Metrics
from autopar_service.settings import Settings
from autopar_service.tasks import graph_key

__all__ = ["BodyIndex", "Service"]


class BodyIndex:
    """Request-body digest -> plan key, for bodies whose plan is cached (bounded LRU, this process).

    A byte-identical body of an earlier cache hit is answered without parsing.
    Only plan hits are indexed, so a client cannot grow it with bodies that never solved.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> str | None:
        with self._lock:
            key = self._keys.get(digest)
            if key is not None:
                self._keys.move_to_end(digest)
            return key

    def put(self, digest: str, key: str) -> None:
        if self.size == 0:
            return
        with self._lock:
            self._keys[digest] = key
            self._keys.move_to_end(digest)
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)


class Service:
    """The shared state of one API process."""

    def __init__(self, settings: Settings, store: Store, jobs: JobManager, versions: dict[str, str]):
        self.settings = settings
        self.store = store
        self.plans = PlanCache(store, settings.plan_ttl_s)
        self.jobs = jobs
        self.metrics = Metrics()
        self.versions = versions
        self.bodies = BodyIndex(settings.body_index_size)
        self.admission = Admission(settings)
        self.parse_slots = asyncio.Semaphore(settings.max_concurrent_parses)
        """Bodies parsed at once (:func:`autopar_service.routers.common.in_thread_bounded`)."""
        self.parsing: dict[str, int] = {}
        """Bodies being parsed per client (``max_parses_per_client``; they count toward
        ``max_jobs_per_client`` too)."""

    @contextlib.contextmanager
    def parsing_by(self, client: str | None) -> Iterator[None]:
        """Count one body of ``client`` as being parsed while the block runs."""
        if client is None:
            yield
            return
        self.parsing[client] = self.parsing.get(client, 0) + 1
        try:
            yield
        finally:
            left = self.parsing[client] - 1
            if left:
                self.parsing[client] = left
            else:
                del self.parsing[client]

    def cached_body(self, digest: str) -> PlanRecord | None:
        """The cached plan of a byte-identical earlier body, if any (sync: call from a thread)."""
        key = self.bodies.get(digest)
        return self.plans.get(key) if key is not None else None

    def store_graph(self, graph_data: dict[str, Any], content_hash: str) -> None:
        self.store.put(graph_key(content_hash), codec.encode(graph_data), self.settings.job_ttl_s)

    def on_terminal(self, info: JobInfo) -> None:
        result = info.result or {}
        self.metrics.job_finished(info.status.value, result.get("solve_wall_s"), result.get("gap"))
