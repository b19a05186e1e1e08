"""``autopar baseline megatron --megatron-config tp=T,dp=D``: the configuration the user runs (issue 33)."""

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
    assert "tp=4, dp=2, pp=1, distributed optimizer, runtime megatron-lm (named)" in made.stdout
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
    assert bad.stderr.startswith("autopar: error: [bad_baseline_config]") and "tp(3) * dp(2)" in bad.stderr
