"""Plan and cost-table cache: one interface (:class:`cache.base.Store`), two backends.

* :class:`cache.embedded.EmbeddedStore` -- diskcache under the user's cache
  directory; the default when no Redis URL is set.
* :class:`cache.redis_store.RedisStore` -- Redis (redis-py), shared by every
  API process and worker.

Values are compressed JSON (:mod:`cache.codec`), never pickle.  Plan records
and keys: :mod:`cache.plans`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cache.base import PrefixedStore, Store
from cache.errors import CacheUnavailable

__all__ = ["CacheUnavailable", "PrefixedStore", "Store", "open_store"]


def open_store(
    redis_url: str | None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    prefix: str = "autopar:",
    size_limit_bytes: int = 8 * 1024**3,
) -> Store:
    """Redis when ``redis_url`` is set, else the embedded store in ``cache_dir``.

    ``cache_dir`` defaults to :func:`cache.embedded.default_cache_dir`.
    """
    if redis_url:
        from cache.redis_store import RedisStore

        return RedisStore(redis_url, prefix=prefix)
    from cache.embedded import EmbeddedStore, default_cache_dir

    return EmbeddedStore(Path(cache_dir) if cache_dir else default_cache_dir(), size_limit_bytes)
