#!/opt/autopar/bin/python3
"""Container healthcheck: ``autopar-healthcheck [api|worker]``; exit 0 when healthy.

api     GET http://127.0.0.1:8000/livez answers 200 (the image's CMD serves on 8000).
worker  the RQ worker of this container's current main process is registered in
        Redis (started after PID 1 did, so a restarted container does not pass on
        its previous process's record) and sent a heartbeat in the last minute.

Without an argument the role is read from the container's main process (PID 1):
``autopar worker`` -> worker, anything else -> api.  One line on stdout says why
the check failed (``docker inspect`` / ``podman inspect`` show it).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import urllib.request
from datetime import datetime, timezone

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


HEARTBEAT_STALE_S = 60.0
"""A worker whose last heartbeat is older than this, seconds, is unhealthy."""


def _pid1_started_at() -> float:
    """Start of PID 1, seconds since the epoch: boot time + its start tick (proc(5))."""
    with open("/proc/stat") as fh:
        boot = next(float(line.split()[1]) for line in fh if line.startswith("btime "))
    with open("/proc/1/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime


def _epoch(moment: datetime | None) -> float:
    if moment is None:
        return 0.0
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


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
    started = _pid1_started_at() - 2.0  # tick and clock rounding
    mine = [w for w in workers if w.hostname == host and _epoch(w.birth_date) >= started]
    if not mine:
        return f"no RQ worker of this process (host {host}) registered in Redis"
    age = time.time() - max(_epoch(w.last_heartbeat) for w in mine)
    if age > HEARTBEAT_STALE_S:
        return f"last heartbeat {age:.0f} s ago"
    return None


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
