"""Errors raised by the cache backends.

::

    autopar.errors.AutoparError
    └── CacheUnavailable         the backend (Redis, the cache directory) cannot be reached
"""

from __future__ import annotations

from autopar.errors import AutoparError

__all__ = ["CacheUnavailable"]


class CacheUnavailable(AutoparError):
    """Raised when the cache backend cannot be reached or refuses a command.

    The service answers 503 with a ``Retry-After``; nothing is lost, the request
    can simply be repeated once the backend is back.
    """

    default_code = "cache_unavailable"
