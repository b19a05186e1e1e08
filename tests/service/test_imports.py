"""The client and the command-line modules import with the core only (they run beside OneFlow)."""

from __future__ import annotations

import json
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


CORE_CLIENT = """
import json, sys
from autopar.client import PlanClient
from autopar.models import build
url, key = sys.argv[1], sys.argv[2]
client = PlanClient(url, api_key=key)
request = {"cluster": "1x2", "mesh_shape": (2,), "options": {"time_limit_s": 30}}
record = client.plan(build("tiny-gpt"), timeout_s=600, **request)
again = PlanClient(url, api_key=key).cached_plan(build("tiny-gpt"), **request)
heavy = {"fastapi", "ortools", "redis", "rq", "autopar_solver", "autopar_service", "autopar_cache"}
print(json.dumps({"key": record["key"], "again": again["key"], "python": list(sys.version_info[:2]),
                  "numpy": __import__("numpy").__version__, "loaded": sorted(heavy & set(sys.modules))}))
"""


def test_the_client_plans_by_key_with_the_core_alone(tmp_path: Path) -> None:
    """Issue 43: ``PlanClient`` computes plan keys and asks by key with the core alone (the OneFlow
    venv: Python 3.10, numpy 1.x, no OR-Tools, FastAPI or Redis client).  Runs in ``.venv-oneflow``
    or the interpreter ``AUTOPAR_CORE_PYTHON`` names (a venv with numpy<2 and pydantic)."""
    import os

    from autopar.client import PlanClient
    from autopar.models import build
    from tests.service.helpers import live_server, make_settings

    given = os.environ.get("AUTOPAR_CORE_PYTHON")
    python = Path(given) if given else REPO / ".venv-oneflow" / "bin" / "python"
    if not python.exists():
        pytest.skip("no core-only Python here (.venv-oneflow, or AUTOPAR_CORE_PYTHON)")
    with live_server(make_settings(tmp_path, api_keys=["core"])) as server:
        result = subprocess.run(
            [str(python), "-c", CORE_CLIENT, server.url, "core"],
            cwd=Path("/"),
            env={"PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        here = PlanClient(server.url, api_key="core").plan_key(
            build("tiny-gpt"), cluster="1x2", mesh_shape=(2,), options={"time_limit_s": 30}
        )
    assert seen["key"] == seen["again"] == here
    assert seen["loaded"] == [] and seen["numpy"].startswith("1.")
