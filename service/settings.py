"""Service settings: one pydantic-settings class, read from ``AUTOPAR_*`` variables.

Every field can be set as ``AUTOPAR_<FIELD>`` (``AUTOPAR_REDIS_URL``,
``AUTOPAR_API_KEYS`` as a comma list, ...).  :func:`load_settings` validates
them once at start and turns a validation failure into a
:class:`autopar.errors.ConfigError` that names the variable and the fix.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from autopar.cli.args import DEFAULT_TIME_LIMIT_S
from autopar.errors import ConfigError

__all__ = ["Settings", "check_exposure", "load_settings"]

MIB = 1024**2


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autopar"


class Settings(BaseSettings):
    """Configuration of the API, the local solver pool and the RQ workers."""

    model_config = SettingsConfigDict(env_prefix="AUTOPAR_", extra="ignore", frozen=True)

    redis_url: str | None = None
    """Redis URL (``redis://host:6379/0``); unset = embedded cache and local solver processes."""
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    """Directory of the embedded cache (default ``$XDG_CACHE_HOME/autopar``)."""
    cache_size_limit_bytes: int = Field(default=8 * 1024**3, gt=0)
    """Size limit of the embedded cache, bytes (least recently stored evicted first)."""
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Accepted ``X-API-Key`` values (comma list); empty = no auth at all (loopback use)."""
    allow_anonymous: bool = False
    """Let ``autopar serve`` bind a non-loopback address without API keys (open to anyone)."""
    public_plan_reads: bool = False
    """With keys configured, still let anyone ``GET /v1/plans/{key}`` (jobs, sweeps, metrics stay keyed)."""
    client_address_header: str | None = None
    """Header a trusted reverse proxy sets to the client's address (``X-Forwarded-For``: its last
    entry is used); unset = the peer address.  Identifies clients only when no API keys are set."""

    max_body_bytes: int = Field(default=64 * MIB, gt=0)
    """Largest request body after decompression, bytes (413 beyond)."""
    max_compressed_body_bytes: int = Field(default=64 * MIB, gt=0)
    """Largest request body as sent (compressed or not), bytes (413 beyond)."""

    max_json_depth: int = Field(default=64, ge=8, le=512)
    """Deepest JSON nesting a body may have (422 beyond; a graph needs about 6)."""
    max_graph_ops: int = Field(default=50_000, ge=1)
    """Most ops a graph may have (413 beyond)."""
    max_graph_tensors: int = Field(default=200_000, ge=1)
    """Most tensors a graph may declare (413 beyond)."""
    max_graph_item_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest op, tensor, variable or value of ``meta`` in a body, bytes of JSON (413 beyond;
    the bundled models' largest op has 1.7 KB): bounds attrs before any parser runs."""
    max_attrs_per_op: int = Field(default=64, ge=1)
    """Most attrs one op may have (422 ``attrs_too_large`` beyond; the bundled models have 12)."""
    max_attr_elements: int = Field(default=1024, ge=1)
    """Most elements of one attr's list, or characters of its string (422 ``attrs_too_large``)."""
    max_meta_bytes: int = Field(default=64 * 1024, ge=0)
    """Largest ``meta`` of a graph, bytes of JSON (413 ``meta_too_large`` beyond)."""
    max_parse_s: float = Field(default=20.0, gt=0)
    """Longest time a body may take to parse and validate, seconds (503 beyond; its worker
    process is stopped and replaced)."""
    max_parses_per_client: int = Field(default=2, ge=1)
    """Bodies and reports of one client queued or in the worker processes at once (429
    ``too_many_parses`` beyond): one client cannot hold every worker, and its queue is served in
    turn with the others'.  Parses in progress count toward ``max_jobs_per_client`` too."""
    max_jobs_per_client: int = Field(default=8, ge=1)
    """Most unfinished jobs one client (API key, else address) may have started (429 beyond)."""
    max_active_jobs: int = Field(default=64, ge=1)
    """Most unfinished jobs overall, queued or running (429 beyond)."""
    max_concurrent_parses: int = Field(default_factory=lambda: min(4, os.cpu_count() or 1), ge=1, le=64)
    """Worker processes that parse bodies and render reports (:mod:`autopar_service.work_pool`),
    so as many run at once, whether or not they start a job; a body waits up to ``max_parse_s``
    for one (429 beyond).  Default: the cores, at most 4 (more processes than cores only take
    the API's core from it: a flood of parses slowed another key's hits more with 4 than with
    2 on 2 cores)."""
    work_nice: int = Field(default=10, ge=0, le=19)
    """How much lower than the API's the CPU priority of those processes is (``nice``): a flood
    of parses and reports does not slow the API's event loop (another key's cache hits)."""
    max_render_s: float = Field(default=120.0, gt=0)
    """Longest time a report may take to render, seconds (503 beyond; its worker is stopped)."""
    max_streams_per_client: int = Field(default=16, ge=1)
    """Progress streams (``GET /v1/jobs/{id}/events``) one client may hold open (429 beyond)."""
    max_streams: int = Field(default=512, ge=1)
    """Progress streams open at once in all (429 beyond)."""
    body_read_timeout_s: float = Field(default=10.0, gt=0)
    """Longest wait for the next part of a request body, seconds (408 beyond: a body shorter
    than its Content-Length, or a stalled upload)."""
    max_report_renders: int = Field(default=2, ge=1)
    """Plan reports rendered at once (each takes seconds of CPU on a large model; 429 beyond)."""
    freeze_gc: bool = True
    """Once started, move every object the API has built (the app, the solver's and the cost
    model's modules) out of the garbage collector's reach (``gc.freeze``): a full collection then
    walks only what requests create, in well under a millisecond, where it walked 145,000
    objects in 180 ms and stalled every request meanwhile."""
    body_index_size: int = Field(default=10_000, ge=0)
    """Request-body digests remembered per API process for the cache-hit fast path (LRU)."""

    plan_ttl_s: float = Field(default=30 * 86400, gt=0)
    """How long a plan stays cached, seconds."""
    cost_ttl_s: float = Field(default=90 * 86400, gt=0)
    """How long a cost-table entry stays cached, seconds."""
    job_ttl_s: float = Field(default=86400, gt=0)
    """How long job records, uploaded graphs and sweep records are kept, seconds."""

    min_time_limit_s: float = Field(default=0.5, ge=0)
    """Least solver time limit for any graph, seconds (422 ``time_limit_too_small`` below it plus
    ``min_time_limit_s_per_op`` per op: a limit that cannot load the graph fails every solve)."""
    min_time_limit_s_per_op: float = Field(default=1e-4, ge=0)
    """Seconds per op added to ``min_time_limit_s`` (mt5-base's 4,700 ops: 0.97 s in all)."""
    default_time_limit_s: float = Field(default=DEFAULT_TIME_LIMIT_S, gt=0)
    """Time limit of a request that gives none, seconds: the whole solve (cost tables, every
    mesh shape, verification), as ``autopar plan --time-limit`` (same default)."""
    max_time_limit_s: float = Field(default=900.0, gt=0)
    """Largest solver time limit a request may ask for, seconds (422 beyond)."""
    job_timeout_margin_s: float = Field(default=120.0, ge=0)
    """A job is killed this long after its solver time limit (cost tables, model building)."""
    job_retries: int = Field(default=1, ge=0, le=5)
    """Retries of a job whose worker died (SIGKILL, OOM, lost machine)."""

    local_workers: int = Field(default=2, ge=1, le=64)
    """Concurrent solves in the API process's local pool (no Redis)."""
    solver_workers: int | None = Field(default=None, ge=1, le=256)
    """CP-SAT / cost-table worker threads per solve (None = the solver's default)."""
    redis_timeout_s: float = Field(default=5.0, gt=0)
    """Socket timeout of every Redis call, seconds, without retries: a stalled Redis gives 503 then."""
    redis_max_connections: int = Field(default=16, ge=1)
    """Redis connections per process; a call finding none free within a second gets 503, so a
    stalled Redis holds at most this many threads."""
    worker_alive_ttl_s: float = Field(default=10.0, gt=0)
    """A worker that has not renewed its liveness key for this long is not counted by ``/readyz``, s."""
    queue_name: str = Field(default="autopar", min_length=1)
    """RQ queue the API enqueues to and ``autopar worker`` serves."""
    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    """How often a running job reports it is alive, seconds."""
    worker_lost_after_s: float = Field(default=20.0, gt=0)
    """A running job with no heartbeat for this long is retried or failed, seconds."""
    outage_grace_s: float = Field(default=120.0, ge=0)
    """How long a worker keeps retrying Redis (to save a finished plan, to reconnect) in an outage, s."""
    janitor_interval_s: float = Field(default=5.0, gt=0)
    """How often the API looks for jobs whose worker died, seconds."""

    retry_after_s: int = Field(default=2, ge=1)
    """``Retry-After`` sent with 202 and 503 answers, seconds."""
    max_wait_s: float = Field(default=60.0, ge=0)
    """Longest ``?wait=`` long-poll, seconds."""
    max_sweep_points: int = Field(default=32, ge=1)
    """Most plans one sweep may ask for."""
    max_devices: int = Field(default=4096, ge=1)
    """Largest cluster (nodes x devices per node) a request may describe."""

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("redis_url", mode="before")
    @classmethod
    def _check_redis_url(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip() or None
        if value is not None and not str(value).startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @model_validator(mode="after")
    def _check_limits(self) -> Settings:
        if self.default_time_limit_s > self.max_time_limit_s:
            raise ValueError(
                f"default_time_limit_s ({self.default_time_limit_s}) exceeds "
                f"max_time_limit_s ({self.max_time_limit_s})"
            )
        if self.worker_lost_after_s <= 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"worker_lost_after_s ({self.worker_lost_after_s}) must exceed twice "
                f"heartbeat_interval_s ({self.heartbeat_interval_s})"
            )
        return self

    @property
    def uses_redis(self) -> bool:
        return self.redis_url is not None


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment (and ``overrides``), or a :class:`ConfigError`.

    The error lists every bad field as ``AUTOPAR_<FIELD>: <problem> (got <value>)``.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            name = f"AUTOPAR_{field.upper()}" if err["loc"] else "settings"
            secret = field in ("redis_url", "api_keys") or not err["loc"]
            shown = "" if secret else f" (got {err['input']!r})"
            problems.append(f"{name}: {err['msg']}{shown}")
        raise ConfigError(
            "bad_settings", "invalid service settings: " + "; ".join(problems), problems=problems
        ) from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings, host: str) -> None:
    """Refuse to serve a non-loopback ``host`` without API keys unless anonymous use is allowed."""
    if settings.api_keys or settings.allow_anonymous or _is_loopback(host):
        return
    raise ConfigError(
        "no_api_keys",
        f"refusing to serve on {host} without API keys: anyone who can reach it could read and "
        "cancel plans; set AUTOPAR_API_KEYS=key1,key2 (clients send X-API-Key), or "
        "AUTOPAR_ALLOW_ANONYMOUS=1 to serve without keys",
    )
