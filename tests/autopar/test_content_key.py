"""Content keys: equal requests give equal keys, any change in the request or the code a new one."""

from __future__ import annotations

from pathlib import Path

from autopar.ir.content_key import canonical_json, content_key, python_sources, source_digest


def test_key_ignores_mapping_order_and_sees_every_value():
    a = content_key({"graph": "g1", "mesh": [4, 2], "zero": 2})
    assert a == content_key({"zero": 2, "mesh": [4, 2], "graph": "g1"})
    assert a != content_key({"graph": "g1", "mesh": [2, 4], "zero": 2})
    assert a != content_key({"graph": "g1", "mesh": [4, 2], "zero": 3})
    assert canonical_json({"b": 1, "a": [1.5, None]}) == b'{"a":[1.5,null],"b":1}'


def test_source_digest_follows_paths_and_contents(tmp_path: Path):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "a.py").write_text("x = 1\n")
    (tmp_path / "costs.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    files = python_sources(tmp_path, ["costs.py", "rules"])
    assert [f.name for f in files] == ["costs.py", "a.py"]
    before = source_digest(tmp_path, files)
    (tmp_path / "notes.txt").write_text("changed\n")
    assert source_digest(tmp_path, python_sources(tmp_path, ["costs.py", "rules"])) == before
    (tmp_path / "rules" / "a.py").write_text("x = 3\n")
    assert source_digest(tmp_path, python_sources(tmp_path, ["costs.py", "rules"])) != before
    (tmp_path / "rules" / "a.py").write_text("x = 1\n")
    (tmp_path / "rules" / "a.py").rename(tmp_path / "rules" / "b.py")
    assert source_digest(tmp_path, python_sources(tmp_path, ["costs.py", "rules"])) != before
