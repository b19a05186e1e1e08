"""The Redis backend (redis-py 8).

Keys live under ``prefix`` (default ``autopar:``).  Reads of many keys use
``MGET`` in chunks; writes use one pipeline; ``put_if_lower`` is a Lua script
so two workers finishing the same plan cannot overwrite a cheaper one, and
``compare_and_set`` another so a solve-memo entry is replaced only if unchanged.
Connection and command failures surface as :class:`autopar_cache.errors.CacheUnavailable`
(short socket timeouts: the API must answer, not hang, when Redis is down).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from autopar_cache.base import score_text
from autopar_cache.errors import CacheUnavailable

__all__ = ["RedisStore", "connect", "connect_async", "redact_url"]

T = TypeVar("T")

_CHUNK = 1000
_SCORE_SUFFIX = "#score"

# KEYS[1] value key, KEYS[2] score key; ARGV[1] value, ARGV[2] score, ARGV[3] ttl ms ('' = none).
# Invariant: the stored score is the score of the stored value; a missing value
# (evicted) never blocks a write.
_PUT_IF_LOWER = """
local current = redis.call('GET', KEYS[2])
if current and redis.call('EXISTS', KEYS[1]) == 1 and tonumber(current) <= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
"""

# KEYS[1] key; ARGV[1] expected value, ARGV[2] '1' when the key is expected absent,
# ARGV[3] new value, ARGV[4] ttl ms ('' = none).
_COMPARE_AND_SET = """
local current = redis.call('GET', KEYS[1])
if ARGV[2] == '1' then
  if current then return 0 end
elseif current ~= ARGV[1] then
  return 0
end
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
else
  redis.call('SET', KEYS[1], ARGV[3])
end
return 1
"""


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe for logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{netloc}", parts.path, parts.query, parts.fragment))


POOL_WAIT_S = 1.0
"""Longest wait for a free connection of the bounded pool, seconds (then the call fails)."""


def connect(url: str, *, socket_timeout_s: float = 5.0, max_connections: int = 16) -> redis.Redis:
    """A client for ``url`` that fails within ``socket_timeout_s`` when Redis stalls (bytes replies).

    No retries (a retried timeout is a multiple of it: 4 x 5 s under redis-py's default),
    periodic health checks, and a bounded pool: a call that finds all ``max_connections``
    busy (a stalled server holds each for ``socket_timeout_s``) fails after
    :data:`POOL_WAIT_S`, so a stall never ties up more than that many threads.
    """
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(2.0, socket_timeout_s),
        health_check_interval=30,
        retry_on_timeout=False,
        retry=Retry(NoBackoff(), 0),
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # as Redis.from_url: closing the client closes its pool
    return client


def connect_async(
    url: str, *, socket_timeout_s: float = 5.0, max_connections: int = 16
) -> redis.asyncio.Redis:
    """An asyncio client for ``url`` bounded as :func:`connect`'s: what a coroutine that polls
    Redis (a job's progress stream) uses, so it holds no thread between or during its calls."""
    from redis.asyncio.retry import Retry as AsyncRetry

    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(2.0, socket_timeout_s),
        health_check_interval=30,
        retry_on_timeout=False,
        retry=AsyncRetry(NoBackoff(), 0),
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # as Redis.from_url: closing the client closes its pool
    return client


class RedisStore:
    """A :class:`autopar_cache.base.Store` on a Redis server."""

    backend = "redis"

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "autopar:",
        client: redis.Redis | None = None,
        socket_timeout_s: float = 5.0,
        max_connections: int = 16,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.client = (
            client
            if client is not None
            else connect(url, socket_timeout_s=socket_timeout_s, max_connections=max_connections)
        )
        self._put_if_lower = self.client.register_script(_PUT_IF_LOWER)
        self._compare_and_set = self.client.register_script(_COMPARE_AND_SET)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except RedisError as exc:
            raise CacheUnavailable(
                "cache_unavailable",
                f"Redis at {redact_url(self.url)} failed during {what}: {exc}; check that the "
                "server is running, or unset AUTOPAR_REDIS_URL to use the embedded cache",
            ) from None

    @staticmethod
    def _px(ttl_s: float | None) -> int | None:
        return None if ttl_s is None or ttl_s <= 0 else max(1, int(ttl_s * 1000))

    def get(self, key: str) -> bytes | None:
        value: Any = self._call("GET", lambda: self.client.get(self.prefix + key))
        return bytes(value) if value is not None else None

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(keys)
        out: dict[str, bytes] = {}
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            names = [self.prefix + k for k in chunk]
            values: Any = self._call("MGET", partial(self.client.mget, names))
            out.update({k: bytes(v) for k, v in zip(chunk, values, strict=True) if v is not None})
        return out

    def put(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self._call("SET", lambda: self.client.set(self.prefix + key, value, px=self._px(ttl_s)))

    def put_many(self, items: Mapping[str, bytes], ttl_s: float | None = None) -> None:
        px = self._px(ttl_s)
        entries = list(items.items())

        def write() -> None:
            for start in range(0, len(entries), _CHUNK):
                with self.client.pipeline(transaction=False) as pipe:
                    for key, value in entries[start : start + _CHUNK]:
                        pipe.set(self.prefix + key, value, px=px)
                    pipe.execute()

        self._call("SET (pipeline)", write)

    def add(self, key: str, value: bytes, ttl_s: float | None = None) -> bool:
        return bool(
            self._call(
                "SET NX",
                lambda: self.client.set(self.prefix + key, value, px=self._px(ttl_s), nx=True),
            )
        )

    def delete(self, key: str) -> bool:
        return bool(self._call("DEL", lambda: self.client.delete(self.prefix + key)))

    def put_if_lower(self, key: str, value: bytes, score: float, ttl_s: float | None = None) -> bool:
        px = self._px(ttl_s)
        new = math.inf if math.isnan(score) else float(score)
        keys = [self.prefix + key, self.prefix + key + _SCORE_SUFFIX]
        args: list[Any] = [value, score_text(new), "" if px is None else str(px)]
        return bool(self._call("put_if_lower", lambda: self._put_if_lower(keys=keys, args=args)))

    def compare_and_set(
        self, key: str, expected: bytes | None, value: bytes, ttl_s: float | None = None
    ) -> bool:
        px = self._px(ttl_s)
        ttl = "" if px is None else str(px)
        args: list[Any] = [b"", "1", value, ttl] if expected is None else [expected, "0", value, ttl]
        keys = [self.prefix + key]
        return bool(self._call("compare_and_set", lambda: self._compare_and_set(keys=keys, args=args)))

    def incr(self, key: str, amount: int = 1) -> int:
        return int(self._call("INCRBY", lambda: self.client.incrby(self.prefix + key, amount)))  # type: ignore[arg-type]

    def ping(self) -> None:
        self._call("PING", self.client.ping)

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"RedisStore({redact_url(self.url)!r})"
