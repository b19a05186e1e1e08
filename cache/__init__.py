"""Plan and cost-table cache: one interface (:class:`autopar_cache.base.Store`), two backends.

* :class:`autopar_cache.embedded.EmbeddedStore` -- diskcache under the user's cache
  directory; the default when no Redis URL is set.
* :class:`autopar_cache.redis_store.RedisStore` -- Redis (redis-py), shared by every
  API process and worker.

Values are compressed JSON (:mod:`autopar_cache.codec`), never pickle.  Plan records
and keys: :mod:`autopar_cache.plans`.
"""

from __future__ import annotations

import os
from pathlib import Path

from autopar_cache.base import PrefixedStore, Store
from autopar_cache.errors import CacheUnavailable

__all__ = ["CacheUnavailable", "PrefixedStore", "Store", "open_store"]


def open_store(
    redis_url: str | None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    prefix: str = "autopar:",
    size_limit_bytes: int = 8 * 1024**3,
    socket_timeout_s: float = 5.0,
    max_connections: int = 16,
) -> Store:
    """Redis when ``redis_url`` is set, else the embedded store in ``cache_dir``.

    ``cache_dir`` defaults to :func:`autopar_cache.embedded.default_cache_dir`;
    ``socket_timeout_s`` and ``max_connections`` bound Redis calls
    (:func:`autopar_cache.redis_store.connect`).
    """
    if redis_url:
        from autopar_cache.redis_store import RedisStore

        return RedisStore(
            redis_url, prefix=prefix, socket_timeout_s=socket_timeout_s, max_connections=max_connections
        )
    from autopar_cache.embedded import EmbeddedStore, default_cache_dir

    return EmbeddedStore(Path(cache_dir) if cache_dir else default_cache_dir(), size_limit_bytes)
