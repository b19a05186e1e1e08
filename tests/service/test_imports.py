"""The client and the command-line modules import with the core only (they run beside OneFlow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.helpers import REPO

BLOCKER = """
import importlib.abc, sys
BLOCKED = {"fastapi", "starlette", "uvicorn", "redis", "rq", "ortools",
           "pydantic_settings", "diskcache", "zstandard", "httpx", "autopar_cache"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked: {name}")
        return None
sys.meta_path.insert(0, Block())
import autopar.client, autopar_service.cli, autopar_solver.cli
from autopar.cli.main import build_parser
parser, handlers = build_parser()
assert {"serve", "worker", "submit", "plan"} <= set(handlers), handlers
assert not {"fastapi", "ortools", "rq", "autopar_solver.planner", "autopar_service.app"} & set(sys.modules)
print("ok")
"""


def test_client_and_cli_import_without_service_dependencies() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_client_imports_in_the_oneflow_environment() -> None:
    python = REPO / ".venv-oneflow" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-oneflow (Python 3.10 + numpy 1.x) here")
    result = subprocess.run(
        [
            str(python),
            "-c",
            "import autopar.client, autopar_service.cli, sys; print(sys.version_info[:2])",
        ],
        cwd=Path("/"),
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(3, 10)"
