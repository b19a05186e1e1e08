"""A small client of the planning service for training launchers (standard library only).

::

    from autopar.client import PlanClient

    client = PlanClient("http://planner:8000", api_key="...")
    record = client.plan(graph, cluster="2x4", mesh_shape=(4, 2),
                         memory_budget_bytes=30 * 2**30, zero_stage=2)
    plan = Plan.from_dict(record["plan"])          # autopar.plan/v1

``plan`` first computes the request's plan key here, as the service does
(:mod:`autopar.ir.plan_key`: the graph's content hash, the request, and the service's code
versions and option defaults from ``GET /v1/plan-keys``, asked once per client), and asks for
the plan by key (``GET /v1/plans/{key}``): a cached plan comes back without the graph being
uploaded.  Otherwise it submits (gzip-compressed body), follows the job's server-sent events
(falling back to long-polling), and returns the plan record.  Connection
errors, 429 and 502/503/504 are retried with exponential back-off (honouring
``Retry-After``); every request is idempotent (a plan request is keyed by its
content), so retrying is safe.  Errors raise :class:`ServiceError` carrying the
problem's ``code``, HTTP ``status`` and details (``min_feasible_bytes`` for an
infeasible budget, ``op`` for an invalid graph).

This module imports nothing beyond the standard library and the core (the graph and the plan
key, on first use), so it works beside OneFlow in a Python 3.10 / numpy 1.x environment.
"""

from __future__ import annotations

import gzip
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.client import HTTPResponse
from typing import TYPE_CHECKING, Any

from autopar.errors import AutoparError

if TYPE_CHECKING:
    from autopar.ir.plan_key import KeyContext

__all__ = ["PlanClient", "ServiceError", "Submission", "graph_name"]

_RETRY_STATUSES = frozenset({429, 502, 503, 504})
_COMPRESS_ABOVE = 4096


class ServiceError(AutoparError):
    """Raised when the service answers with an error, or cannot be reached after the retries.

    ``code`` is the problem's stable code (``infeasible_budget``, ``invalid_graph`` ...,
    or ``unreachable``), ``status`` the HTTP status (0 when unreachable),
    ``details`` the problem's other members.
    """

    default_code = "service_error"

    def __init__(self, code: str | None, message: str, status: int = 0, **details: Any) -> None:
        super().__init__(code, message, **details)
        self.status = status


@dataclass(frozen=True)
class Submission:
    """The answer to a plan request: the plan (status 200) or its job (202)."""

    status: int
    key: str
    record: dict[str, Any] | None
    """The plan record when cached (``record["plan"]`` is the ``autopar.plan/v1`` plan)."""
    job: dict[str, Any] | None
    """The job when a solve is needed."""

    @property
    def done(self) -> bool:
        return self.record is not None


class PlanClient:
    """Client of one planning service."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        compress: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.compress = compress
        self._key_context: KeyContext | None = None

    # ------------------------------------------------------------ transport

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        retry: bool = True,
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP exchange with retries; returns (status, headers, body) for 2xx/3xx."""
        retries = self.retries if retry else 0
        all_headers = {"Accept": "application/json", **(headers or {})}
        if self.api_key:
            all_headers["X-API-Key"] = self.api_key
        data = body
        if body is not None:
            all_headers["Content-Type"] = "application/json"
            if self.compress and len(body) > _COMPRESS_ABOVE:
                data = gzip.compress(body, compresslevel=5)
                all_headers["Content-Encoding"] = "gzip"
        attempt = 0
        while True:
            request = urllib.request.Request(
                self.base_url + path, data=data, method=method, headers=all_headers
            )
            delay = self.backoff_s * (2**attempt)
            try:
                with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as resp:
                    return resp.status, dict(resp.headers.items()), resp.read()
            except urllib.error.HTTPError as exc:
                payload = exc.read()
                if exc.code in _RETRY_STATUSES and attempt < retries:
                    retry_after = exc.headers.get("Retry-After", "")
                    if retry_after.isdigit():
                        delay = min(float(retry_after), 30.0)
                else:
                    if exc.code == 304:
                        return 304, dict(exc.headers.items()), b""
                    raise _service_error(exc.code, payload) from None
            except (TimeoutError, urllib.error.URLError, ConnectionError) as exc:
                if attempt >= retries:
                    reason = getattr(exc, "reason", exc)
                    raise ServiceError(
                        "unreachable",
                        f"cannot reach the planning service at {self.base_url}: {reason}; "
                        "check the URL and that `autopar serve` is running",
                    ) from None
            attempt += 1
            time.sleep(delay)

    def _json(self, method: str, path: str, body: bytes | None = None, **kw: Any) -> tuple[int, Any]:
        status, _, data = self._request(method, path, body, **kw)
        return status, json.loads(data) if data else None

    # ------------------------------------------------------------ plans

    def submit(
        self,
        graph: Any,
        *,
        cluster: str = "2x4",
        preset: str = "a100-40g",
        mesh_shape: Sequence[int] | None = None,
        memory_budget_bytes: int | None = None,
        zero_stage: int = 2,
        options: Mapping[str, Any] | None = None,
        wait_s: float = 0.0,
        refresh: bool = False,
    ) -> Submission:
        """POST /v1/plans.  ``graph``: a :class:`~autopar.ir.graph.Graph`, a dict or JSON bytes."""
        fields: dict[str, Any] = {"cluster": cluster, "preset": preset, "zero_stage": zero_stage}
        if mesh_shape is not None:
            fields["mesh_shape"] = list(mesh_shape)
        if memory_budget_bytes is not None:
            fields["memory_budget_bytes"] = int(memory_budget_bytes)
        if options:
            fields["options"] = dict(options)
        body = _plan_body(graph, fields)
        query = f"?wait={wait_s:g}" + ("&refresh=true" if refresh else "")
        status, data = self._json("POST", "/v1/plans" + query, body, timeout_s=self.timeout_s + wait_s)
        if status == 200:
            return Submission(200, data["key"], data, None)
        return Submission(status, data["id"], None, data)

    def plan(
        self,
        graph: Any,
        *,
        timeout_s: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        **request: Any,
    ) -> dict[str, Any]:
        """The plan record (``request``: the arguments of :meth:`submit`): asked for by its key
        first (:meth:`cached_plan`: nothing uploaded), else submitted and waited for.

        ``on_progress`` receives each job update.  Raises :class:`ServiceError`
        (``code`` ``job_timeout`` after ``timeout_s``; the job keeps running).
        """
        if not request.get("refresh"):
            cached = self.cached_plan(graph, **{k: v for k, v in request.items() if k in _KEY_FIELDS})
            if cached is not None:
                return cached
        submission = self.submit(graph, **request)
        if submission.record is not None:
            return submission.record
        job = self.wait_job(submission.key, timeout_s=timeout_s, on_progress=on_progress)
        return self.finish(job, name=graph_name(graph))

    def finish(self, job: Mapping[str, Any], *, name: str | None = None) -> dict[str, Any]:
        """The plan record of a finished job (its graph called ``name``), or the job's error as
        :class:`ServiceError`."""
        if job.get("status") == "succeeded":
            return self.get_plan(str(job["id"]), name=name)
        error = dict(job.get("error") or {})
        code = str(error.pop("code", "job_failed"))
        message = str(error.pop("message", f"job {job.get('id')} ended {job.get('status')}"))
        raise ServiceError(code, message, status=0, job=job.get("id"), **error)

    def get_plan(self, key: str, *, name: str | None = None) -> dict[str, Any]:
        """GET /v1/plans/{key}: the plan record; ``name``: what to call the graph in it (the
        stored record is shared and calls a graph of no bundled model ``graph-{hash}``)."""
        query = "?" + urllib.parse.urlencode({"name": name}) if name else ""
        _, data = self._json("GET", f"/v1/plans/{key}{query}")
        return dict(data)

    # ------------------------------------------------------------ plan keys

    def key_context(self) -> KeyContext | None:
        """What the service folds into a plan key besides the request (``GET /v1/plan-keys``:
        its code versions and option defaults), asked once per client; None from a service
        that does not publish it."""
        if self._key_context is None:
            from autopar.ir.plan_key import KeyContext

            try:
                _, data = self._json("GET", "/v1/plan-keys")
            except ServiceError as exc:
                if exc.status in (404, 405):
                    return None
                raise
            self._key_context = KeyContext.from_dict(data)
        return self._key_context

    def plan_key(self, graph: Any, **request: Any) -> str | None:
        """The key the service gives this plan request (``request``: :meth:`submit`'s key fields),
        computed here from the graph's content hash and :meth:`key_context`, as the service
        computes it (:mod:`autopar.ir.plan_key`); None when it cannot be computed here (a graph
        the core cannot read, a cluster it does not know, an older service): the service says why."""
        from autopar.ir.plan_key import plan_key, request_key_dict

        context = self.key_context()
        content = _content_hash(graph)
        if context is None or content is None:
            return None
        try:
            key_dict = request_key_dict(context, graph_hash=content, **request)
        except (AutoparError, ValueError, TypeError, KeyError):
            return None
        return plan_key(key_dict, context.versions)

    def cached_plan(self, graph: Any, **request: Any) -> dict[str, Any] | None:
        """The cached plan record of this request, asked for by its key (``GET /v1/plans/{key}``:
        no graph uploaded), when one is cached and answers it (its proven gap is within the
        request's, or it was solved with at least the request's time); else None."""
        from autopar.ir.plan_key import record_answers, resolved_options

        key = self.plan_key(graph, **request)
        context = self._key_context
        if key is None or context is None:
            return None
        try:
            record = self.get_plan(key, name=graph_name(graph))
        except ServiceError as exc:
            if exc.status == 404:
                return None
            raise
        return record if record_answers(record, resolved_options(context, request.get("options"))) else None

    # ------------------------------------------------------------ jobs

    def job(self, job_id: str, *, wait_s: float = 0.0, since: int | None = None) -> dict[str, Any]:
        """GET /v1/jobs/{id} (``wait_s`` long-polls; ``since`` returns on the next change)."""
        query = f"?wait={wait_s:g}" + (f"&since={since}" if since is not None else "")
        _, data = self._json("GET", f"/v1/jobs/{job_id}{query}", timeout_s=self.timeout_s + wait_s)
        return dict(data)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """DELETE /v1/jobs/{id}."""
        _, data = self._json("DELETE", f"/v1/jobs/{job_id}")
        return dict(data)

    def events(self, job_id: str, *, timeout_s: float = 60.0) -> Iterator[tuple[str, dict[str, Any]]]:
        """Server-sent events of a job: ``(event, job)`` pairs, ending with ``("end", job)``."""
        headers = {"Accept": "text/event-stream"}
        if self.api_key:
            headers["X-API-Key"] = self.api_key
        request = urllib.request.Request(f"{self.base_url}/v1/jobs/{job_id}/events", headers=headers)
        try:
            resp: HTTPResponse = urllib.request.urlopen(request, timeout=timeout_s)
        except urllib.error.HTTPError as exc:
            raise _service_error(exc.code, exc.read()) from None
        with resp:
            event, data_lines = "message", list[str]()
            for raw_line in resp:
                line = raw_line.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data_lines:
                        yield event, json.loads("\n".join(data_lines))
                        if event in ("end", "error"):
                            return
                    event, data_lines = "message", []
                elif line.startswith(":"):
                    continue
                else:
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name == "event":
                        event = value
                    elif name == "data":
                        data_lines.append(value)

    def wait_job(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Follow a job until it ends (SSE, else long-polling); return the final job."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            for event, job in self.events(job_id):
                if on_progress is not None:
                    on_progress(job)
                if event == "end":
                    return job
                if deadline is not None and time.monotonic() > deadline:
                    break
        except (OSError, ValueError):
            pass  # stream broken (proxy, restart): fall back to long-polling
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ServiceError(
                    "job_timeout",
                    f"job {job_id} did not finish within {timeout_s} s; it keeps running, "
                    f"poll GET /v1/jobs/{job_id}",
                    job=job_id,
                )
            job = self.job(job_id, wait_s=min(30.0, remaining if remaining is not None else 30.0))
            if on_progress is not None:
                on_progress(job)
            if job.get("status") in ("succeeded", "failed", "canceled"):
                return job

    # ------------------------------------------------------------ the rest

    def evaluate(self, graph: Any, plan: Mapping[str, Any] | str) -> dict[str, Any]:
        """POST /v1/evaluate: ``plan`` is an ``autopar.plan/v1`` dict or a cached plan's key."""
        field = {"plan_key": plan} if isinstance(plan, str) else {"plan": dict(plan)}
        _, data = self._json("POST", "/v1/evaluate", _plan_body(graph, field))
        return dict(data)

    def sweep(
        self,
        graph: Any,
        *,
        cluster: str = "2x4",
        preset: str = "a100-40g",
        mesh_shapes: Sequence[Sequence[int] | None] = (None,),
        memory_budgets_bytes: Sequence[int | None] = (None,),
        zero_stages: Sequence[int] = (2,),
        options: Mapping[str, Any] | None = None,
        wait_s: float = 0.0,
    ) -> dict[str, Any]:
        """POST /v1/sweeps: a what-if table (``complete`` False while points still solve)."""
        fields: dict[str, Any] = {
            "cluster": cluster,
            "preset": preset,
            "mesh_shapes": [list(m) if m is not None else None for m in mesh_shapes],
            "memory_budgets_bytes": list(memory_budgets_bytes),
            "zero_stages": list(zero_stages),
        }
        if options:
            fields["options"] = dict(options)
        _, data = self._json(
            "POST",
            f"/v1/sweeps?wait={wait_s:g}",
            _plan_body(graph, fields),
            timeout_s=self.timeout_s + wait_s,
        )
        return dict(data)

    def get_sweep(self, sweep_id: str) -> dict[str, Any]:
        """GET /v1/sweeps/{id}."""
        _, data = self._json("GET", f"/v1/sweeps/{sweep_id}")
        return dict(data)

    def ready(self) -> dict[str, Any]:
        """GET /readyz (a 503 answer is returned, not raised)."""
        try:
            _, data = self._json("GET", "/readyz", retry=False)
        except ServiceError as exc:
            if exc.status == 503:
                return {"status": "not_ready", **exc.details}
            raise
        return dict(data)


_KEY_FIELDS = frozenset({"cluster", "preset", "mesh_shape", "memory_budget_bytes", "zero_stage", "options"})
"""The arguments of :meth:`PlanClient.submit` a plan key depends on."""


def _graph_document(graph: Any) -> Any:
    if isinstance(graph, (bytes, bytearray)):
        return json.loads(graph)
    return graph


def _content_hash(graph: Any) -> str | None:
    """The graph's content hash (:meth:`autopar.ir.graph.Graph.content_hash`), or None when the
    core cannot read it (the service then says why)."""
    content_hash = getattr(graph, "content_hash", None)
    if callable(content_hash):
        return str(content_hash())
    from autopar.ir.graph import Graph

    try:
        return Graph.from_dict(_graph_document(graph)).content_hash()
    except (AutoparError, ValueError, TypeError, KeyError, RecursionError):
        return None


def graph_name(graph: Any) -> str | None:
    """The name a graph (a :class:`~autopar.ir.graph.Graph`, a dict or JSON bytes) gives itself,
    for the answers about it (the service shows it in place of ``graph-{hash}``)."""
    name = getattr(graph, "name", None)
    if name is None and not isinstance(graph, str):
        try:
            document = _graph_document(graph)
        except (ValueError, TypeError):
            return None
        name = document.get("name") if isinstance(document, Mapping) else None
    return name if isinstance(name, str) and name else None


def _graph_bytes(graph: Any) -> bytes:
    if isinstance(graph, (bytes, bytearray)):
        return bytes(graph)
    if isinstance(graph, Mapping):
        return json.dumps(graph, separators=(",", ":")).encode()
    to_dict = getattr(graph, "to_dict", None)
    if callable(to_dict):
        return json.dumps(to_dict(), separators=(",", ":")).encode()
    raise TypeError(f"graph must be an autopar Graph, a dict or JSON bytes, not {type(graph).__name__}")


def _plan_body(graph: Any, fields: Mapping[str, Any]) -> bytes:
    """``{"graph": <graph>, **fields}`` without re-parsing raw graph bytes."""
    rest = json.dumps(dict(fields), separators=(",", ":")).encode()
    tail = b"}" if rest == b"{}" else b"," + rest[1:]
    return b'{"graph":' + _graph_bytes(graph) + tail


def _service_error(status: int, payload: bytes) -> ServiceError:
    try:
        problem = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        problem = None
    if not isinstance(problem, dict):
        text = payload[:200].decode("utf-8", "replace")
        return ServiceError(f"http_{status}", f"HTTP {status}: {text}", status=status)
    details = {k: v for k, v in problem.items() if k not in ("code", "detail", "type", "title", "status")}
    return ServiceError(
        str(problem.get("code") or f"http_{status}"),
        str(problem.get("detail") or problem.get("title") or f"HTTP {status}"),
        status=status,
        **details,
    )
