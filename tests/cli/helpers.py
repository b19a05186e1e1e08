"""Run ``autopar`` as a user does: a subprocess, its exit status, its stdout and stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m autopar.cli ARGS`` in ``cwd``, with ``env`` added to this environment."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_user_error(result: subprocess.CompletedProcess[str], code: str) -> str:
    """Exit 2, stderr exactly one ``autopar: error: [code] ...`` line, no traceback; the message."""
    lines = result.stderr.splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    prefix = f"autopar: error: [{code}] "
    assert lines[0].startswith(prefix), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0][len(prefix) :]
