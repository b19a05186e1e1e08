"""Names in Redis that workers and the processes watching them share: a worker's liveness
key and the cost-table queue (one module, so :mod:`.worker` and :mod:`.table_jobs` both
import it and not each other)."""

from __future__ import annotations

from autopar_service.settings import Settings

__all__ = ["TABLES_QUEUE_SUFFIX", "alive_key", "tables_queue_name"]

TABLES_QUEUE_SUFFIX = ":tables"
"""What ends the name of the cost-table queue."""


def tables_queue_name(settings: Settings) -> str:
    """The RQ queue of cost-table batches (:mod:`autopar_service.table_jobs`): ``{queue_name}:tables``."""
    return f"{settings.queue_name}{TABLES_QUEUE_SUFFIX}"


def alive_key(worker_name: str) -> str:
    """The liveness key a worker renews on every heartbeat (expires ``worker_alive_ttl_s`` after)."""
    return f"autopar:worker-alive:{worker_name}"
