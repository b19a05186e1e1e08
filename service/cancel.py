"""Cooperative cancellation of work running in a thread (a body's parse and checks).

A thread cannot be stopped from outside, so work that may be abandoned runs under a
:class:`CancelToken` and calls :func:`checkpoint` between its phases: once the token is
canceled (its request timed out and freed its slot), the next checkpoint raises
:class:`Canceled` and the thread ends.  Outside a token, :func:`checkpoint` does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["CancelToken", "Canceled", "checkpoint"]

T = TypeVar("T")

_current = threading.local()


class Canceled(Exception):
    """Raised by :func:`checkpoint` in work whose token was canceled (nobody waits for it)."""


class CancelToken:
    """A flag that work in a thread reads at each :func:`checkpoint`."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def canceled(self) -> bool:
        return self._event.is_set()

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` with this token current in the calling thread."""
        previous = getattr(_current, "token", None)
        _current.token = self
        try:
            checkpoint()
            return fn()
        finally:
            _current.token = previous


def checkpoint() -> None:
    """Raise :class:`Canceled` when the current thread's work was canceled."""
    token: CancelToken | None = getattr(_current, "token", None)
    if token is not None and token.canceled:
        raise Canceled("the request this work was for timed out")
