"""The cache interface shared by the embedded (diskcache) and Redis backends.

A :class:`Store` is a bytes-valued key-value store with TTLs.  It extends the
core's :class:`autopar.infra.store.KeyValueStore` (``get_many`` / ``put_many``, what
the cost-table memo uses) with the few atomic operations the service needs:

* ``add`` (set if absent) for locks and single-flight markers,
* ``put_if_lower`` (compare-and-set on a score) so a stored plan is only
  replaced by a cheaper one,
* ``compare_and_set`` (replace only the value read) so the solve memo merges
  what two workers proved instead of keeping the last writer's,
* ``incr`` for counters.

Key layout (every backend adds its own namespace prefix)::

    plan:{key}          compressed plan record        (plan TTL)
    plan:{key}#score    its predicted step time, text
    cost:{memo key}     one cost-table entry (bytes from the core's memo)
    cost:solve:{key}    one solve-memo entry (the best plan and bound of a problem)
    graph:{hash}        compressed graph JSON          (job TTL)
    job:{id}            compressed job record           (job TTL)
    sweep:{id}          compressed sweep record         (job TTL)
    stat:{name}         integer counters

:class:`PrefixedStore` gives the core a namespaced view (``cost:``) with its
own TTL, so cost-table entries are shared by every request and graph.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from autopar.infra.store import SwappableStore
from autopar_cache.errors import CacheUnavailable

__all__ = ["PrefixedStore", "Store", "score_text"]

log = logging.getLogger("autopar.cache")


@runtime_checkable
class Store(SwappableStore, Protocol):
    """A bytes-valued store with TTLs; ``ttl_s=None`` means no expiry."""

    backend: str
    """``"embedded"`` or ``"redis"``."""

    def get(self, key: str) -> bytes | None:
        """The value at ``key``, or None when absent or expired."""
        ...

    def put(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        """Store ``value`` at ``key`` (overwriting)."""
        ...

    def add(self, key: str, value: bytes, ttl_s: float | None = None) -> bool:
        """Store ``value`` only if ``key`` is absent; True when stored."""
        ...

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it existed."""
        ...

    def put_if_lower(self, key: str, value: bytes, score: float, ttl_s: float | None = None) -> bool:
        """Atomically store ``value`` unless a value with a score <= ``score`` is present.

        Returns True when stored.  NaN scores count as +inf (never replace a real one).
        """
        ...

    def incr(self, key: str, amount: int = 1) -> int:
        """Add ``amount`` to the integer counter at ``key`` (absent = 0); return the new value."""
        ...

    def ping(self) -> None:
        """Raise :class:`autopar_cache.errors.CacheUnavailable` when the backend cannot serve."""
        ...

    def close(self) -> None:
        """Release connections and file handles."""
        ...


def score_text(score: float) -> str:
    """A score as stored next to a value: ``repr`` of the float.

    NaN and +inf are written as the largest finite float, which Redis's Lua
    ``tonumber`` can parse (it rejects ``inf``).
    """
    value = math.inf if math.isnan(score) else float(score)
    return repr(min(value, sys.float_info.max))


class PrefixedStore:
    """A :class:`~autopar.infra.store.KeyValueStore` view of ``store`` under ``prefix``.

    Every write uses ``ttl_s`` (the caller's TTL is ignored) so the core's memo
    need not know about expiry.  With ``tolerant`` an unavailable backend reads
    as a miss and drops writes (a memo is an optimisation: a solve must not fail
    because Redis restarted under it).
    """

    def __init__(
        self, store: Store, prefix: str, ttl_s: float | None = None, *, tolerant: bool = False
    ) -> None:
        self._store = store
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._tolerant = tolerant

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        wanted = {self._prefix + k: k for k in keys}
        try:
            found = self._store.get_many(wanted)
        except CacheUnavailable:
            if not self._tolerant:
                raise
            log.warning("memo %s unavailable: reading as a miss", self._prefix)
            return {}
        return {wanted[k]: v for k, v in found.items()}

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        try:
            self._store.put_many({self._prefix + k: v for k, v in items.items()}, self._ttl_s)
        except CacheUnavailable:
            if not self._tolerant:
                raise
            log.warning("memo %s unavailable: %d entries not stored", self._prefix, len(items))

    def compare_and_set(
        self, key: str, expected: bytes | None, value: bytes, ttl_s: float | None = None
    ) -> bool:
        try:
            return self._store.compare_and_set(self._prefix + key, expected, value, self._ttl_s)
        except CacheUnavailable:
            if not self._tolerant:
                raise
            log.warning("memo %s unavailable: entry not stored", self._prefix)
            return False
