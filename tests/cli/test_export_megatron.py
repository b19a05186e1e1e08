"""``autopar export megatron PLAN`` (issue 43): Megatron-LM's arguments for a plan it can run,
one line naming why for one it cannot."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from autopar.baselines.megatron.export import (
    _block_recompute,
    _Findings,
    _pipeline_arguments,
    _selective_recompute,
)
from autopar.hardware.cluster import Cluster
from autopar.ir.graph import Graph
from autopar.ir.training import TrainingConfig
from autopar.pipeline.plan import PipelinePlan
from tests.cli.helpers import assert_user_error, run_cli


def _flags(line: str) -> dict[str, list[str]]:
    """``--a 1 --b --c x y`` -> {"--a": ["1"], "--b": [], "--c": ["x", "y"]}."""
    out: dict[str, list[str]] = {}
    key = ""
    for word in shlex.split(line):
        if word.startswith("--"):
            key = word
            out[key] = []
        else:
            out[key].append(word)
    return out


def test_a_megatron_baseline_exports_tp_sp_and_selective_recompute(tmp_path: Path) -> None:
    made = run_cli(
        "baseline", "megatron", "tiny-gpt", "--cluster", "1x8",
        "--megatron-config", "tp=2,sp=on,recompute=selective", "--out", "b.json", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    done = run_cli("export", "megatron", "b.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1  # one line: pretrain_gpt.py $(autopar export ...)
    flags = _flags(done.stdout)
    assert flags["--tensor-model-parallel-size"] == ["2"]
    assert flags["--pipeline-model-parallel-size"] == ["1"]
    assert "--sequence-parallel" in flags
    assert flags["--recompute-granularity"] == ["selective"]
    assert flags["--recompute-modules"] == ["core_attn"]
    assert "--use-distributed-optimizer" not in flags  # DDP, Megatron-LM's default
    # tiny-gpt's batch of 8 over dp = 8 / 2 = 4 ranks, one micro-batch per step
    assert (flags["--micro-batch-size"], flags["--global-batch-size"]) == (["2"], ["8"])
    assert (flags["--num-layers"], flags["--hidden-size"], flags["--num-attention-heads"]) == (
        ["2"],
        ["64"],
        ["4"],
    )
    assert "data-parallel size 4" in done.stderr
    as_json = json.loads(run_cli("export", "megatron", "b.json", "--json", cwd=tmp_path).stdout)
    assert (as_json["tensor_parallel"], as_json["data_parallel"], as_json["pipeline_parallel"]) == (2, 4, 1)
    assert as_json["command_line"] == done.stdout.strip()


def test_a_pipeline_baseline_exports_pp_vpp_and_block_recompute(tmp_path: Path) -> None:
    assert run_cli("model", "tiny-gpt", "--layers", "8", "--out", "g.json", cwd=tmp_path).returncode == 0
    made = run_cli(
        "baseline", "megatron", "g.json", "--cluster", "2x4", "--micro-batches", "4",
        "--megatron-config", "tp=2,pp=2,vpp=2,sp=off,recompute=full:1,optimizer=distributed",
        "--out", "p.json", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    done = run_cli("export", "megatron", "p.json", "--graph", "g.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    flags = _flags(done.stdout)
    assert flags["--tensor-model-parallel-size"] == ["2"]
    assert flags["--pipeline-model-parallel-size"] == ["2"]
    assert flags["--num-layers-per-virtual-pipeline-stage"] == ["2"]  # 8 layers / (pp 2 x vpp 2)
    assert "--sequence-parallel" not in flags
    assert "--use-distributed-optimizer" in flags
    assert flags["--recompute-granularity"] == ["full"]
    assert (flags["--recompute-method"], flags["--recompute-num-layers"]) == (["block"], ["1"])
    assert (flags["--micro-batch-size"], flags["--global-batch-size"]) == (["4"], ["32"])  # 8 / dp 2; 8 x K 4
    # without --graph the plan's graph must be a bundled model
    message = assert_user_error(run_cli("export", "megatron", "p.json", cwd=tmp_path), "missing_graph")
    assert "'tiny-gpt-l8'" in message and "--graph" in message


def test_an_autopar_plan_with_weights_split_on_the_data_parallel_axis_says_why_not(tmp_path: Path) -> None:
    # 1.2 MiB cannot hold tiny-gpt's replicated model states: the plan splits weights on [4]'s one axis
    made = run_cli(
        "plan", "tiny-gpt", "--cluster", "1x4", "--mesh-shape", "4", "--memory", "1.2MiB", "--zero", "0",
        "--runtime", "megatron-lm", "--checkpointing", "off", "--time-limit", "20", "--no-progress",
        "--out", "a.json", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    message = assert_user_error(
        run_cli("export", "megatron", "a.json", cwd=tmp_path), "not_megatron_expressible"
    )
    assert "weights split on data-parallel mesh axis 0" in message
    assert "Megatron-LM replicates weights across data parallelism" in message


def test_a_plan_priced_under_another_runtime_says_so(tmp_path: Path) -> None:
    made = run_cli(
        "baseline", "megatron", "tiny-gpt", "--cluster", "1x8", "--mesh-shape", "4,2", "--out", "b.json",
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr  # Megatron's layout on that mesh, as OneFlow 0.9 runs it
    message = assert_user_error(
        run_cli("export", "megatron", "b.json", cwd=tmp_path), "not_megatron_expressible"
    )
    assert "runtime oneflow-0.9, not megatron-lm (plan it with --runtime megatron-lm)" in message


def _pipeline(counts: tuple[int, ...], virtual: int = 1) -> PipelinePlan:
    cluster = Cluster.parse(f"{len(counts)}x8")
    return PipelinePlan("g", "", cluster, counts, [], TrainingConfig(4), virtual_stages=virtual)


@pytest.mark.parametrize(
    ("counts", "virtual", "flags"),
    [
        ((4, 4), 2, ["--num-layers-per-virtual-pipeline-stage", "2"]),
        ((3, 5), 1, ["--decoder-first-pipeline-num-layers", "3"]),
        (
            (2, 3, 3, 4),
            1,
            ["--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "4"],
        ),
        ((3, 3, 2), 1, ["--decoder-last-pipeline-num-layers", "2"]),
        ((2, 3, 4, 3), 1, ["--pipeline-model-parallel-layout", "Ett|ttt|tttt|tttL"]),
    ],
)
def test_pipeline_layer_counts(counts: tuple[int, ...], virtual: int, flags: list[str]) -> None:
    found = _Findings()
    assert _pipeline_arguments(Graph("g", [], [], []), _pipeline(counts, virtual), found) == flags
    assert not found.why


@pytest.mark.parametrize(
    ("counts", "virtual", "why"),
    [
        ((3, 5), 2, "interleaves even stages only"),
        ((3, 3), 2, "do not split into 2 virtual stages"),
    ],
)
def test_pipeline_layer_counts_megatron_cannot_name(counts: tuple[int, ...], virtual: int, why: str) -> None:
    found = _Findings()
    _pipeline_arguments(Graph("g", [], [], []), _pipeline(counts, virtual), found)
    assert len(found.why) == 1 and why in found.why[0]


def test_recompute_patterns() -> None:
    chunks = [("l.0", "l.1", "l.2"), ("l.3", "l.4", "l.5")]
    found = _Findings()
    assert _block_recompute(chunks, {"l.0", "l.1", "l.3", "l.4"}, found)[-1] == "2"  # the first 2 of each
    assert _block_recompute(chunks, {f"l.{i}" for i in range(6)}, found)[-3:] == [
        "uniform",
        "--recompute-num-layers",
        "1",
    ]
    assert not found.why
    _block_recompute(chunks, {"l.1", "l.4"}, found)  # not the first of each stage
    assert "--recompute-method block" in found.why[0]
    blocks = ["l.0", "l.1"]
    both = {"l.0": {"attention_core", "norm"}, "l.1": {"attention_core", "norm"}}
    assert _selective_recompute(blocks, both, found)[-2:] == ["core_attn", "layernorm"]
    found = _Findings()
    _selective_recompute(blocks, {"l.0": {"attention_core"}}, found)  # one block only
    assert "the same in every layer" in found.why[0]
    found = _Findings()
    _selective_recompute(blocks, {b: {"mlp_activation"} for b in blocks}, found)
    assert "mlp_activation" in found.why[0]
