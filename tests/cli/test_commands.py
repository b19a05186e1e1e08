"""What a newcomer meets: help with every default, ``--version``, model names for GRAPH,
one "written to PATH" line, and how the ``autopar`` command is assembled."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from autopar import __version__
from autopar.cli.args import BASELINE_KINDS, missing_distributions, parse_bytes
from autopar.cli.main import ENTRY_POINT_GROUP, build_parser, core_commands
from autopar.errors import ConfigError
from autopar.ir.plan import Plan
from autopar.models import MODEL_NAMES
from tests.cli.helpers import run_cli

MESH = ("--cluster", "1x2", "--mesh-shape", "2")


def _help(*command: str) -> str:
    parser, _ = build_parser()
    if command:
        parser = parser._subparsers._group_actions[0].choices[command[0]]  # type: ignore[union-attr]
    return " ".join(parser.format_help().split())


def test_version(tmp_path: Path) -> None:
    result = run_cli("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == f"autopar {__version__}\n"


def test_help_lists_models_kinds_and_defaults() -> None:
    top = _help()
    assert all(name in top for name in MODEL_NAMES)
    assert "needs autopar[solver]" in top and "needs autopar[service]" in top
    baseline = _help("baseline")
    assert all(kind in baseline for kind in BASELINE_KINDS)
    assert all(name in _help("model") for name in MODEL_NAMES)
    plan = _help("plan")
    for text in (
        "(default: 30.0)",  # time limit
        "seconds for the whole request",
        "--compare comes on top",
        "default: oneflow-0.9",  # runtime profile
        "(default: 0.01)",  # gap
        "(default: min(8, CPUs))",  # workers
        "(default: 2x4)",
        "(default: a100-40g)",
        "(default: 2)",  # ZeRO
        "GiB",
        "the fastest of every 1-D and 2-D shape",  # no --mesh-shape
    ):
        assert text in plan, text
    assert all(name in plan for name in MODEL_NAMES)
    assert "(devices/2, 2) on several nodes" in baseline
    serve = _help("serve")
    assert "(default: 127.0.0.1)" in serve and "(default: 8000)" in serve
    submit = _help("submit")
    assert "seconds for the whole request" in submit and "(default: 30.0)" in submit


def test_commands_come_from_the_core_and_the_entry_points() -> None:
    _, commands = build_parser()
    core = {c.name for c in core_commands()}
    assert core == {"model", "costs", "baseline", "evaluate", "calibrate", "oneflow", "export"}
    registered = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert registered == {"plan", "serve", "worker", "submit", "report"}
    assert set(commands) == core | registered
    assert (commands["plan"].extra, commands["serve"].extra, commands["submit"].extra) == (
        "solver",
        "service",
        None,
    )


def test_extras_are_read_from_the_installed_metadata() -> None:
    assert missing_distributions("solver") == []  # the dev environment has every extra
    assert missing_distributions("no-such-extra") == []


@pytest.mark.parametrize(
    ("text", "value"),
    [("40GiB", 40 * 1024**3), ("38.5GB", 38_500_000_000), ("1073741824B", 1024**3), ("512 mib", 512 * 2**20)],
)
def test_memory_sizes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["40", "40G", "0B", "-1GiB", "GiB", ""])
def test_memory_sizes_refused(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_bytes(text)
    assert info.value.code == "bad_memory"


def test_model_names_work_as_graph_arguments(tmp_path: Path) -> None:
    base = run_cli("baseline", "megatron", "tiny-gpt", *MESH, "--out", "megatron.json", cwd=tmp_path)
    assert base.returncode == 0, base.stderr
    assert base.stdout.splitlines()[-1] == "plan written to megatron.json"
    assert Plan.load(str(tmp_path / "megatron.json")).graph_name == "tiny-gpt"
    ev = run_cli("evaluate", "tiny-gpt", "megatron.json", "--json", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["valid"] is True


def test_model_writes_one_line_style(tmp_path: Path) -> None:
    result = run_cli("model", "tiny-bert", "--out", "g.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "graph written to g.json"


@pytest.mark.slow
def test_plan_accepts_a_model_name(tmp_path: Path) -> None:
    result = run_cli(
        "plan", "tiny-gpt", *MESH, "--time-limit", "5", "--no-progress", "--out", "p.json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "plan written to p.json"
    assert Plan.load(str(tmp_path / "p.json")).mesh.shape == (2,)


def test_plan_with_a_memo_folder_answers_the_same_problem_again_from_it(tmp_path: Path) -> None:
    args = ("plan", "tiny-gpt", *MESH, "--time-limit", "10", "--no-progress", "--memo", "memo")
    first = run_cli(*args, "--out", "p1.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = run_cli(*args, "--out", "p2.json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    p1, p2 = (Plan.load(str(tmp_path / name)) for name in ("p1.json", "p2.json"))
    assert (p1.solver or {})["stats"]["memo"]["stored"] is True
    memo = (p2.solver or {})["stats"]["memo"]
    assert memo["found"] is True and memo["verified"] is True
    if not memo["solved_again"]:  # the first solve proved its gap: the stored plan answers
        assert memo["plan"] == "recalled"
        assert p2.signatures == p1.signatures and p2.step_time_s == p1.step_time_s
    else:  # a loaded machine stopped the first solve short: it restarts from the stored plan
        assert (p2.solver or {})["objective"] <= (p1.solver or {})["objective"] + 1e-15
    # without the folder nothing is kept: a cold solve
    cold = run_cli(*args[:-2], "--out", "p3.json", cwd=tmp_path)
    assert cold.returncode == 0, cold.stderr
    assert (Plan.load(str(tmp_path / "p3.json")).solver or {})["stats"]["memo"]["key"] is None
