"""Fixtures for the OneFlow tests (run in .venv-oneflow: ``bash scripts/test-oneflow.sh``).

OneFlow is imported only inside fixtures, so this file also loads in the main
environment, where the ``oneflow``-marked tests are deselected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "oneflow"


def oneflow_env() -> dict[str, str]:
    """Environment for OneFlow subprocesses: cuDNN/cuBLAS wheels on LD_LIBRARY_PATH."""
    import site

    env = dict(os.environ)
    libs = [
        str(Path(p) / "nvidia" / sub / "lib") for p in site.getsitepackages() for sub in ("cudnn", "cublas")
    ]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")])
    env.setdefault("ONEFLOW_DEBUG_MODE", "")
    return env


def skip_without_solver() -> str:
    """The Python of the main autopar environment (the solver's,
    :func:`autopar.bridges.oneflow.planning.autopar_python`); skips the calling test where there is none."""
    from autopar.bridges.oneflow.planning import autopar_python
    from autopar.errors import ConfigError

    try:
        return autopar_python()
    except ConfigError as exc:
        pytest.skip(f"needs the main autopar environment for the solver: {exc}")


def launch(nproc: int, script: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``nproc`` CPU ranks with oneflow.distributed.launch; raise with its output."""
    command = [
        sys.executable,
        "-m",
        "oneflow.distributed.launch",
        "--nproc_per_node",
        str(nproc),
        # another launch on this machine may hold 29500 (two test sessions at once)
        "--master_port",
        os.environ.get("AUTOPAR_ONEFLOW_PORT", "29500"),
        str(script),
        *args,
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, env=oneflow_env(), timeout=timeout, check=False
    )
    if done.returncode != 0:
        noise = ("W20", "E20", "I20", "libibverbs", "    @")
        tail = [line for line in (done.stdout + done.stderr).splitlines() if not line.startswith(noise)][-40:]
        raise AssertionError(f"{script.name} failed ({done.returncode}):\n" + "\n".join(tail))
    return done


@pytest.fixture(scope="session")
def of_env() -> dict[str, str]:
    """Environment for OneFlow subprocesses (see :func:`oneflow_env`)."""
    return oneflow_env()


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture(scope="session")
def flow() -> Any:
    return pytest.importorskip("oneflow")


@pytest.fixture(scope="session")
def mesh_jobs(tmp_path_factory: pytest.TempPathFactory, flow: Any) -> tuple[Path, dict[str, Any]]:
    """Tiny MT5 / GPT / BERT jobs on 4 ranks as [2, 2], with and without ZeRO-2, and OneFlow's counts.

    ``$AUTOPAR_ONEFLOW_JOBS`` names a directory to build them in once and reuse.
    """
    cached = os.environ.get("AUTOPAR_ONEFLOW_JOBS")
    out = Path(cached) if cached else tmp_path_factory.mktemp("jobs")
    if not (out / "counts.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        launch(4, Path(__file__).with_name("_build_jobs.py"), str(out))
    return out, json.loads((out / "counts.json").read_text())


@pytest.fixture(scope="session")
def fused_kv_jobs(tmp_path_factory: pytest.TempPathFactory, flow: Any) -> Path:
    """The tiny MT5 of :func:`mesh_jobs` (ZeRO-2 only) with each cross-attention's key and
    value as one head-first ``key_value`` linear (LiBai's layout): ``mt5-tiny_zero2.pb``.

    Built in ``$AUTOPAR_ONEFLOW_JOBS/fused-kv`` when that is set, once.
    """
    cached = os.environ.get("AUTOPAR_ONEFLOW_JOBS")
    out = Path(cached) / "fused-kv" if cached else tmp_path_factory.mktemp("fused-kv-jobs")
    if not (out / "counts.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        launch(4, Path(__file__).with_name("_build_jobs.py"), str(out), "fused-kv")
    return out
