"""The texts a user reads first (issue 43, the LOW items): the summary says its times are
modelled, prints the throughput, repeats nothing at K = 1 and names no deprecated field;
``--compare``'s table is fastest first; an infeasible budget names the options that may help;
a graph without ``format`` says what to make; ``--tp 4`` points at ``--mesh-shape``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from autopar.ir.batch import BatchShape, batch_shape
from autopar.ir.plan import Plan
from autopar.ir.training import TrainingConfig
from autopar.models import build
from autopar.pipeline.plan import PipelinePlan
from autopar_solver.cli import summary_table
from tests.cli.helpers import assert_user_error, run_cli


def _baseline(tmp_path: Path, *extra: str) -> Plan:
    made = run_cli(
        "baseline", "megatron", "tiny-gpt", "--cluster", "1x4", *extra, "--out", "m.json", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert "deprecated" not in made.stdout
    return Plan.load(str(tmp_path / "m.json"))


def test_the_summary_at_one_micro_batch(tmp_path: Path) -> None:
    plan = _baseline(tmp_path)
    text = plan.summary(batch_shape(build("tiny-gpt")))
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["iteration", f"{plan.iteration_time_s * 1e3:.2f}", "ms", "modelled"]
    assert "at K = 1" not in text and "deprecated" not in text and "step_time_s" not in text
    # tiny-gpt: 8 sequences of 32 tokens per micro-batch, one micro-batch per iteration
    samples = 8 / plan.achieved_iteration_time_s  # as the runtime runs it
    throughput = next(line for line in lines if line.split()[0] == "throughput")
    assert f"{samples:,.0f} samples/s, {samples * 32:,.0f} tokens/s" in throughput
    assert "(1 x 8 samples of 32 tokens per iteration)" in throughput
    assert "throughput" not in plan.summary()  # without the graph's batch: no throughput


def test_the_summary_at_several_micro_batches_keeps_the_one_micro_batch_figure(tmp_path: Path) -> None:
    plan = _baseline(tmp_path, "--micro-batches", "4")
    text = plan.summary(BatchShape(8))
    assert "at K = 1" in text and "deprecated" not in text
    assert "samples/s" in text and "tokens/s" not in text  # no sequence known


def test_a_pipeline_summary_says_modelled_and_its_throughput(tmp_path: Path) -> None:
    made = run_cli(
        "baseline", "megatron", "tiny-gpt", "--cluster", "2x4", "--micro-batches", "4",
        "--megatron-config", "tp=2,pp=2", "--out", "p.json", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    plan = PipelinePlan.from_json((tmp_path / "p.json").read_text())
    lines = plan.summary(batch_shape(build("tiny-gpt"))).splitlines()
    assert f"iteration {plan.iteration_time_s * 1e3:.2f} ms modelled" in lines[0]
    assert lines[1].split()[0] == "throughput" and "(4 x 8 samples of 32 tokens per iteration)" in lines[1]


def _row(name: str, seconds: float) -> tuple[str, object]:
    return name, SimpleNamespace(
        iteration_time_s=seconds,
        solver=None,
        training=TrainingConfig(1),
        memory_per_device_bytes=2**20,
    )


def test_the_compare_table_is_fastest_first_with_ratios_to_megatron() -> None:
    rows = [
        _row("autopar", 0.002),
        _row("data-parallel", 0.009),
        _row("inferred", 0.001),
        _row("megatron", 0.004),
    ]
    lines = summary_table(rows).splitlines()  # type: ignore[arg-type]
    assert "vs megatron" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["inferred", "autopar", "megatron", "data-parallel"]
    assert lines[2].split()[4] == "0.500x" and lines[3].split()[4] == "1.000x"


def test_an_infeasible_budget_names_checkpointing_and_stages(tmp_path: Path) -> None:
    result = run_cli(
        "plan", "tiny-gpt", "--cluster", "1x4", "--mesh-shape", "4", "--memory", "1MiB", "--zero", "0",
        "--checkpointing", "off", "--time-limit", "20", "--no-progress", "--out", "p.json", cwd=tmp_path,
    )  # fmt: skip
    message = assert_user_error(result, "infeasible_budget")
    for remedy in ("--memory", "--zero 1", "--checkpointing auto (or full)", "--stages 2", "more devices"):
        assert remedy in message, message


def test_a_graph_without_format_says_what_to_make(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text('{"name": "mine", "ops": []}')
    message = assert_user_error(run_cli("costs", "g.json", cwd=tmp_path), "bad_format")
    assert "None" not in message
    assert '"format": "autopar.graph/v1"' in message and "autopar model NAME --out g.json" in message


def test_an_unknown_parallelism_option_points_at_the_mesh(tmp_path: Path) -> None:
    message = assert_user_error(
        run_cli("plan", "tiny-gpt", "--tp", "4", "--out", "p.json", cwd=tmp_path), "bad_args"
    )
    assert "unrecognized arguments: --tp 4" in message
    for hint in ("--mesh-shape", "--stages", "--megatron-config"):
        assert hint in message, message
    other = assert_user_error(
        run_cli("plan", "tiny-gpt", "--colour", "4", "--out", "p.json", cwd=tmp_path), "bad_args"
    )
    assert "--mesh-shape" not in other
