"""Key-value store behind the cost-table memo and the plan cache.

The core only needs this protocol; :class:`MemoryStore` is the in-process
implementation.  ``cache/`` provides the embedded (diskcache) and Redis stores.
Values are bytes (compressed JSON, never pickle).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

__all__ = ["KeyValueStore", "MemoryStore"]


@runtime_checkable
class KeyValueStore(Protocol):
    """Bytes-valued store with batched reads and writes."""

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Return the stored values of those ``keys`` that are present."""
        ...

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        """Store every item (overwriting)."""
        ...


class MemoryStore:
    """A dict in this process (the default memo when nothing else is given)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        return {k: self._data[k] for k in keys if k in self._data}

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        self._data.update(items)

    def __len__(self) -> int:
        return len(self._data)
