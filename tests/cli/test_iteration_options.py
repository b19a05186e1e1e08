"""``--micro-batches`` and ``--checkpointing`` on ``baseline``, ``evaluate`` and ``plan``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import assert_user_error, run_cli


def test_evaluate_re_prices_a_plan_at_another_k(tmp_path: Path) -> None:
    made = run_cli("baseline", "megatron", "tiny-gpt", "--cluster", "1x4", "--out", "m.json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    saved = json.loads((tmp_path / "m.json").read_text())
    # Megatron-LM recomputes nothing by default: its baseline is priced so
    assert (saved["micro_batches"], saved["checkpointing"]) == (1, "off")
    one = json.loads(run_cli("evaluate", "tiny-gpt", "m.json", "--json", cwd=tmp_path).stdout)
    eight = run_cli("evaluate", "tiny-gpt", "m.json", "--json", "--micro-batches", "8", cwd=tmp_path)
    assert eight.returncode == 0, eight.stderr
    ev = json.loads(eight.stdout)
    assert ev["micro_batches"] == 8 and ev["checkpointing"] == "off"
    assert ev["iteration_time_s"] == pytest.approx(8 * ev["micro_batch_time_s"] + ev["once_per_step_time_s"])
    assert ev["step_time_s"] == pytest.approx(one["step_time_s"])
    full = run_cli("evaluate", "tiny-gpt", "m.json", "--json", "--checkpointing", "full", cwd=tmp_path)
    assert json.loads(full.stdout)["iteration_time_s"] > one["iteration_time_s"]


def test_evaluate_and_the_summary_print_the_iteration_first(tmp_path: Path) -> None:
    """Issue 34: at K = 32 the first figure is the iteration, one optimizer step; the one
    micro-batch figure is labelled as the iteration at K = 1, never as a "step time"."""
    made = run_cli("baseline", "megatron", "tiny-gpt", "--cluster", "1x4", "--out", "m.json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    args = ("evaluate", "tiny-gpt", "m.json", "--micro-batches", "32")
    ev = json.loads(run_cli(*args, "--json", cwd=tmp_path).stdout)
    text = run_cli(*args, cwd=tmp_path).stdout
    figures = [line.split() for line in text.splitlines()[1:]]
    assert figures[0][:4] == ["iteration", f"{ev['iteration_time_s'] * 1e3:.2f}", "ms", "modelled"], text
    assert figures[1][0] == "throughput"  # tiny-gpt's batch and sequence are known
    assert figures[2][:5] == ["at", "K", "=", "1", f"{ev['step_time_s'] * 1e3:.2f}"], text
    assert "step time" not in text
    from autopar.ir.plan import Plan

    plan = Plan.load(str(tmp_path / "m.json"))
    assert plan.iteration_time_s == pytest.approx(
        plan.training.micro_batches * plan.micro_batch_time_s + plan.once_per_step_s
    )
    summary = plan.summary().splitlines()
    assert summary[1].split()[0] == "iteration" and "step time" not in "\n".join(summary)


@pytest.mark.parametrize("k", ["0", "-3"])
def test_a_bad_micro_batch_count_is_one_line(tmp_path: Path, k: str) -> None:
    result = run_cli(
        "baseline", "data-parallel", "tiny-gpt", "--micro-batches", k, "--out", "x.json", cwd=tmp_path
    )
    message = assert_user_error(result, "bad_micro_batches")
    assert k in message
    assert not (tmp_path / "x.json").exists()


def test_plan_minimises_the_iteration_it_is_asked_for(tmp_path: Path) -> None:
    result = run_cli(
        "plan",
        "tiny-gpt",
        "--cluster",
        "1x4",
        "--mesh-shape",
        "2,2",
        "--micro-batches",
        "4",
        "--checkpointing",
        "full",
        "--time-limit",
        "20",
        "--no-progress",
        "--out",
        "p.json",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    assert (plan["micro_batches"], plan["checkpointing"]) == (4, "full")
    assert plan["solver"]["objective"] == pytest.approx(plan["predicted"]["iteration_time_s"], rel=1e-6)
    assert "iteration" in result.stdout


def test_auto_checkpointing_plans_and_records_the_recomputed_blocks(tmp_path: Path) -> None:
    result = run_cli(
        "plan",
        "tiny-gpt",
        "--cluster",
        "1x4",
        "--mesh-shape",
        "2,2",
        "--micro-batches",
        "2",
        "--checkpointing",
        "auto",
        "--time-limit",
        "120",
        "--out",
        "p.json",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    assert (plan["micro_batches"], plan["checkpointing"]) == (2, "auto")
    # no budget: recomputing only costs time, so no block recomputes
    assert plan["recomputed_blocks"] == []
    assert plan["solver"]["objective"] == pytest.approx(plan["predicted"]["iteration_time_s"], rel=1e-6)
    assert "recompute   none" in result.stdout


def test_plan_zero_auto_solves_each_stage_and_keeps_the_fastest(tmp_path: Path) -> None:
    result = run_cli(
        "plan", "tiny-gpt", "--cluster", "1x4", "--mesh-shape", "2,2", "--runtime", "megatron-lm",
        "--zero", "auto", "--micro-batches", "2", "--time-limit", "240", "--no-progress", "--out", "p.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    rows = saved["diagnostics"]["zero_search"]
    assert [r["zero_stage"] for r in rows] == [1, 3]
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["zero_stage"] == saved["zero_stage"]
    solved = [r for r in rows if r["outcome"] == "solved"]
    assert chosen[0]["achieved_iteration_time_s"] == min(r["achieved_iteration_time_s"] for r in solved)
    assert (
        "zero search (--zero auto" in result.stdout
        and f"ZeRO-{saved['zero_stage']} (chosen)" in result.stdout
    )


def test_a_bad_zero_stage_is_one_line(tmp_path: Path) -> None:
    message = assert_user_error(
        run_cli("plan", "tiny-gpt", "--zero", "5", "--out", "p.json", cwd=tmp_path), "bad_args"
    )
    assert "auto" in message


def test_stages_auto_over_budget_at_every_count_says_infeasible(tmp_path: Path) -> None:
    """Every number of stages over the budget is the budget's error (its floor and advice), not a
    time limit."""
    result = run_cli(
        "plan", "tiny-gpt", "--cluster", "2x2", "--memory", "1MiB", "--checkpointing", "off",
        "--time-limit", "240", "--no-progress", "--out", "p.json", cwd=tmp_path,
    )  # fmt: skip
    message = assert_user_error(result, "infeasible_budget")
    assert message.startswith("no number of stages tried (1, 2) fits: ") and "smallest memory" in message
    assert not (tmp_path / "p.json").exists()
