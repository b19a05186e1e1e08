"""Every user error is one ``autopar: error: [code] ...`` line on stderr with exit status 2."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from autopar.cli.main import main
from tests.cli.helpers import assert_user_error, run_cli

MESH = ("--cluster", "1x2", "--mesh-shape", "2")


@pytest.mark.parametrize(
    ("args", "graph"),
    [
        (("plan", "no-such-graph.json", "--out", "plan.json"), "no-such-graph.json"),
        (("baseline", "megatron", "graphs/g.json", "--out", "plan.json"), "graphs/g.json"),
        (("costs", "missing.json"), "missing.json"),
        (("evaluate", "missing.json", "plan.json"), "missing.json"),
    ],
)
def test_missing_graph_file(tmp_path: Path, args: tuple[str, ...], graph: str) -> None:
    message = assert_user_error(run_cli(*args, cwd=tmp_path), "missing_file")
    assert message == f"graph file {graph!r} does not exist"


def test_missing_plan_file(tmp_path: Path) -> None:
    message = assert_user_error(run_cli("evaluate", "tiny-gpt", "nope.json", cwd=tmp_path), "missing_file")
    assert message == "plan file 'nope.json' does not exist"


def test_graph_file_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text("{not json")
    assert_user_error(
        run_cli("baseline", "megatron", "g.json", *MESH, "--out", "p.json", cwd=tmp_path), "bad_json"
    )


def test_graph_argument_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "graphs").mkdir()
    message = assert_user_error(run_cli("costs", "graphs", cwd=tmp_path), "unreadable_file")
    assert "is a directory" in message


def test_near_miss_model_name(tmp_path: Path) -> None:
    message = assert_user_error(run_cli("plan", "mt5-bas", "--out", "p.json", cwd=tmp_path), "bad_graph_arg")
    assert "did you mean 'mt5-base'?" in message and "tiny-gpt" in message


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (("model", "tiny-gtp", "--out", "g.json"), "tiny-gpt"),
        (("baseline", "megatorn", "tiny-gpt", "--out", "p.json"), "megatron"),
        (("evalute", "g.json", "p.json"), "evaluate"),
        # issue 34: a model of the same family, not the nearest spelling (bert-large)
        (("model", "mt5-large", "--out", "g.json"), "mt5-base"),
        (("model", "gpt-tiny", "--out", "g.json"), "tiny-gpt"),
    ],
)
def test_near_miss_choice(tmp_path: Path, args: tuple[str, ...], suggestion: str) -> None:
    message = assert_user_error(run_cli(*args, cwd=tmp_path), "bad_args")
    assert f"did you mean {suggestion!r}?" in message


def test_a_graph_of_another_size_suggests_its_family(tmp_path: Path) -> None:
    message = assert_user_error(run_cli("plan", "t5-large", "--out", "p.json", cwd=tmp_path), "bad_graph_arg")
    assert "did you mean 't5-base'?" in message


def test_submit_help_gives_each_training_default_its_own_value(tmp_path: Path) -> None:
    """Issue 34: ``--checkpointing`` said "(default: 1; ...)", the text of ``--micro-batches``."""
    result = run_cli("submit", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "gradient accumulation; default: 1)" in text
    assert "(default: the server's, auto)" in text and "default: 1; " not in text


def test_missing_required_argument(tmp_path: Path) -> None:
    message = assert_user_error(run_cli("plan", "tiny-gpt", cwd=tmp_path), "bad_args")
    assert "--out" in message and "autopar plan --help" in message


@pytest.mark.parametrize(
    ("out", "reason"),
    [("no-such-folder/plan.json", "its folder does not exist"), (".", "is a directory")],
)
def test_unwritable_out_is_refused_before_solving(tmp_path: Path, out: str, reason: str) -> None:
    # the one stderr line also shows the solver never started: it reports progress on stderr
    result = run_cli("plan", "tiny-gpt", *MESH, "--time-limit", "60", "--out", out, cwd=tmp_path)
    assert reason in assert_user_error(result, "unwritable_out")


def test_unwritable_out_of_baseline(tmp_path: Path) -> None:
    result = run_cli("baseline", "megatron", "tiny-gpt", *MESH, "--out", "nowhere/p.json", cwd=tmp_path)
    assert_user_error(result, "unwritable_out")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    ("memory", "expected"),
    [("40", "'40' has no unit"), ("40G", "'40G' has unknown unit 'G'"), ("lots", "'lots' is not")],
)
def test_memory_needs_an_exact_unit(tmp_path: Path, memory: str, expected: str) -> None:
    result = run_cli("plan", "tiny-gpt", *MESH, "--memory", memory, "--out", "p.json", cwd=tmp_path)
    message = assert_user_error(result, "bad_memory")
    assert expected in message and "GiB" in message and "GB" in message
    assert not (tmp_path / "p.json").exists()


def _hide_distribution(monkeypatch, hidden: str) -> None:
    """Make the installed metadata say ``hidden`` is not installed."""
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name.lower() == hidden:
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_missing_extra_names_the_install_command(monkeypatch, capsys) -> None:
    """A command whose extra is not installed stays listed and says how to install it."""
    _hide_distribution(monkeypatch, "ortools")
    assert main(["plan", "tiny-gpt", "--out", "never-written.json"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "autopar: error: [missing_extra] 'plan' needs autopar[solver]: pip install 'autopar[solver]' "
        "(not installed: ortools)\n"
    )


def test_submit_serve_without_the_service_extra(monkeypatch, capsys, tmp_path: Path) -> None:
    _hide_distribution(monkeypatch, "fastapi")
    assert main(["submit", "tiny-gpt", "--serve", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autopar: error: [missing_extra] 'submit --serve' needs autopar[service]: ")
    assert err.count("\n") == 1


def test_invalid_graph_content_is_one_line(tmp_path: Path) -> None:
    graph = {"format": "autopar.graph/v1", "name": "g", "tensors": {}, "ops": [], "meta": "hello"}
    (tmp_path / "g.json").write_text(json.dumps(graph))
    message = assert_user_error(run_cli("costs", "g.json", cwd=tmp_path), "bad_format")
    assert "meta" in message
