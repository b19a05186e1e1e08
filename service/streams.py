"""Bounds on open progress streams (``GET /v1/jobs/{id}/events``).

A stream holds a connection (a file descriptor) and its job's updates for as long as the job
runs; one key could open 1,500 of them.  :class:`StreamSlots` counts the open streams per
client and in all: past ``max_streams_per_client`` or ``max_streams`` a new one is 429
``too_many_streams`` (with ``Retry-After``), and :class:`CountedEventSource` gives its slot
back when its stream ends, however it ends (the job ended, the client went away, the server
stops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from autopar_service.problems import ApiError

__all__ = ["CountedEventSource", "StreamSlots"]


class StreamSlots:
    """Open streams per client and in all, within ``per_client`` and ``total``."""

    def __init__(self, per_client: int, total: int, retry_after_s: int) -> None:
        self.per_client = per_client
        self.total = total
        self.retry_after_s = retry_after_s
        self.open: dict[str, int] = {}

    @property
    def count(self) -> int:
        return sum(self.open.values())

    def take(self, client: str) -> Callable[[], None]:
        """One slot for ``client`` (429 ``too_many_streams`` past a bound); returns its release,
        which gives the slot back once however often it is called."""
        headers = {"Retry-After": str(self.retry_after_s)}
        mine = self.open.get(client, 0)
        if mine >= self.per_client:
            raise ApiError(
                429,
                "too_many_streams",
                f"you have {mine} progress streams open, the most one client may have "
                f"(AUTOPAR_MAX_STREAMS_PER_CLIENT); close one, or poll GET /v1/jobs/{{id}}?wait=N",
                headers=headers,
                limit=self.per_client,
            )
        if self.count >= self.total:
            raise ApiError(
                429,
                "too_many_streams",
                f"the server has {self.total} progress streams open, its limit (AUTOPAR_MAX_STREAMS); "
                "retry later, or poll GET /v1/jobs/{id}?wait=N",
                headers=headers,
                limit=self.total,
            )
        self.open[client] = mine + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self.open.get(client, 0) - 1
            if left > 0:
                self.open[client] = left
            else:
                self.open.pop(client, None)

        return release


class CountedEventSource(EventSourceResponse):
    """An :class:`EventSourceResponse` that calls ``on_close`` when it ends, however it ends."""

    def __init__(self, *args: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
