"""Hooks for the whole suite (the main one and the OneFlow one, ``tests/oneflow``).

A test that needs an outside tool skips where the tool is missing.  Under ``CI`` (``CI=true``,
as CI services set it, and ``.ci/run`` exports it) such a skip is a failure instead: a failed
install must not pass as a green run with fewer tests.  Locally the skip's reason says how to
install the tool.  A skip is recognised by its reason (the tests' own words, below); other
skips (e.g. a test that does not apply on this platform) stay skips.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Tool:
    """An outside tool some tests need."""

    name: str
    reasons: tuple[str, ...]
    """Words (lower case) one of which every skip for want of the tool has in its reason."""
    install: str


TOOLS = (
    Tool("redis-server", ("redis-server",), "apt-get install -y redis-server"),
    Tool(
        "Chromium and chromedriver",
        ("chromium", "chromedriver"),
        "apt-get install -y chromium chromium-driver",
    ),
    Tool(
        "the OneFlow venv (.venv-oneflow, OneFlow 0.9)",
        (".venv-oneflow", "oneflow venv", "import 'oneflow'"),
        "bash scripts/oneflow-env.sh",
    ),
)


def in_ci() -> bool:
    """``CI`` is set to a true value (``true``, ``1``, ``yes``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_tool(reason: str) -> Tool | None:
    """The tool whose absence a skip's ``reason`` reports, if any."""
    lowered = reason.lower()
    for tool in TOOLS:
        if any(word in lowered for word in tool.reasons):
            return tool
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``redis`` (it starts its own ``redis-server``) skips where there is none."""
    if item.get_closest_marker("redis") is not None and shutil.which("redis-server") is None:
        pytest.skip("redis-server binary not installed (apt-get install -y redis-server)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or not isinstance(report.longrepr, tuple) or hasattr(report, "wasxfail"):
        return
    path, lineno, reason = report.longrepr
    tool = missing_tool(str(reason))
    if tool is None:
        return
    if in_ci():
        report.outcome = "failed"
        report.longrepr = (
            f"CI is set and {tool.name} is missing, so this test would have been skipped: {reason}\n"
            f"CI must run every test: install it ({tool.install}) or fix the install step of .ci/run"
        )
    elif tool.install not in str(reason):
        report.longrepr = (path, lineno, f"{reason} (to run it: {tool.install})")
