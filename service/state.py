"""What every route shares: settings, store, plan cache, jobs, metrics, admission, the worker
processes of requests, the stream slots.

The :class:`Service` is built in the app's lifespan and reached through the
``get_service`` dependency (:mod:`autopar_service.deps`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator

from autopar_cache.base import Store
from autopar_cache.plans import PlanCache, PlanRecord
from autopar_service.admission import Admission
from autopar_service.jobs import JobInfo, JobManager
from autopar_service.metrics import Metrics
from autopar_service.settings import Settings
from autopar_service.streams import StreamSlots
from autopar_service.tasks import graph_key
from autopar_service.work_pool import WorkPool

__all__ = ["BodyIndex", "Service"]


class BodyIndex:
    """Request-body digest -> (plan key, the name the body gives its graph), for bodies whose plan
    is cached (bounded LRU, this process).

    A byte-identical body of an earlier cache hit is answered without parsing.
    Only plan hits are indexed, so a client cannot grow it with bodies that never solved.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> tuple[str, str | None] | None:
        with self._lock:
            hit = self._keys.get(digest)
            if hit is not None:
                self._keys.move_to_end(digest)
            return hit

    def put(self, digest: str, key: str, name: str | None = None) -> None:
        if self.size == 0:
            return
        with self._lock:
            self._keys[digest] = (key, name)
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
        self.pool = WorkPool(settings, versions, settings.max_concurrent_parses, nice=settings.work_nice)
        """Worker processes parsing bodies and rendering reports (:mod:`autopar_service.work_pool`)."""
        self.streams = StreamSlots(
            settings.max_streams_per_client, settings.max_streams, settings.retry_after_s
        )
        """Open progress streams per client and in all (:mod:`autopar_service.streams`)."""
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

    def cached_body(self, digest: str) -> tuple[PlanRecord, str | None] | None:
        """The cached plan of a byte-identical earlier body and the name that body gives its
        graph, if any (sync: call from a thread)."""
        hit = self.bodies.get(digest)
        if hit is None:
            return None
        record = self.plans.get(hit[0])
        return (record, hit[1]) if record is not None else None

    def store_graph(self, graph_blob: bytes, content_hash: str) -> None:
        """Store an encoded graph (:func:`autopar_cache.codec.encode`) for the workers."""
        self.store.put(graph_key(content_hash), graph_blob, self.settings.job_ttl_s)

    def on_terminal(self, info: JobInfo) -> None:
        result = info.result or {}
        self.metrics.job_finished(info.status.value, result.get("solve_wall_s"), result.get("gap"))
