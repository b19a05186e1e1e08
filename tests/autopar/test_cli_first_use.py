"""What a first-time user of the command line met (issue 24, items 11-14), each fixed and held here.

* ``--time-limit`` means one thing (the whole request) with one default (30 s) in ``plan``,
  ``submit``, the API and the explorer page;
* the ``[time_limit]`` error says what is true about a rerun, and prints seconds readably;
* ``evaluate`` refuses a plan made for another graph, and says how many errors it left out;
* small figures print in MiB or KiB, not ``0.00 GiB``; ``report --compare`` suggests a
  near-miss baseline; ``--time-limit -1`` names the option; ``min_feasible_bytes`` is an int;
  the solver's gap reads "proven gap".
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from autopar.cli.args import DEFAULT_TIME_LIMIT_S
from autopar.cli.main import build_parser, main
from autopar.errors import InfeasibleError
from autopar.hardware.cluster import Cluster
from autopar.infra.progress import Deadline
from autopar.ir.plan import Plan, format_bytes
from autopar.models import build

STATIC = Path(__file__).resolve().parents[2] / "service" / "static"


def _user_error(capsys: pytest.CaptureFixture[str], argv: list[str], code: str) -> str:
    """Run ``autopar ARGV``: exit 2 and one ``autopar: error: [code] ...`` line; the message."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse errors exit from inside parse_args
        status = int(exc.code or 0)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autopar: error: [{code}] "), err
    return lines[0]


@pytest.fixture(scope="module")
def megatron_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plans") / "tiny-gpt.megatron.json"
    argv = ["baseline", "megatron", "tiny-gpt", "--cluster", "1x4", "--mesh-shape", "2,2", "--out", str(out)]
    assert main(argv) == 0
    return out


# ------------------------------------------------------------------ item 11: one time limit


def _help(command: str) -> str:
    parser, _ = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(sub.choices[command].format_help().split())


def test_time_limit_means_the_whole_request_with_one_default_everywhere() -> None:
    from autopar_service.requests import SolverOptionsBody
    from autopar_service.settings import Settings

    assert DEFAULT_TIME_LIMIT_S == 30.0
    for command in ("plan", "submit"):
        text = _help(command)
        assert "seconds for the whole request" in text and "every mesh shape together" in text, command
        assert "(default: 30.0)" in text and "per mesh shape" not in text, command
    assert Settings.model_fields["default_time_limit_s"].default == DEFAULT_TIME_LIMIT_S
    api = SolverOptionsBody.model_fields["time_limit_s"].description or ""
    assert "the whole request" in api and "every mesh shape together" in api and "30" in api
    page = (STATIC / "index.html").read_text()
    field = re.search(r'<label>([^<]*)<input id="time-limit"[^>]*>', page)
    assert field is not None and 'value="30"' in field.group(0)
    assert "whole request" in field.group(1) and "whole request" in field.group(0)


def test_submit_sends_the_default_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import autopar_service.cli as service_cli

    sent: dict[str, Any] = {}

    def capture(url: str, graph: bytes, request: dict[str, Any], args: argparse.Namespace) -> int:
        sent.update(request)
        return 0

    monkeypatch.setattr(service_cli, "_submit_to", capture)
    assert main(["submit", "tiny-gpt", "--server", "http://127.0.0.1:9"]) == 0
    assert sent["options"]["time_limit_s"] == DEFAULT_TIME_LIMIT_S


@pytest.mark.parametrize("command", [["plan", "tiny-gpt", "--out", "x.json"], ["submit", "tiny-gpt"]])
@pytest.mark.parametrize("value", ["-1", "0", "inf", "soon"])
def test_a_bad_time_limit_names_the_option(
    capsys: pytest.CaptureFixture[str], command: list[str], value: str
) -> None:
    line = _user_error(capsys, [*command, "--time-limit", value], "bad_args")
    assert "--time-limit" in line and "time_limit_s" not in line


# ------------------------------------------------------------------ item 12: the [time_limit] error


def test_the_cost_table_time_limit_error_says_when_a_rerun_resumes() -> None:
    from autopar.cost.build_tables import _out_of_time

    message = _out_of_time(Deadline(0.150959), "cost_tables:ops", "op entries", 3, 10).message
    assert "(0.15 s)" in message and "0.150959" not in message
    assert "--memo DIR" in message and "otherwise it starts over" in message
    assert "so a rerun starts from there" not in message


def test_mesh_search_lines_print_readable_figures() -> None:
    from autopar_solver.cli import mesh_search_text

    text = mesh_search_text(
        [
            {"shape": [2, 2], "iteration_time_s": 0.0004123, "micro_batch_time_s": 0.0001, "gap": 0.0033,
             "memory_per_device_bytes": 1604321.0, "wall_s": 0.150959},
            {"shape": [4], "iteration_time_s": None, "memory_per_device_bytes": None, "gap": None,
             "wall_s": 0.2, "error": "[time_limit] the time limit (0.15 s) ran out"},
        ]
    )  # fmt: skip
    assert "iteration 0.41 ms (0.10 ms per micro-batch), 1.53 MiB, proven gap 0.33 %, 0.2 s" in text
    assert "0.00 GiB" not in text and "0.150959" not in text


def test_planner_time_limit_messages_round_the_limit(tmp_path: Path) -> None:
    planner = Path(__file__).resolve().parents[2] / "solver" / "planner"
    for module in planner.glob("*.py"):  # printed 0.150959 s for a mesh shape's share
        assert "limit_s:g}" not in module.read_text(), module.name


# ------------------------------------------------------------------ item 13: evaluate


def test_evaluate_refuses_a_plan_made_for_another_graph(
    capsys: pytest.CaptureFixture[str], megatron_plan: Path
) -> None:
    line = _user_error(capsys, ["evaluate", "tiny-bert", str(megatron_plan)], "plan_graph_mismatch")
    assert "'tiny-gpt'" in line and "'tiny-bert'" in line and "autopar plan" in line
    assert main(["evaluate", "tiny-gpt", str(megatron_plan)]) == 0
    assert "valid (baseline:megatron)" in capsys.readouterr().out


def test_evaluate_says_how_many_errors_it_left_out(
    capsys: pytest.CaptureFixture[str], megatron_plan: Path, tmp_path: Path
) -> None:
    data = json.loads(megatron_plan.read_text())
    data["graph"]["hash"] = ""  # a plan that records no graph hash is not checked
    unhashed = tmp_path / "unhashed.json"
    unhashed.write_text(json.dumps(data))
    assert main(["evaluate", "tiny-bert", str(unhashed)]) == 1
    out = capsys.readouterr().out
    shown = out.count("  error: ")
    left = re.search(r"\.\.\. (\d+) more error\(s\) left out \((\d+) in all\)", out)
    assert shown == 20 and left is not None and int(left.group(1)) + 20 == int(left.group(2))


# ------------------------------------------------------------------ item 14: small gaps


def test_small_memory_prints_in_mib_or_kib(capsys: pytest.CaptureFixture[str], megatron_plan: Path) -> None:
    assert [format_bytes(x) for x in (4563402752, 2942848, 5000, 5)] == [
        "4.25 GiB",
        "2.81 MiB",
        "4.88 KiB",
        "5 B",
    ]
    assert main(["evaluate", "tiny-gpt", str(megatron_plan)]) == 0
    out = capsys.readouterr().out
    assert "0.00 GiB" not in out and re.search(r"memory\s+\d+\.\d\d MiB per device", out)
    summary = Plan.load(str(megatron_plan)).summary()
    assert "0.00" not in summary.split("memory/dev")[1].splitlines()[0] and "MiB" in summary


def test_the_solver_gap_reads_proven_gap(megatron_plan: Path) -> None:
    plan = Plan.load(str(megatron_plan))
    plan.solver = {"status": "feasible", "gap": 0.0033, "wall_s": 4.2}  # type: ignore[typeddict-item]
    summary = plan.summary()
    assert "feasible, proven gap 0.33% in 4.2 s" in summary and "feasible gap" not in summary


def test_report_compare_suggests_a_near_miss(capsys: pytest.CaptureFixture[str], megatron_plan: Path) -> None:
    out = Path(megatron_plan).with_suffix(".html")
    argv = ["report", "tiny-gpt", str(megatron_plan), "--compare", "megatorn", "--out", str(out)]
    line = _user_error(capsys, argv, "bad_compare")
    assert "did you mean 'megatron'?" in line and not out.exists()


def test_min_feasible_bytes_is_an_int() -> None:
    from autopar_solver.options import SolverOptions
    from autopar_solver.planner import PlanRequest, plan

    request = PlanRequest(
        build("tiny-gpt"), Cluster.parse("1x4", "a100-40g"), (2, 2), 4096, 2, SolverOptions(time_limit_s=30)
    )
    with pytest.raises(InfeasibleError) as err:
        plan(request)
    value = err.value.details["min_feasible_bytes"]
    assert type(value) is int and value > 4096
