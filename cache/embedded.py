"""The embedded default backend: a diskcache (SQLite + files) directory.

Used when no Redis URL is configured.  Several processes may open the same
directory (the API and its local solver processes do): diskcache serialises
writers through SQLite.  Only ``bytes``, ``str`` and ``int`` are ever handed to
diskcache, which stores them raw, so nothing is pickled.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path

import diskcache

from autopar_cache.base import score_text
from autopar_cache.errors import CacheUnavailable

__all__ = ["EmbeddedStore", "default_cache_dir"]

_SCORE_SUFFIX = "#score"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/autopar`` (default ``~/.cache/autopar``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autopar"


class EmbeddedStore:
    """A :class:`autopar_cache.base.Store` in a local directory."""

    backend = "embedded"

    def __init__(self, directory: str | os.PathLike[str], size_limit_bytes: int = 8 * 1024**3) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._cache = diskcache.Cache(
                str(self.directory),
                size_limit=size_limit_bytes,
                eviction_policy="least-recently-stored",
                timeout=30,
            )
        except (OSError, sqlite3.Error) as exc:
            raise CacheUnavailable(
                "cache_unavailable",
                f"cannot open the cache directory {str(self.directory)!r}: {exc}; "
                "set AUTOPAR_CACHE_DIR to a writable directory",
            ) from None

    @staticmethod
    def _expire(ttl_s: float | None) -> float | None:
        return None if ttl_s is None or ttl_s <= 0 else float(ttl_s)

    def get(self, key: str) -> bytes | None:
        value = self._cache.get(key, default=None, retry=True)
        return value if isinstance(value, bytes) else None

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for key in keys:
            value = self._cache.get(key, default=None, retry=True)
            if isinstance(value, bytes):
                out[key] = value
        return out

    def put(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self._cache.set(key, bytes(value), expire=self._expire(ttl_s), retry=True)

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        expire = self._expire(ttl_s)
        with self._cache.transact(retry=True):
            for key, value in items.items():
                self._cache.set(key, bytes(value), expire=expire)

    def add(self, key: str, value: bytes, ttl_s: float | None = None) -> bool:
        return bool(self._cache.add(key, bytes(value), expire=self._expire(ttl_s), retry=True))

    def delete(self, key: str) -> bool:
        return bool(self._cache.delete(key, retry=True))

    def put_if_lower(self, key: str, value: bytes, score: float, ttl_s: float | None = None) -> bool:
        expire = self._expire(ttl_s)
        new = math.inf if math.isnan(score) else float(score)
        score_key = key + _SCORE_SUFFIX
        with self._cache.transact(retry=True):
            current = self._cache.get(score_key)
            if current is not None and key in self._cache and float(current) <= new:
                return False
            self._cache.set(key, bytes(value), expire=expire)
            self._cache.set(score_key, score_text(new), expire=expire)
        return True

    def compare_and_set(
        self, key: str, expected: bytes | None, value: bytes, ttl_s: float | None = None
    ) -> bool:
        with self._cache.transact(retry=True):
            current = self._cache.get(key, default=None)
            if (current if isinstance(current, bytes) else None) != expected:
                return False
            self._cache.set(key, bytes(value), expire=self._expire(ttl_s))
        return True

    def incr(self, key: str, amount: int = 1) -> int:
        return int(self._cache.incr(key, amount, default=0, retry=True))

    def ping(self) -> None:
        try:
            self._cache.set("__ping__", b"1", expire=60, retry=True)
        except (OSError, sqlite3.Error) as exc:
            raise CacheUnavailable(
                "cache_unavailable",
                f"cache directory {str(self.directory)!r} is not writable: {exc}",
            ) from None

    def close(self) -> None:
        self._cache.close()

    def __repr__(self) -> str:
        return f"EmbeddedStore({str(self.directory)!r})"
