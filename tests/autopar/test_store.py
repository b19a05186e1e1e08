"""The stores behind the memos: :class:`MemoryStore` and the folder-backed :class:`DirectoryStore`."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autopar.infra.store import DirectoryStore, KeyValueStore, MemoryStore, SwappableStore


@pytest.mark.parametrize("make", [lambda tmp: MemoryStore(), lambda tmp: DirectoryStore(tmp / "memo")])
def test_values_read_back_and_absent_keys_are_left_out(make, tmp_path: Path) -> None:
    store = make(tmp_path)
    assert isinstance(store, KeyValueStore)
    store.put_many({"op:a": b"\x00one", "../../etc/passwd": b"two", "solve:" + "x" * 500: b""})
    assert store.get_many(["op:a", "missing", "../../etc/passwd", "solve:" + "x" * 500]) == {
        "op:a": b"\x00one",
        "../../etc/passwd": b"two",
        "solve:" + "x" * 500: b"",
    }
    store.put_many({"op:a": b"new"})  # overwritten
    assert store.get_many(["op:a"]) == {"op:a": b"new"}


def test_a_folder_store_survives_its_object_and_keeps_key_text_off_the_file_system(tmp_path: Path) -> None:
    DirectoryStore(tmp_path / "memo").put_many({"../escape": b"v"})
    assert DirectoryStore(tmp_path / "memo").get_many(["../escape"]) == {"../escape": b"v"}
    files = [p for p in (tmp_path / "memo").rglob("*") if p.is_file()]
    assert len(files) == 1 and "escape" not in str(files[0]) and not list(tmp_path.glob("escape*"))
    assert not list((tmp_path / "memo").rglob("*.tmp"))


def test_a_folder_store_that_cannot_write_costs_nothing_but_the_entry(tmp_path: Path) -> None:
    blocker = tmp_path / "memo"
    blocker.write_text("a file where the folder should be")
    store = DirectoryStore(blocker)
    store.put_many({"k": b"v"})  # no exception: the value is just not kept
    assert store.get_many(["k"]) == {}


@pytest.mark.parametrize("make", [lambda tmp: MemoryStore(), lambda tmp: DirectoryStore(tmp / "memo")])
def test_compare_and_set_replaces_only_the_value_read(make, tmp_path: Path) -> None:
    store = make(tmp_path)
    assert isinstance(store, SwappableStore)
    assert not store.compare_and_set("k", b"old", b"v1")  # absent, not b"old"
    assert store.compare_and_set("k", None, b"v1")
    assert not store.compare_and_set("k", None, b"v2")  # present now
    assert not store.compare_and_set("k", b"v0", b"v2")  # not the value read
    assert store.compare_and_set("k", b"v1", b"v2")
    assert store.get_many(["k"]) == {"k": b"v2"}


def _add_to_counter(directory: str, times: int) -> None:
    store = DirectoryStore(directory)
    for _ in range(times):
        while True:
            raw = store.get_many(["counter"]).get("counter")
            if store.compare_and_set("counter", raw, str(int(raw or b"0") + 1).encode()):
                break


def test_a_folder_store_swaps_atomically_across_processes_and_threads(tmp_path: Path) -> None:
    """Processes and threads that each add to one counter by read, compare-and-set, retry
    lose no addition: the folder lock serialises them."""
    directory = str(tmp_path / "memo")
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_add_to_counter, args=(directory, 20)) for _ in range(3)]
    for proc in procs:
        proc.start()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _add_to_counter(directory, 20), range(4)))
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    assert DirectoryStore(directory).get_many(["counter"]) == {"counter": b"140"}
    assert not list((tmp_path / "memo").rglob("*.tmp"))


def test_a_folder_store_that_cannot_lock_swaps_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "memo"
    blocker.write_text("a file where the folder should be")
    assert DirectoryStore(blocker).compare_and_set("k", None, b"v") is False
