"""The stores behind the memos: :class:`MemoryStore` and the folder-backed :class:`DirectoryStore`."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.store import DirectoryStore, KeyValueStore, MemoryStore


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
