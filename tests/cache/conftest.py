from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from autopar_cache.base import Store
from autopar_cache.embedded import EmbeddedStore
from autopar_cache.redis_server import RedisServer, redis_server_binary
from autopar_cache.redis_store import RedisStore


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.skip("redis-server binary not installed (apt-get install -y redis-server)")
    with RedisServer() as server:
        yield server


@pytest.fixture(params=["embedded", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    """Each backend; Redis keys get a fresh prefix per test."""
    if request.param == "embedded":
        s: Store = EmbeddedStore(tmp_path / "cache")
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        s = RedisStore(server.url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    yield s
    s.close()
