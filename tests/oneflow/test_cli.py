"""The ``autopar oneflow`` commands register without OneFlow and import it lazily."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from autopar.cli.oneflow import add_oneflow_commands


def _parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="autopar")
    sub = parser.add_subparsers(dest="command", required=True)
    return parser, add_oneflow_commands(sub)


def test_commands_and_options():
    parser, handlers = _parser()
    assert set(handlers) == {"oneflow"}
    args = parser.parse_args(["oneflow", "import", "job.pb", "--out", "graph.json"])
    assert (args.command, args.oneflow_command, args.job, args.out) == (
        "oneflow",
        "import",
        "job.pb",
        "graph.json",
    )
    args = parser.parse_args(
        ["oneflow", "import-plan", "job.pb", "--out", "plan.json", "--cluster", "2x4", "--zero", "2"]
    )
    assert (args.oneflow_command, args.cluster, args.zero, args.no_evaluate) == (
        "import-plan",
        "2x4",
        2,
        False,
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["oneflow", "import", "job.pb"])  # --out is required


def test_importing_the_bridge_does_not_import_oneflow():
    code = (
        "import sys, autopar.bridges.oneflow, autopar.cli.oneflow, autopar.bridges.oneflow.apply, "
        "autopar.bridges.oneflow.plans, autopar.bridges.oneflow.importer, autopar.bridges.oneflow.planning\n"
        "from autopar.cli.main import build_parser\n"
        "parser, handlers = build_parser()\n"
        "assert 'oneflow' in handlers, sorted(handlers)\n"
        "print('oneflow' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_public_names_resolve_without_oneflow():
    import autopar.bridges.oneflow as bridge

    for name in bridge.__all__:
        assert getattr(bridge, name) is not None, name
    assert sorted(dir(bridge)) == sorted(bridge.__all__)
    with pytest.raises(AttributeError):
        _ = bridge.no_such_function
