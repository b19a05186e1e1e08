"""Ask autopar for a plan from the OneFlow side.

OneFlow 0.9 (protobuf < 4, numpy < 2) and the solver (ortools 9.15: protobuf 6,
numpy 2) cannot share an environment, so the OneFlow side runs ``autopar plan``
(or ``autopar baseline``) with the Python of the main autopar environment in a
subprocess and reads the plan JSON back.  That Python is ``$AUTOPAR_PYTHON`` or
``.venv/bin/python`` at the repository root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from autopar.errors import ConfigError, PlanError
from autopar.ir.plan import Plan

__all__ = ["BASELINE_PLANNERS", "autopar_python", "request_plan"]

BASELINE_PLANNERS = ("megatron", "inferred", "data-parallel", "single-device")


def autopar_python() -> str:
    """The Python of the main autopar environment (the one with the solver)."""
    explicit = os.environ.get("AUTOPAR_PYTHON")
    if explicit:
        return explicit
    candidate = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "python"
    if candidate.exists():
        return str(candidate)
    raise ConfigError(
        "autopar_python_missing",
        f"no main autopar environment at {candidate}; set AUTOPAR_PYTHON to a Python that has "
        "autopar[solver] installed",
    )


def request_plan(
    graph_path: str,
    out_path: str,
    *,
    mesh_shape: Sequence[int],
    cluster: str,
    zero_stage: int = 0,
    planner: str = "solver",
    preset: str = "a100-40g",
    memory: str | None = None,
    time_limit_s: float = 30.0,
    python: str | None = None,
    timeout_s: float | None = None,
    runtime: str | None = None,
    micro_batches: int = 1,
    checkpointing: str | None = None,
) -> Plan:
    """Plan ``graph_path`` with autopar's solver (``planner="solver"``) or a baseline, and load it.

    ``cluster`` is ``NODESxDEVICES``; ``memory`` a per-device budget such as
    ``"40GiB"`` (default: the preset's memory); ``runtime`` a runtime profile
    (default ``oneflow-0.9``: OneFlow's default ZeRO ``shard_min_size``; a job built
    with ``shard_min_size=1`` plans with ``oneflow-0.9-shard-min-1``, see
    :func:`autopar.bridges.oneflow.plans.job_runtime`).  ``micro_batches`` and ``checkpointing``
    (``--micro-batches`` / ``--checkpointing``; default: one micro-batch and the planner's
    own default) set the iteration the plan is solved for; ``compile_with_plan`` then runs it.
    Raises :class:`PlanError` with the planner's error output when it fails.
    """
    mesh = ",".join(str(int(s)) for s in mesh_shape)
    common = ["--cluster", cluster, "--preset", preset, "--mesh-shape", mesh, "--zero", str(zero_stage)]
    if runtime:
        common += ["--runtime", runtime]
    if micro_batches != 1:
        common += ["--micro-batches", str(int(micro_batches))]
    if checkpointing is not None:
        common += ["--checkpointing", checkpointing]
    if planner == "solver":
        args = [
            "plan",
            graph_path,
            *common,
            "--stages",
            "1",  # one plan over the whole mesh, as apply_plan applies it (pipelines: pipeline_apply)
            "--time-limit",
            str(time_limit_s),
            "--no-progress",
            "--out",
            out_path,
        ]
        if memory:
            args += ["--memory", memory]
    elif planner in BASELINE_PLANNERS:
        args = ["baseline", planner, graph_path, *common, "--out", out_path]
    else:
        raise ConfigError(
            "bad_planner", f"unknown planner {planner!r}; use 'solver' or one of {list(BASELINE_PLANNERS)}"
        )
    command = [python or autopar_python(), "-m", "autopar.cli", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise PlanError(
            "planner_failed",
            f"`autopar {' '.join(args[:2])}` exited with {done.returncode}:\n" + "\n".join(tail),
        )
    if done.stdout:
        sys.stderr.write(done.stdout)
    return Plan.load(out_path)
