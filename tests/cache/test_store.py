"""Both backends behave the same through the Store interface."""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from autopar.infra.store import KeyValueStore
from autopar_cache.base import PrefixedStore, Store
from autopar_cache.errors import CacheUnavailable
from autopar_cache.redis_server import RedisServer, free_port
from autopar_cache.redis_store import RedisStore, redact_url


def test_is_a_key_value_store(store: Store) -> None:
    assert isinstance(store, KeyValueStore)
    assert isinstance(store, Store)


def test_get_put_roundtrip_bytes(store: Store) -> None:
    assert store.get("a") is None
    store.put("a", b"\x00\x01binary")
    assert store.get("a") == b"\x00\x01binary"
    store.put("a", b"second")
    assert store.get("a") == b"second"


def test_get_many_returns_only_present(store: Store) -> None:
    store.put_many({f"k{i}": str(i).encode() for i in range(2500)})
    found = store.get_many([f"k{i}" for i in range(0, 3000, 7)])
    assert found == {f"k{i}": str(i).encode() for i in range(0, 2500, 7)}


def test_ttl_expires(store: Store) -> None:
    store.put("short", b"x", ttl_s=0.2)
    store.put("long", b"y", ttl_s=60)
    assert store.get("short") == b"x"
    time.sleep(0.4)
    assert store.get("short") is None
    assert store.get("long") == b"y"


def test_add_only_when_absent(store: Store) -> None:
    assert store.add("lock", b"1", ttl_s=10)
    assert not store.add("lock", b"2", ttl_s=10)
    assert store.get("lock") == b"1"
    assert store.delete("lock")
    assert not store.delete("lock")
    assert store.add("lock", b"3")


def test_add_is_atomic_under_contention(store: Store) -> None:
    with ThreadPoolExecutor(8) as pool:
        wins = list(pool.map(lambda i: store.add("flight", str(i).encode(), 30), range(32)))
    assert sum(wins) == 1


def test_put_if_lower_keeps_the_cheapest(store: Store) -> None:
    assert store.put_if_lower("plan", b"slow", 2.0)
    assert not store.put_if_lower("plan", b"slower", 3.0)
    assert not store.put_if_lower("plan", b"same", 2.0)
    assert store.get("plan") == b"slow"
    assert store.put_if_lower("plan", b"fast", 1.5)
    assert store.get("plan") == b"fast"
    # NaN never replaces a real score
    assert not store.put_if_lower("plan", b"nan", math.nan)
    assert store.get("plan") == b"fast"


def test_put_if_lower_after_value_vanished(store: Store) -> None:
    assert store.put_if_lower("p", b"a", 1.0, ttl_s=60)
    store.delete("p")  # evicted value; its score must not block a new write
    assert store.put_if_lower("p", b"b", 5.0)
    assert store.get("p") == b"b"


def test_compare_and_set_replaces_only_the_value_read(store: Store) -> None:
    assert not store.compare_and_set("memo", b"something", b"v1")  # absent, not b"something"
    assert store.get("memo") is None
    assert store.compare_and_set("memo", None, b"v1")
    assert not store.compare_and_set("memo", None, b"v2")  # present now
    assert not store.compare_and_set("memo", b"v0", b"v2")  # another value than the one read
    assert store.get("memo") == b"v1"
    assert store.compare_and_set("memo", b"v1", b"\x00v2", ttl_s=60)
    assert store.get("memo") == b"\x00v2"
    assert not store.compare_and_set("memo", b"", b"v3")  # empty is not absent
    store.put("empty", b"")
    assert store.compare_and_set("empty", b"", b"v4") and store.get("empty") == b"v4"


def test_compare_and_set_loses_no_update_under_contention(store: Store) -> None:
    """16 threads each add 5 to a counter by read, compare-and-set, retry: nothing is lost."""

    def add_five(_: int) -> int:
        tries = 0
        for _ in range(5):
            while True:
                tries += 1
                raw = store.get("counter")
                if store.compare_and_set("counter", raw, str(int(raw or b"0") + 1).encode()):
                    break
        return tries

    with ThreadPoolExecutor(16) as pool:
        tries = list(pool.map(add_five, range(16)))
    assert store.get("counter") == b"80"
    assert sum(tries) >= 80


def test_prefixed_store_compare_and_set(store: Store) -> None:
    view = PrefixedStore(store, "cost:", ttl_s=60)
    assert view.compare_and_set("solve:x", None, b"1")
    assert store.get("cost:solve:x") == b"1"
    assert not view.compare_and_set("solve:x", None, b"2")
    assert view.compare_and_set("solve:x", b"1", b"2") and view.get_many(["solve:x"]) == {"solve:x": b"2"}


def test_a_tolerant_prefixed_store_without_its_backend_stores_nothing_and_says_so() -> None:
    down = RedisStore(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=1)
    assert PrefixedStore(down, "cost:", tolerant=True).compare_and_set("k", None, b"v") is False
    with pytest.raises(CacheUnavailable):
        PrefixedStore(down, "cost:").compare_and_set("k", None, b"v")


def test_incr(store: Store) -> None:
    assert store.incr("count") == 1
    assert store.incr("count", 4) == 5


def test_prefixed_store_namespaces_and_ttl(store: Store) -> None:
    view = PrefixedStore(store, "cost:", ttl_s=0.2)
    view.put_many({"a": b"1", "b": b"2"})
    assert store.get("cost:a") == b"1"
    assert view.get_many(["a", "b", "c"]) == {"a": b"1", "b": b"2"}
    time.sleep(0.4)
    assert view.get_many(["a", "b"]) == {}


def test_ping_answers_on_a_serving_backend_and_leaves_its_data(store: Store) -> None:
    """A serving backend answers (returns, where a down one raises CacheUnavailable:
    test_redis_down_raises_cache_unavailable) and its keys are as they were."""
    store.put("a", b"1")
    assert store.ping() is None
    assert store.get("a") == b"1"
    assert store.incr("count") == 1


def test_redis_down_raises_cache_unavailable() -> None:
    s = RedisStore(f"redis://:secret@127.0.0.1:{free_port()}/0")
    with pytest.raises(CacheUnavailable) as info:
        s.get("x")
    assert info.value.code == "cache_unavailable"
    assert "secret" not in info.value.message
    assert "AUTOPAR_REDIS_URL" in info.value.message
    with pytest.raises(CacheUnavailable):
        s.ping()


def test_redact_url() -> None:
    assert redact_url("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"


@pytest.mark.redis
def test_redis_restart_recovers(redis_server: RedisServer) -> None:
    server = RedisServer()
    server.start()
    s = RedisStore(server.url, socket_timeout_s=1)
    s.put("k", b"v")
    server.stop()
    with pytest.raises(CacheUnavailable):
        s.get("k")
    server.start()
    try:
        assert s.get("k") is None  # no persistence: a fresh server
        s.put("k", b"w")
        assert s.get("k") == b"w"
    finally:
        s.close()
        server.stop()
