"""Prometheus metrics of one API process (prometheus-client, one registry per app).

* ``autopar_http_requests_total{method,route,status}``      counter
* ``autopar_http_request_seconds{route}``                    histogram
* ``autopar_plan_cache_hits_total`` / ``..._misses_total``   counters
* ``autopar_jobs_finished_total{status}``                    counter
* ``autopar_solve_seconds``                                  histogram (solve wall time)
* ``autopar_solve_gap``                                      histogram (relative optimality gap)
* ``autopar_solves_started_total``                           gauge from the job backend

``GET /metrics`` needs the API key when keys are configured.
"""

from __future__ import annotations

import math

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SOLVE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
_GAP_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class Metrics:
    """The metrics of one API process (its own registry: apps in one process do not mix)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "autopar_http_requests",
            "HTTP requests by method, route and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "autopar_http_request_seconds",
            "Time to answer a request, seconds.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.parses_canceled = Counter(
            "autopar_parses_canceled",
            "Request bodies whose parse timed out (503) and was canceled, freeing its slot",
            registry=r,
        )
        self.cache_hits = Counter(
            "autopar_plan_cache_hits", "Plan requests answered from the cache.", registry=r
        )
        self.cache_misses = Counter(
            "autopar_plan_cache_misses", "Plan requests that needed a solve.", registry=r
        )
        self.jobs_finished = Counter(
            "autopar_jobs_finished", "Jobs seen finishing, by final status.", ["status"], registry=r
        )
        self.solve_seconds = Histogram(
            "autopar_solve_seconds",
            "Wall time of finished solves, seconds.",
            buckets=_SOLVE_BUCKETS,
            registry=r,
        )
        self.solve_gap = Histogram(
            "autopar_solve_gap",
            "Relative optimality gap of finished solves.",
            buckets=_GAP_BUCKETS,
            registry=r,
        )
        self.solves_started = Gauge(
            "autopar_solves_started_total", "Solve attempts started (whole backend).", registry=r
        )

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def parse_canceled(self) -> None:
        self.parses_canceled.inc()

    def cache(self, hit: bool) -> None:
        (self.cache_hits if hit else self.cache_misses).inc()

    def job_finished(self, status: str, solve_s: float | None, gap: float | None) -> None:
        self.jobs_finished.labels(status).inc()
        if solve_s is not None and math.isfinite(solve_s):
            self.solve_seconds.observe(solve_s)
        if gap is not None and math.isfinite(gap):
            self.solve_gap.observe(gap)

    def render(self, solves_started: int | None = None) -> bytes:
        """The text exposition (``solves_started`` from the job backend, when it answered)."""
        if solves_started is not None:
            self.solves_started.set(solves_started)
        return generate_latest(self.registry)
