"""``autopar serve | worker | submit``: the service's command line.

::

    autopar serve [--host 127.0.0.1] [--port 8000] [--redis-url URL] [--workers N]
    autopar worker --redis-url URL [--name NAME] [--burst]
    autopar submit GRAPH --server URL [--cluster 2x4] [--mesh-shape 4,2] [--memory 30GiB]
                   [--zero 2] [--time-limit 30] [--micro-batches K] [--checkpointing auto] [--stages N|auto]
                   [--wait] [--out plan.json]
    autopar submit mt5-base --serve --wait --out plan.json     # one-shot local server

``GRAPH`` is a graph JSON file or the name of a bundled model (``mt5-base``,
``tiny-gpt`` ...).  ``submit --wait`` draws a progress line from the job's
server-sent events and writes the ``autopar.plan/v1`` plan to ``--out``.
``serve`` and ``worker`` need ``autopar[service]``; ``submit`` only the
core (it runs beside OneFlow), ``submit --serve`` the service too.

:data:`SERVE_COMMAND`, :data:`WORKER_COMMAND` and :data:`SUBMIT_COMMAND` are
entry points of the ``autopar.commands`` group (``pyproject.toml``); this module
imports with the core alone and loads FastAPI, uvicorn and RQ inside the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from autopar.cli.args import (
    Command,
    add_memory_arg,
    add_mesh_args,
    add_time_limit_arg,
    add_training_args,
    graph_arg_help,
    graph_json_from_arg,
    parse_bytes,
    require_extra,
    training_from_args,
    wrote,
)
from autopar.client import PlanClient, ServiceError, graph_name
from autopar.errors import ConfigError
from autopar.hardware.mesh import parse_mesh_shape

__all__ = [
    "SERVE_COMMAND",
    "SUBMIT_COMMAND",
    "WORKER_COMMAND",
    "ProgressLine",
    "serve",
    "submit",
    "worker",
]


# ------------------------------------------------------------------ serve / worker


def _settings(args: argparse.Namespace) -> Any:
    require_extra(f"{args.command} --serve" if args.command == "submit" else args.command, "service")
    from autopar_service.settings import load_settings

    overrides: dict[str, Any] = {}
    for name in ("redis_url", "cache_dir", "local_workers"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return load_settings(**overrides)


def serve(args: argparse.Namespace) -> int:
    """Run the API (uvicorn) with the embedded cache, or Redis when configured."""
    settings = _settings(args)
    import uvicorn

    from autopar_service.app import create_app
    from autopar_service.settings import check_exposure

    check_exposure(settings, args.host)

    backend = "redis" if settings.uses_redis else f"embedded cache at {settings.cache_dir}"
    sys.stderr.write(f"autopar serve: http://{args.host}:{args.port} ({backend})\n")
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
        # the client is its address (or AUTOPAR_CLIENT_ADDRESS_HEADER): never a forwarded header by default
        proxy_headers=False,
    )
    return 0


def worker(args: argparse.Namespace) -> int:
    """Run an RQ worker that solves jobs from the shared Redis."""
    settings = _settings(args)
    if not settings.uses_redis:
        raise ConfigError(
            "bad_settings",
            "autopar worker needs Redis: pass --redis-url or set AUTOPAR_REDIS_URL "
            "(without Redis, `autopar serve` solves in local processes)",
        )
    from autopar_service.worker import run_worker

    # each job runs in a forked work horse that reads its settings from the environment
    os.environ["AUTOPAR_REDIS_URL"] = str(settings.redis_url)
    sys.stderr.write(f"autopar worker: queue {settings.queue_name!r}\n")
    run_worker(settings, args.name, burst=args.burst, log_level=args.log_level.upper())
    return 0


# ------------------------------------------------------------------ submit


class ProgressLine:
    """A self-overwriting progress line (plain lines, at most one a second, off a terminal)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0

    def __call__(self, job: dict[str, Any]) -> None:
        now = time.monotonic()
        final = job.get("status") in ("succeeded", "failed", "canceled")
        if not final and now - self.last < (0.1 if self.tty else 1.0):
            return
        self.last = now
        parts = [
            f"[{job.get('elapsed_s') or 0.0:7.1f} s] {job.get('status', '?'):<9} {job.get('phase') or '':<20}"
        ]
        if job.get("objective") is not None:
            parts.append(f"objective {job['objective'] * 1e3:.3f} ms")
        if job.get("bound") is not None:
            parts.append(f"bound {job['bound'] * 1e3:.3f} ms")
        if job.get("gap") is not None:
            parts.append(f"gap {100 * job['gap']:.2f}%")
        text = "  ".join(parts)
        if self.tty:
            self.stream.write("\r" + text.ljust(110) + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


@contextmanager
def _embedded_server(args: argparse.Namespace) -> Iterator[str]:
    """Run ``autopar serve`` (embedded cache) in this process on a free loopback port."""
    import socket

    import uvicorn

    from autopar_service.app import create_app

    settings = _settings(args)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="autopar-serve", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    client = PlanClient(url, retries=0, timeout_s=5)
    deadline = time.monotonic() + 60
    while True:
        try:
            if client.ready().get("status") == "ready":
                break
        except ServiceError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            raise ConfigError("serve_failed", f"the embedded server did not become ready on {url}")
        time.sleep(0.1)
    sys.stderr.write(f"autopar: embedded server on {url} (cache {settings.cache_dir})\n")
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(15)


def submit(args: argparse.Namespace) -> int:
    """Send a plan request; with ``--wait`` follow it and write the plan."""
    graph = graph_json_from_arg(args.graph)
    options: dict[str, Any] = {}
    options["time_limit_s"] = args.time_limit
    if args.gap is not None:
        options["relative_gap"] = args.gap
    if args.seed is not None:
        options["seed"] = args.seed
    if args.cluster_profile:
        raise ConfigError(
            "unsupported_option",
            "--cluster-profile is not sent to a planning service yet; plan locally with "
            "`autopar plan GRAPH --cluster-profile FILE`",
        )
    options["runtime"] = args.runtime
    training = training_from_args(args)  # a bad K is one line here, before any request
    if args.micro_batches is not None:
        options["micro_batches"] = training.micro_batches
    if args.checkpointing is not None:
        options["checkpointing"] = training.checkpointing
    if args.stages is not None:  # a bad value is one line here, before any request
        stages = _parse_stages(args.stages)
        options["stages"] = "auto" if stages is None else stages
    request = {
        "cluster": args.cluster,
        "preset": args.preset or "a100-40g",
        "mesh_shape": parse_mesh_shape(args.mesh_shape) if args.mesh_shape else None,
        "memory_budget_bytes": parse_bytes(args.memory) if args.memory else None,
        "zero_stage": args.zero,
        "options": options,
    }
    if args.serve:
        with _embedded_server(args) as url:
            return _submit_to(url, graph, request, args)
    if not args.server:
        raise ConfigError("bad_args", "give --server URL (or --serve to start a local server)")
    return _submit_to(args.server, graph, request, args)


def _parse_stages(text: str) -> int | None:
    """``--stages``: a positive integer, or ``auto`` (None), as ``autopar plan --stages`` reads
    it (here without the solver: ``submit`` runs with the core alone)."""
    t = text.strip().lower()
    if t == "auto":
        return None
    if not t.isdigit() or int(t) < 1:
        raise ConfigError("bad_stages", f"--stages must be a positive integer or auto, got {text!r}")
    return int(t)


def _submit_to(url: str, graph: bytes, request: dict[str, Any], args: argparse.Namespace) -> int:
    api_key = args.api_key or os.environ.get("AUTOPAR_API_KEY")
    client = PlanClient(url, api_key=api_key, timeout_s=args.http_timeout)
    t0 = time.perf_counter()
    # asked for by its key first (nothing uploaded), as a launcher's PlanClient.plan does
    record = None if args.refresh else client.cached_plan(graph, **request)
    if record is not None:
        sys.stderr.write(f"autopar: cached plan {record['key']}\n")
        return _write_plan(record, args, time.perf_counter() - t0)
    submission = client.submit(graph, refresh=args.refresh, **request)
    record = submission.record
    if record is None:
        job = submission.job or {}
        sys.stderr.write(
            f"autopar: job {submission.key} {job.get('status')} ({url}/v1/jobs/{submission.key})\n"
        )
        if not (args.wait or args.serve):
            sys.stdout.write(json.dumps(job) + "\n")
            if args.out:
                sys.stderr.write(
                    f"autopar: nothing written to {args.out}: the plan is not ready; "
                    "add --wait to wait for it and write it\n"
                )
            return 0
        progress = None if args.no_progress else ProgressLine(sys.stderr)
        final = client.wait_job(submission.key, timeout_s=args.timeout, on_progress=progress)
        record = client.finish(final, name=graph_name(graph))
    else:
        sys.stderr.write(f"autopar: cached plan {submission.key}\n")
    return _write_plan(record, args, time.perf_counter() - t0)


def _write_plan(record: dict[str, Any], args: argparse.Namespace, wall: float) -> int:
    """Write the plan to ``--out`` and its summary and key to stdout."""
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(record["plan"], fh, indent=1)
    sys.stdout.write(record.get("summary", "") + "\n")
    sys.stdout.write(f"plan {record['key']} in {wall:.2f} s\n")
    if args.out:
        wrote("plan", args.out)
    return 0


# ------------------------------------------------------------------ parser


LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument("--redis-url", default=None, help="Redis URL (default: AUTOPAR_REDIS_URL, else embedded)")
    p.add_argument("--cache-dir", default=None, help="embedded cache directory (default ~/.cache/autopar)")
    p.add_argument(
        "--workers",
        dest="local_workers",
        type=int,
        default=None,
        help="local solver processes (default: AUTOPAR_LOCAL_WORKERS, else 2)",
    )
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="(default: %(default)s)")


def _worker_arguments(w: argparse.ArgumentParser) -> None:
    w.add_argument("--redis-url", default=None, help="Redis URL (default: AUTOPAR_REDIS_URL)")
    w.add_argument("--name", default=None, help="worker name (default: RQ's)")
    w.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    w.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="(default: %(default)s)")


def _submit_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("graph", help=graph_arg_help())
    s.add_argument(
        "--server", default=os.environ.get("AUTOPAR_SERVER"), help="service URL (default: AUTOPAR_SERVER)"
    )
    s.add_argument("--serve", action="store_true", help="start an embedded local server for this request")
    s.add_argument("--api-key", default=None, help="X-API-Key (default: AUTOPAR_API_KEY)")
    add_mesh_args(s, mesh_default="the fastest shape, searched by the server")
    add_memory_arg(s)
    add_time_limit_arg(s, ", on the server; waiting in its queue is not counted")
    add_training_args(s, defaults_from=("1", "the server's, auto"))
    s.add_argument(
        "--gap", type=float, default=None, help="relative gap to stop at (default: the server's, 0.01)"
    )
    s.add_argument("--seed", type=int, default=None, help="CP-SAT seed (default: the server's, 0)")
    s.add_argument(
        "--stages",
        default=None,
        metavar="N|auto",
        help="pipeline stages, sent as options.stages (as autopar plan --stages; --mesh-shape is then "
        "each stage's mesh; default: the server's, auto: one stage on one node, else the best "
        "number of stages); a pipeline plan is written as autopar.pipeline/v1",
    )
    s.add_argument("--refresh", action="store_true", help="solve again even if cached")
    s.add_argument("--wait", action="store_true", help="follow the job and write the plan")
    s.add_argument(
        "--timeout", type=float, default=None, help="give up waiting after this many s (default: never)"
    )
    s.add_argument(
        "--http-timeout", type=float, default=30.0, help="per-request timeout, s (default: %(default)s)"
    )
    s.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    s.add_argument(
        "--out", default=None, help="write the autopar.plan/v1 plan here (with --wait, or if cached)"
    )
    s.add_argument("--cache-dir", default=None, help="with --serve: embedded cache directory")
    s.add_argument(
        "--workers",
        dest="local_workers",
        type=int,
        default=None,
        help="with --serve: solver processes",
    )


SERVE_COMMAND = Command(
    "serve",
    "run the planning API (embedded cache unless Redis is set)",
    _serve_arguments,
    serve,
    extra="service",
)
WORKER_COMMAND = Command(
    "worker", "run an RQ worker solving jobs from Redis", _worker_arguments, worker, extra="service"
)
SUBMIT_COMMAND = Command("submit", "send a graph to a planning service", _submit_arguments, submit)


def _report_arguments(p: argparse.ArgumentParser) -> None:
    from autopar.baselines.problem import BASELINES

    p.add_argument("graph", help="graph JSON file or bundled model name (e.g. mt5-base)")
    p.add_argument("plan", help="autopar.plan/v1 or autopar.pipeline/v1 JSON file")
    p.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="PLAN",
        help=f"plans to show side by side: a baseline ({', '.join(BASELINES)}), PATH or LABEL=PATH",
    )
    add_training_args(p, defaults_from="the plan's")
    p.add_argument("--budget", default=None, help="per-device budget line, e.g. 40GiB (default: the plan's)")
    p.add_argument("--label", default=None, help="name of the plan in the report (default: its source)")
    p.add_argument("--out", required=True, help="HTML file to write (checked before any work)")


def check_compare_args(specs: list[str]) -> None:
    """Refuse a ``--compare`` that names neither a baseline nor a plan file, with a "did you mean"."""
    import difflib
    from pathlib import Path

    from autopar.baselines.problem import BASELINES

    for spec in specs:
        if "=" in spec or spec in BASELINES or Path(spec).exists():
            continue
        close = difflib.get_close_matches(spec, list(BASELINES), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            "bad_compare",
            f"--compare {spec!r} is neither a baseline nor a plan file; {hint}"
            f"baselines: {', '.join(BASELINES)}; or give PATH or LABEL=PATH",
        )


def _report(args: argparse.Namespace) -> int:
    from autopar_service.report import cmd_report

    check_compare_args(args.compare)
    return cmd_report(args)


REPORT_COMMAND = Command(
    "report", "write a self-contained HTML report of a plan", _report_arguments, _report, extra="service"
)
