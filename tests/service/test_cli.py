"""``autopar serve | worker | submit``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.ir.plan import Plan
from autopar_service.cli import REPORT_COMMAND, SERVE_COMMAND, SUBMIT_COMMAND, WORKER_COMMAND
from tests.cli.helpers import run_cli
from tests.service.helpers import REPO, live_server, make_settings


def test_cli_surface() -> None:
    """Freeze the commands and their flags (scripts and launchers depend on them)."""
    flags = {}
    for command in (SERVE_COMMAND, WORKER_COMMAND, SUBMIT_COMMAND, REPORT_COMMAND):
        parser = argparse.ArgumentParser(prog=f"autopar {command.name}")
        command.add_arguments(parser)
        flags[command.name] = sorted(a.dest for a in parser._actions if a.dest != "help")
    assert flags == {
        "serve": ["cache_dir", "host", "local_workers", "log_level", "port", "redis_url"],
        "worker": ["burst", "log_level", "name", "redis_url"],
        "report": ["budget", "checkpointing", "compare", "graph", "label", "micro_batches", "out", "plan"],
        "submit": sorted(
            [
                "graph",
                "server",
                "serve",
                "api_key",
                "cluster",
                "preset",
                "cluster_profile",
                "runtime",
                "mesh_shape",
                "memory",
                "zero",
                "time_limit",
                "micro_batches",
                "checkpointing",
                "gap",
                "seed",
                "stages",
                "refresh",
                "wait",
                "timeout",
                "http_timeout",
                "no_progress",
                "out",
                "cache_dir",
                "local_workers",
            ]
        ),
    }


def test_submit_serve_wait_writes_the_plan(tmp_path: Path) -> None:
    args = [
        "submit",
        "tiny-gpt",
        "--serve",
        "--wait",
        "--cluster",
        "1x2",
        "--mesh-shape",
        "2",
        "--time-limit",
        "30",  # a deadline, not a timing assertion: tiny-gpt's tables take seconds on a loaded machine
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        "plan.json",
    ]
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    plan = Plan.load(str(tmp_path / "plan.json"))
    assert plan.mesh.shape == (2,) and plan.step_time_s > 0
    assert "iteration" in first.stdout and "plan.json" in first.stdout
    assert "succeeded" in first.stderr  # the progress line's last state
    second = run_cli(*args, cwd=tmp_path)  # same cache directory: answered from the cache
    assert second.returncode == 0, second.stderr
    assert "cached plan" in second.stderr


def test_submit_sends_the_iteration_and_the_plan_records_it(tmp_path: Path) -> None:
    args = ["submit", "tiny-gpt", "--serve", "--wait", "--cluster", "1x2", "--mesh-shape", "2"]
    args += ["--time-limit", "30", "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    result = run_cli(
        *args, "--micro-batches", "4", "--checkpointing", "full", "--out", "k4.json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    saved = json.loads((tmp_path / "k4.json").read_text())
    assert (saved["micro_batches"], saved["checkpointing"]) == (4, "full")
    predicted = saved["predicted"]
    assert predicted["iteration_time_s"] > predicted["step_time_s"] > 0
    # the iteration is part of the plan key: K = 1 is another request, not the cached K = 4 plan
    one = run_cli(*args, "--out", "k1.json", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert "cached plan" not in one.stderr
    assert json.loads((tmp_path / "k1.json").read_text())["micro_batches"] == 1


@pytest.mark.parametrize(
    ("flags", "code"),
    [
        (["--micro-batches", "0"], "bad_micro_batches"),
    ],
)
def test_submit_refuses_a_bad_iteration(tmp_path: Path, flags: list[str], code: str) -> None:
    result = run_cli(
        "submit",
        "tiny-gpt",
        "--serve",
        "--cluster",
        "1x2",
        "--cache-dir",
        str(tmp_path),
        *flags,
        cwd=tmp_path,
    )
    # a bad K is refused before the server starts
    last = result.stderr.splitlines()[-1]
    assert result.returncode == 2 and last.startswith(f"autopar: error: [{code}]"), result.stderr
    assert "Traceback" not in result.stderr


def test_submit_to_a_server(tmp_path: Path, tiny_graph) -> None:
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(tiny_graph))
    with live_server(make_settings(tmp_path, api_keys=["sekret"])) as server:
        denied = run_cli("submit", str(graph), "--server", server.url, "--cluster", "1x2", cwd=tmp_path)
        assert denied.returncode == 2 and "unauthorized" in denied.stderr
        ok = run_cli(
            "submit",
            str(graph),
            "--server",
            server.url,
            "--cluster",
            "1x2",
            "--mesh-shape",
            "2",
            "--time-limit",
            "5",
            "--out",
            "plan.json",
            cwd=tmp_path,
            env={"AUTOPAR_API_KEY": "sekret"},
        )
        assert ok.returncode == 0, ok.stderr
        # without --wait the job is only submitted: nothing is written, and it says so
        assert "nothing written to plan.json" in ok.stderr and "--wait" in ok.stderr
        assert not (tmp_path / "plan.json").exists()
        job = json.loads(ok.stdout)
        assert job["status"] in ("queued", "running", "succeeded") and len(job["id"]) == 64


def test_worker_needs_redis(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AUTOPAR_REDIS_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "worker"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "needs Redis" in result.stderr


def test_unknown_graph_argument(tmp_path: Path) -> None:
    result = run_cli("submit", "no-such-model", "--server", "http://127.0.0.1:9", cwd=tmp_path)
    assert result.returncode == 2
    assert "neither a graph file nor a bundled model" in result.stderr


@pytest.mark.parametrize("bad", ["--memory=lots", "--mesh-shape=a,b"])
def test_bad_arguments_are_config_errors(tmp_path: Path, bad: str) -> None:
    result = run_cli("submit", "tiny-gpt", "--server", "http://127.0.0.1:9", bad, cwd=tmp_path)
    assert result.returncode == 2 and "autopar: error:" in result.stderr


def test_serve_refuses_a_public_address_without_keys(tmp_path) -> None:
    env = {"AUTOPAR_CACHE_DIR": str(tmp_path), "AUTOPAR_API_KEYS": "", "AUTOPAR_ALLOW_ANONYMOUS": "0"}
    result = run_cli("serve", "--host", "0.0.0.0", "--port", "9", cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar: error: [no_api_keys]"), result.stderr
    assert "AUTOPAR_ALLOW_ANONYMOUS=1" in lines[0]
