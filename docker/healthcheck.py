#!/opt/autopar/bin/python3
"""Container healthcheck: ``autopar-healthcheck [api|worker]``; exit 0 when healthy.

api     GET http://127.0.0.1:8000/livez answers 200 (the image's CMD serves on 8000).
worker  this container's RQ worker is registered in Redis (RQ refreshes the
        registration on every heartbeat, so a hung or disconnected worker drops out).

Without an argument the role is read from the container's main process (PID 1):
``autopar worker`` -> worker, anything else -> api.  One line on stdout says why
the check failed (``docker inspect`` / ``podman inspect`` show it).
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request

API_PORT = 8000
"""The port `autopar serve` listens on inside the container (the image's CMD)."""


def _role_of_pid1() -> str:
    try:
        with open("/proc/1/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return "api"
    return "worker" if b"worker" in argv else "api"


def check_api(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2) as response:
            return None if response.status == 200 else f"/livez answered {response.status}"
    except OSError as exc:
        return f"/livez unreachable: {exc}"


def check_worker() -> str | None:
    import redis
    from rq import Worker

    url = os.environ.get("AUTOPAR_REDIS_URL")
    if not url:
        return "AUTOPAR_REDIS_URL is not set"
    host = socket.gethostname()
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        workers = Worker.all(connection=client)
    except (redis.RedisError, OSError) as exc:
        return f"Redis unreachable: {exc}"
    if any(w.hostname == host for w in workers):
        return None
    return f"no RQ worker of host {host} registered in Redis"


def main(argv: list[str]) -> int:
    role = argv[1] if len(argv) > 1 else _role_of_pid1()
    if role == "api":
        problem = check_api(API_PORT)
    elif role == "worker":
        problem = check_worker()
    else:
        print(f"usage: autopar-healthcheck [api|worker] (got {role!r})")
        return 2
    if problem:
        print(f"unhealthy {role}: {problem}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
