"""The HTML report: self-contained, with the sections and numbers it promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.cost.evaluate import evaluate
from autopar.errors import PlanError
from autopar.ir.training import TrainingConfig
from autopar_service.report import baseline_beside, build_report, format_bytes
from tests.report.plans import MESH, baseline, model
from tests.service.helpers import REPO

GIB = 1024**3


@pytest.fixture(scope="module")
def graph():
    return model("tiny-gpt")


@pytest.fixture(scope="module")
def mesh():
    return MESH


@pytest.fixture(scope="module")
def report(graph, mesh) -> str:
    plan = baseline("tiny-gpt", "inferred", 2)
    compare = [("megatron", baseline("tiny-gpt", "megatron", 2))]
    return build_report(graph, plan, compare, 2 * GIB, label="inferred")


def test_self_contained(report: str) -> None:
    # no script, stylesheet, image or frame is fetched from the network
    assert not re.search(
        r"""<(script|link|img|iframe)[^>]*(src|href)\s*=\s*["']?(https?:)?//""", report, re.I
    )
    assert "@import" not in report
    scripts = re.findall(r"<script[^>]*>", report)
    assert all("src=" not in s for s in scripts)
    assert "Plotly.newPlot" in report
    # plotly.js is inlined exactly once
    assert report.count("plotly.js v") <= 2 and len(report) > 1_000_000


def test_sections_and_headline(report: str, graph, mesh) -> None:
    for anchor in ("headline", "communication", "memory", "layers"):
        assert f'id="{anchor}"' in report
    for chart in ("chart-step", "chart-comm", "chart-layers", "chart-memory"):
        assert f'id="{chart}"' in report
    ev = evaluate(graph, baseline("tiny-gpt", "inferred", 2))
    assert f"{ev.step_time_s * 1e3:,.2f} ms" in report
    assert f"{format_bytes(ev.memory.total)}</b>" in report
    assert "budget 2.00 GiB" in report
    assert "The 10 most expensive boxing edges" in report
    assert "communication, mesh axis 0 (4 devices)" in report


def test_layer_tables_mark_differences_from_megatron(report: str, graph) -> None:
    assert "<b>layers.0</b>" in report and "<b>layers.1</b>" in report
    # the inferred plan lays out some weights differently from Megatron: highlighted cells
    assert "class='diff'" in report
    assert "(S(0), B)" in report or "(S(0), S(1))" in report


def test_megatron_column_computed_when_not_compared(graph, mesh) -> None:
    plan = baseline("tiny-gpt", "megatron", 2)
    html = build_report(graph, plan)
    assert "compared with nothing" in html
    assert "class='diff'" not in html  # the plan is Megatron's own layout
    assert "OVER BUDGET" not in html  # default budget: the device's 40 GB


def test_over_budget_is_flagged(graph, mesh) -> None:
    html = build_report(graph, baseline("tiny-gpt", "megatron", 2), budget_bytes=1024)
    assert "OVER BUDGET" in html


def test_plan_for_another_graph_is_refused(graph, mesh) -> None:
    plan = baseline("tiny-bert", "data-parallel", 2)
    with pytest.raises(PlanError) as info:
        build_report(graph, plan)
    assert info.value.code == "plan_mismatch"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def test_cli_report_with_baselines_and_a_plan_file(tmp_path: Path, graph, mesh) -> None:
    plan_path = tmp_path / "megatron.json"
    baseline("tiny-gpt", "megatron", 2).save(str(plan_path))
    graph_path = tmp_path / "g.json"
    graph.save(str(graph_path))
    out = tmp_path / "r.html"
    r = _cli(
        "report",
        str(graph_path),
        str(plan_path),
        "--compare",
        "data-parallel",
        f"mine={plan_path}",
        "--budget",
        "3GiB",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "report of 3 plan(s)" in r.stdout
    html = out.read_text()
    assert "budget 3.00 GiB" in html and "mine" in html and "data-parallel" in html


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["no-such-model", "p.json"], "bad_graph_arg"),
        (["tiny-gpt", "missing.json"], "bad_plan_arg"),
        (["tiny-gpt", "bert.json"], "plan_mismatch"),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, mesh, args: list[str], code: str) -> None:
    baseline("tiny-bert", "data-parallel", 2).save(str(tmp_path / "bert.json"))
    r = _cli("report", *args, "--out", str(tmp_path / "r.html"), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith(f"autopar: error: [{code}]"), r.stderr
    assert "Traceback" not in r.stderr


def test_the_report_shows_the_iteration_of_each_plan(graph) -> None:
    plan = baseline("tiny-gpt", "data-parallel", 2)
    plan.training = TrainingConfig(8, "off")
    megatron = baseline_beside("megatron", graph, plan)
    assert megatron.training == TrainingConfig(8, "off")  # Megatron-LM recomputes nothing by default
    html = build_report(graph, plan, [("megatron", megatron)], 2 * GIB, label="dp")
    assert "K = 8 micro-batches per step,\ncheckpointing off" in html
    assert "<td>8, off</td><td>8, off</td>" in html
    row = re.search(r"evaluated iteration \(K micro-batches \+ once per step\)</th>(.*?)</tr>", html)
    assert row is not None
    shown = [float(x.replace(",", "")) for x in re.findall(r"<b>([0-9.,]+) ms</b>", row.group(1))]
    expected = [evaluate(graph, p).iteration_time_s * 1e3 for p in (plan, megatron)]
    assert shown == pytest.approx(expected, rel=1e-2, abs=0.006)  # printed to 0.01 ms


def test_cli_report_prices_the_plan_and_its_baselines_at_the_asked_iteration(tmp_path: Path, graph) -> None:
    plan = baseline("tiny-gpt", "data-parallel", 2)
    plan.save(str(tmp_path / "dp.json"))
    other = baseline("tiny-gpt", "data-parallel", 2)
    other.save(str(tmp_path / "other.json"))
    args = ["report", "tiny-gpt", "dp.json", "--compare", "megatron", "mine=other.json", "--out"]
    default = _cli(*args, "a.html", cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    # default: the plan's own iteration (K = 1, off); megatron at the same K, its best configuration
    assert "<td>1, off</td><td>1, off</td><td>1, off</td>" in (tmp_path / "a.html").read_text()
    asked = _cli(*args, "b.html", "--micro-batches", "8", "--checkpointing", "full", cwd=tmp_path)
    assert asked.returncode == 0, asked.stderr
    html = (tmp_path / "b.html").read_text()
    # megatron at its own best configuration at that K: the least recomputation that fits (none)
    assert "<td>8, full</td><td>8, off</td><td>8, full</td>" in html and "K = 8" in html
    bad = _cli(*args, "c.html", "--micro-batches", "0", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("autopar: error: [bad_micro_batches]"), bad.stderr
    assert not (tmp_path / "c.html").exists()


def test_the_planner_rows_are_the_iteration_and_the_same_iteration_under_overlap(graph) -> None:
    """Issue 34: one iteration figure; an overlapped figure is the same iteration under overlap."""
    plan = baseline("tiny-gpt", "data-parallel", 2)
    plan.training = TrainingConfig(4, "full")
    ev = evaluate(graph, plan)
    plan.predicted = dict(plan.predicted) | {
        "iteration_time_s": ev.iteration_time_s,
        "iteration_time_overlapped_s": ev.iteration_time_overlapped_s,
        "step_time_overlapped_s": ev.step_time_overlapped_s,
    }
    html = build_report(graph, plan, [], 2 * GIB, label="dp")

    def cell(name: str) -> str:
        row = re.search(re.escape(name) + r"</th><td>(.*?)</td>", html)
        assert row is not None, name
        return row.group(1)

    assert cell("planner: predicted iteration") == f"{ev.iteration_time_s * 1e3:,.2f} ms"
    overlapped = cell("planner: the same iteration, gradient reduction overlapping backward")
    assert overlapped == f"{ev.iteration_time_overlapped_s * 1e3:,.2f} ms"
    assert ev.iteration_time_overlapped_s <= ev.iteration_time_s
    # no competing figure: the step under overlap and "step time" rows are gone
    assert "step time overlapped" not in html and "step time" not in html.lower()


def test_the_headline_names_each_plans_configuration(graph) -> None:
    """A baseline priced at its own configuration shows it in its users' words (issue 33)."""
    from autopar.baselines.megatron.configs import megatron_config

    plan = baseline("tiny-gpt", "inferred", 2)
    megatron = baseline("tiny-gpt", "megatron", 0)
    conf = megatron_config("tp=2,dp=4", megatron.mesh.cluster)
    megatron.diagnostics["baseline_configuration"] = {**conf.to_dict(), "named_by_user": True}
    text = build_report(graph, plan, [("megatron", megatron)], 2 * GIB, label="inferred")
    assert "<th>configuration</th>" in text
    assert "tp=2, dp=4, pp=1, recompute=none, DDP (named)" in text
    assert f"mesh {list(plan.mesh.shape)}, ZeRO-2, runtime {plan.runtime}" in text
