"""Compile the probe jobs again: OneFlow inserts the middle nodes recorded in boxing_observed.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import launch

from autopar.runtimes.oneflow_09.lowering import observed_table

pytestmark = pytest.mark.oneflow

TABLE = Path(__file__).resolve().parents[2] / "autopar" / "runtimes" / "oneflow_09" / "boxing_observed.json"


def test_oneflow_inserts_the_recorded_middle_nodes(tmp_path: Path, flow: Any) -> None:
    stored = next(t for t in json.loads(TABLE.read_text())["tables"] if t["hierarchy"] == [2, 2])
    out = tmp_path / "probe.json"
    shape = ",".join(str(d) for d in stored["transitions"][0]["shape"])
    launch(4, Path(__file__).with_name("_probe_boxing.py"), str(out), shape, "2,2")
    probe = json.loads(out.read_text())
    got = {(t["src"], t["dst"]): (t["compiled"], t["middle"]) for t in probe["transitions"]}
    want = {(t["src"], t["dst"]): (t["compiled"], t["middle"]) for t in stored["transitions"]}
    assert got == want
    assert observed_table(probe, stored["itemsize"])["transitions"] == stored["transitions"]
