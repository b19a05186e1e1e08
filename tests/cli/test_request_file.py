"""``autopar plan --request req.toml`` (issue 43): the fields of ``POST /v1/plans`` in a file, the
command line's options over the file's, one error line for a key it does not know."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from autopar.errors import ConfigError
from autopar_solver import request_file
from tests.cli.helpers import assert_user_error, run_cli

REQUEST = """\
graph = "tiny-gpt"
cluster = "1x2"
preset = "a100-40g"
mesh_shape = [2]
memory_budget_bytes = 42949672960
zero_stage = 1

[options]
time_limit_s = 30
relative_gap = 0.0
micro_batches = 2
checkpointing = "off"
"""

FLAGS = (
    "tiny-gpt", "--cluster", "1x2", "--preset", "a100-40g", "--mesh-shape", "2", "--memory", "40GiB",
    "--zero", "2", "--time-limit", "30", "--gap", "0", "--micro-batches", "2", "--checkpointing", "off",
)  # fmt: skip


def test_a_request_file_plans_what_the_same_flags_plan(tmp_path: Path) -> None:
    (tmp_path / "req.toml").write_text(REQUEST)
    common = ("--workers", "1", "--no-progress")
    by_flags = run_cli("plan", *FLAGS, *common, "--out", "flags.json", cwd=tmp_path)
    assert by_flags.returncode == 0, by_flags.stderr
    # --zero 2 on the command line overrides the file's zero_stage = 1
    by_file = run_cli(
        "plan", "--request", "req.toml", "--zero", "2", *common, "--out", "file.json", cwd=tmp_path
    )
    assert by_file.returncode == 0, by_file.stderr
    flags, file = (json.loads((tmp_path / f).read_text()) for f in ("flags.json", "file.json"))
    for key in (
        "graph",
        "mesh",
        "zero_stage",
        "runtime",
        "micro_batches",
        "checkpointing",
        "memory_budget_bytes",
    ):
        assert flags[key] == file[key], key
    assert file["zero_stage"] == 2 and file["micro_batches"] == 2 and file["mesh"]["shape"] == [2]
    # solved to optimality (gap 0): the same plan
    assert flags["solver"]["gap"] == file["solver"]["gap"] == 0
    assert flags["ops"] == file["ops"]
    assert flags["predicted"]["iteration_time_s"] == file["predicted"]["iteration_time_s"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('graph = "tiny-gpt"\nzero = 2\n', ["unknown key 'zero'", "zero_stage", "options"]),
        (
            'graph = "tiny-gpt"\n[options]\ntime_limit = 5\n',
            ["'options.time_limit'", "did you mean 'time_limit_s'"],
        ),
        ('graph = "tiny-gpt"\nzero_stage = "2"\n', ["zero_stage must be an integer from 0 to 3, got '2'"]),
        ('graph = "tiny-gpt"\nmemory = "1GiB"\nmemory_budget_bytes = 1\n', ["memory or memory_budget_bytes"]),
        ("graph = \n", ["is not TOML"]),
    ],
)
def test_a_bad_request_file_is_one_error_line(tmp_path: Path, text: str, words: list[str]) -> None:
    (tmp_path / "req.toml").write_text(text)
    message = assert_user_error(
        run_cli("plan", "--request", "req.toml", "--out", "p.json", cwd=tmp_path), "bad_request_file"
    )
    for word in words:
        assert word in message, message
    assert not (tmp_path / "p.json").exists()


def test_plan_without_a_graph_says_how_to_give_one(tmp_path: Path) -> None:
    message = assert_user_error(run_cli("plan", "--out", "p.json", cwd=tmp_path), "missing_graph")
    assert "GRAPH" in message and "--request" in message


def test_a_graph_path_is_relative_to_the_request_file(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "g.json").write_text("{}")
    (tmp_path / "jobs" / "req.toml").write_text('graph = "g.json"\n[options]\nstages = "auto"\n')
    values = request_file.read_request_file(str(tmp_path / "jobs" / "req.toml"))
    assert values["graph"] == str(tmp_path / "jobs" / "g.json") and values["stages"] == "auto"


def test_without_a_toml_reader_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def no_toml(name: str, *args: object) -> object:
        if name in ("tomllib", "tomli"):
            raise ModuleNotFoundError(name)
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(request_file.importlib, "import_module", no_toml)
    with pytest.raises(ConfigError, match=r"pip install tomli") as err:
        request_file._toml_loads()
    assert err.value.code == "missing_toml"
