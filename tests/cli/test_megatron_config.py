"""``autopar baseline megatron --megatron-config tp=T,dp=D``: the configuration the user runs (issue 33),
the keys left out searched for the fastest that fits (issue 41)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.helpers import run_cli


def test_baseline_prices_the_named_megatron_configuration(tmp_path: Path) -> None:
    made = run_cli(
        "baseline", "megatron", "tiny-gpt", "--cluster", "2x4",
        "--megatron-config", "tp=4,dp=2,optimizer=distributed", "--out", "m.json", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    line = next(x for x in made.stdout.splitlines() if x.startswith("configuration"))
    assert (
        line.startswith("configuration  tp=4, dp=2, pp=1, ")
        and "distributed optimizer, runtime megatron-lm" in line
    )
    assert "(named 'tp=4,dp=2,optimizer=distributed'" in line  # sp and the recomputation searched
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["mesh"]["shape"] == [2, 4]  # [dp, tp]: tp inside a node
    assert (saved["zero_stage"], saved["runtime"]) == (1, "megatron-lm")
    conf = saved["diagnostics"]["baseline_configuration"]
    assert (conf["tensor_parallel"], conf["data_parallel"], conf["pipeline_parallel"]) == (4, 2, 1)
    assert conf["named_by_user"] is True


def test_a_configuration_that_does_not_cover_the_cluster_is_a_user_error(tmp_path: Path) -> None:
    bad = run_cli(
        "baseline", "megatron", "tiny-gpt", "--cluster", "2x4",
        "--megatron-config", "tp=3,dp=2", "--out", "m.json", cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.startswith("autopar: error: [bad_baseline_config]")
    assert "tp(3) must divide the 4 devices of a node" in bad.stderr
    other = run_cli(
        "baseline", "megatron", "tiny-gpt", "--cluster", "2x4",
        "--megatron-config", "tp=2,dp=2,pp=1", "--out", "m.json", cwd=tmp_path,
    )  # fmt: skip
    assert other.returncode == 2 and "tp(2) * dp(2) * pp(1) != devices(8)" in other.stderr
    # with pp left out, tp=2, dp=2 is a pipeline of two stages: searched, not refused
    staged = run_cli(
        "baseline", "megatron", "tiny-gpt", "--cluster", "2x4",
        "--megatron-config", "tp=2,dp=2", "--out", "s.json", cwd=tmp_path,
    )  # fmt: skip
    assert staged.returncode == 0, staged.stderr
    assert "tp=2, dp=2, pp=2" in staged.stdout


def test_plan_compare_prices_megatron_at_the_named_configuration_and_records_it(tmp_path: Path) -> None:
    """``plan --compare --megatron-config``: megatron at the user's configuration, printed and
    carried in the plan's ``diagnostics.compare`` with every baseline's configuration."""
    done = run_cli(
        "plan", "tiny-gpt", "--cluster", "2x4", "--mesh-shape", "4,2", "--time-limit", "10", "--no-progress",
        "--compare", "--megatron-config", "tp=2,dp=4", "--out", "p.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.strip().startswith("megatron ") and "(named)" in x)
    assert "tp=2, dp=4, pp=1" in line and line.endswith("runtime megatron-lm (named)")
    saved = json.loads((tmp_path / "p.json").read_text())
    compared = {row["kind"]: row for row in saved["diagnostics"]["compare"]}
    megatron = compared["megatron"]
    assert (megatron["tensor_parallel"], megatron["data_parallel"], megatron["named_by_user"]) == (2, 4, True)
    assert megatron["mesh_shape"] == [4, 2] and megatron["runtime"] == "megatron-lm"
    assert compared["data-parallel"]["mesh_shape"] in ([8], [2, 4])  # flat or laid out
    assert all(row["iteration_time_s"] > 0 for row in compared.values())
