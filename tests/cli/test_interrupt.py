"""Ctrl-C: exit status 130 and one line, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.cli.helpers import REPO


def test_ctrl_c_exits_130_with_one_line(tmp_path) -> None:
    # `-v` logs "loaded ..." once the graph is built; the cost tables of mt5-base take
    # seconds more in this one process, so the signal lands inside the command
    process = subprocess.Popen(
        [sys.executable, "-m", "autopar.cli", "-v", "costs", "mt5-base", "--workers", "1"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert "loaded" in first, first
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert err.splitlines() == ["autopar: interrupted"]
    assert out == ""
