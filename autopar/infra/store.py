"""Key-value store behind the cost-table memo and the plan cache.

The core only needs this protocol; :class:`MemoryStore` is the in-process
implementation and :class:`DirectoryStore` keeps values as files in a folder
(``autopar plan --memo DIR``).  ``cache/`` provides the embedded (diskcache) and
Redis stores the service uses.  Values are bytes (compressed JSON, never pickle).

A store that can also replace a value only if it is still the one read
(:class:`SwappableStore`: all of the above) lets a writer merge what it found with
what another writer stored meanwhile, instead of overwriting it (the solve memo).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["DirectoryStore", "KeyValueStore", "MemoryStore", "SwappableStore"]


@runtime_checkable
class KeyValueStore(Protocol):
    """Bytes-valued store with batched reads and writes."""

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Return the stored values of those ``keys`` that are present."""
        ...

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        """Store every item (overwriting)."""
        ...


@runtime_checkable
class SwappableStore(KeyValueStore, Protocol):
    """A :class:`KeyValueStore` that can replace a value atomically if it is unchanged."""

    def compare_and_set(
        self, key: str, expected: bytes | None, value: bytes, ttl_s: float | None = None
    ) -> bool:
        """Store ``value`` at ``key`` only if the value there is ``expected`` (None: absent),
        as one atomic step; True when stored."""
        ...


class MemoryStore:
    """A dict in this process (the default memo when nothing else is given)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        return {k: self._data[k] for k in keys if k in self._data}

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        with self._lock:
            self._data.update(items)

    def compare_and_set(
        self, key: str, expected: bytes | None, value: bytes, ttl_s: float | None = None
    ) -> bool:
        with self._lock:
            if self._data.get(key) != expected:
                return False
            self._data[key] = bytes(value)
            return True

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
    the computation, never this one its result.  :meth:`compare_and_set` holds an
    exclusive ``flock`` on the folder's ``.lock`` file while it reads and replaces, so
    processes (and threads) that swap one key take turns.
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
            self._write(key, value)

    def _write(self, key: str, value: bytes) -> bool:
        """Write ``value`` to a temporary file and rename it over ``key``'s; False on failure."""
        path = self._path(key)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(value)
            tmp.replace(path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return False
        return True

    def compare_and_set(
        self, key: str, expected: bytes | None, value: bytes, ttl_s: float | None = None
    ) -> bool:
        """As :meth:`SwappableStore.compare_and_set`; False also when the folder cannot be
        locked, read or written (the value is then not stored, as in :meth:`put_many`)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / ".lock", "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
                try:
                    current: bytes | None = self._path(key).read_bytes()
                except FileNotFoundError:
                    current = None
                return current == expected and self._write(key, value)
        except OSError:
            return False
