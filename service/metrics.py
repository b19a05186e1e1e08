"""Prometheus metrics of one API process, in the text exposition format (version 0.0.4).

A small registry owned by the app (no module-level state, no client library):

* ``autopar_http_requests_total{method,route,status}``      counter
* ``autopar_http_request_seconds{route}``                    histogram
* ``autopar_plan_cache_hits_total`` / ``..._misses_total``   counters
* ``autopar_jobs_finished_total{status}``                    counter
* ``autopar_solve_seconds``                                  histogram (solve wall time)
* ``autopar_solve_gap``                                      histogram (relative optimality gap)
* ``autopar_solves_started_total``                           gauge from the job backend
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Sequence

__all__ = ["Histogram", "Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SOLVE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
_GAP_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in pairs
    )
    return "{" + inner + "}"


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics: ``le`` buckets, sum, count)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        if not math.isfinite(value):
            return
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: Sequence[tuple[str, str]] = ()) -> list[str]:
        out = []
        for bound, count in zip(self.buckets, self.counts, strict=True):
            out.append(f"{name}_bucket{_labels([*labels, ('le', repr(float(bound)))])} {count}")
        out.append(f"{name}_bucket{_labels([*labels, ('le', '+Inf')])} {self.count}")
        out.append(f"{name}_sum{_labels(labels)} {self.total!r}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


class Metrics:
    """The metrics of one API process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.cache_hits = 0
        self.cache_misses = 0
        self.jobs_finished: dict[str, int] = defaultdict(int)
        self.solve_seconds = Histogram(_SOLVE_BUCKETS)
        self.solve_gap = Histogram(_GAP_BUCKETS)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(method, route, str(status))] += 1
            hist = self.latency.get(route)
            if hist is None:
                hist = self.latency[route] = Histogram(_LATENCY_BUCKETS)
            hist.observe(seconds)

    def cache(self, hit: bool) -> None:
        with self._lock:
            if hit:
                self.cache_hits += 1
            else:
                self.cache_misses += 1

    def job_finished(self, status: str, solve_s: float | None, gap: float | None) -> None:
        with self._lock:
            self.jobs_finished[status] += 1
            if solve_s is not None:
                self.solve_seconds.observe(solve_s)
            if gap is not None:
                self.solve_gap.observe(gap)

    def render(self, solves_started: int | None = None) -> str:
        """The exposition text (ends with a newline)."""
        with self._lock:
            out = [
                "# HELP autopar_http_requests_total HTTP requests by method, route and status.",
                "# TYPE autopar_http_requests_total counter",
            ]
            for (method, route, status), n in sorted(self.requests.items()):
                labels = [("method", method), ("route", route), ("status", status)]
                out.append(f"autopar_http_requests_total{_labels(labels)} {n}")
            out += [
                "# HELP autopar_http_request_seconds Time to answer a request, seconds.",
                "# TYPE autopar_http_request_seconds histogram",
            ]
            for route, hist in sorted(self.latency.items()):
                out += hist.lines("autopar_http_request_seconds", [("route", route)])
            out += [
                "# HELP autopar_plan_cache_hits_total Plan requests answered from the cache.",
                "# TYPE autopar_plan_cache_hits_total counter",
                f"autopar_plan_cache_hits_total {self.cache_hits}",
                "# HELP autopar_plan_cache_misses_total Plan requests that needed a solve.",
                "# TYPE autopar_plan_cache_misses_total counter",
                f"autopar_plan_cache_misses_total {self.cache_misses}",
                "# HELP autopar_jobs_finished_total Jobs seen finishing, by final status.",
                "# TYPE autopar_jobs_finished_total counter",
            ]
            for status, n in sorted(self.jobs_finished.items()):
                out.append(f"autopar_jobs_finished_total{_labels([('status', status)])} {n}")
            out += [
                "# HELP autopar_solve_seconds Wall time of finished solves, seconds.",
                "# TYPE autopar_solve_seconds histogram",
                *self.solve_seconds.lines("autopar_solve_seconds"),
                "# HELP autopar_solve_gap Relative optimality gap of finished solves.",
                "# TYPE autopar_solve_gap histogram",
                *self.solve_gap.lines("autopar_solve_gap"),
            ]
            if solves_started is not None:
                out += [
                    "# HELP autopar_solves_started_total Solve attempts started (whole backend).",
                    "# TYPE autopar_solves_started_total gauge",
                    f"autopar_solves_started_total {solves_started}",
                ]
        return "\n".join(out) + "\n"
