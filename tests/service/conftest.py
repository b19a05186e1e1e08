from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from autopar_cache.redis_server import RedisServer, redis_server_binary


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.skip("redis-server binary not installed (apt-get install -y redis-server)")
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def tiny_graph() -> dict[str, Any]:
    from autopar.models import build

    return build("tiny-gpt").to_dict()
