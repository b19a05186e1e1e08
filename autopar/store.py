"""Key-value store behind the cost-table memo and the plan cache.

The core only needs this protocol; :class:`MemoryStore` is the in-process
implementation and :class:`DirectoryStore` keeps values as files in a folder
(``autopar plan --memo DIR``).  ``cache/`` provides the embedded (diskcache) and
Redis stores the service uses.  Values are bytes (compressed JSON, never pickle).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["DirectoryStore", "KeyValueStore", "MemoryStore"]


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


class DirectoryStore:
    """One file per key in a folder: what survives between two commands.

    A key's file is named by the SHA-256 of the key (no key text reaches the file
    system) and written to a temporary name first, then renamed over the old one, so
    a reader sees a whole value or none and concurrent writers of one key leave one of
    their values.  Nothing expires and nothing is evicted: remove the folder to clear
    it.  ``ttl_s`` is accepted and ignored.  An unreadable file reads as absent; a
    write that fails (a full or read-only disk) is skipped, costing the next command
    the computation, never this one its result.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.directory / digest[:2] / digest[2:]

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for key in keys:
            try:
                found[key] = self._path(key).read_bytes()
            except OSError:
                continue
        return found

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        for key, value in items.items():
            path = self._path(key)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_bytes(value)
                tmp.replace(path)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
