"""Issue 43: every string the explorer page writes into the DOM is text, never HTML.

The sweep table wrote ``r.error`` into ``innerHTML``: an error quoting a client's input could
run script in the page of whoever looked at the sweep.  The page now builds its tables from
DOM nodes; here a sweep view and a pipeline record whose strings are markup are drawn in the
real page (headless Chromium) and must show as text, run nothing, and add no element.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.report.test_browser import BROWSER_MARKS, chromium_driver, severe, until
from tests.service.helpers import live_server, make_settings

pytestmark = BROWSER_MARKS

STATIC = Path(__file__).resolve().parents[2] / "service" / "static"
API_KEY = "escaping-test-key"
HOSTILE = '<img src=x onerror="window.__pwned = 1"><b id="injected">bold</b>'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    settings = make_settings(tmp_path_factory.mktemp("browser-escaping"), api_keys=[API_KEY])
    with live_server(settings) as s:
        yield s


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium_driver() as d:
        yield d


def _count(driver: Any, selector: str) -> int:
    return int(driver.execute_script(f"return document.querySelectorAll({selector!r}).length"))


def test_the_page_has_no_html_sinks() -> None:
    """No ``innerHTML``, ``outerHTML``, ``insertAdjacentHTML`` or ``document.write`` in the page's
    script: tables are built from nodes whose text is set as text."""
    script = (STATIC / "app.js").read_text()
    assert re.findall(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", script) == []


def _open(server: Any, driver: Any) -> None:
    driver.get(server.url + "/")
    driver.execute_script(f"localStorage.setItem('autopar.apiKey', {API_KEY!r})")
    driver.get(server.url + "/")
    until(
        driver,
        "the model list",
        lambda: driver.execute_script("return document.getElementById('model').length"),
    )


def test_a_sweep_error_with_markup_shows_as_text(server: Any, driver: Any) -> None:
    _open(server, driver)
    row = {
        "mesh_shape": [2],
        "memory_budget_bytes": 2**30,
        "zero_stage": 2,
        "micro_batches": 1,
        "checkpointing": HOSTILE,
        "key": "k'\"><script>window.__pwned = 2</script>",
        "status": "failed",
        "iteration_time_s": None,
        "step_time_s": None,
        "memory_per_device_bytes": None,
        "chosen_mesh_shape": None,
        "error": HOSTILE,
    }
    done = dict(row, status="succeeded", error=None, iteration_time_s=0.01, memory_per_device_bytes=2**29)
    driver.execute_script("drawSweep(arguments[0])", {"rows": [row, done], "complete": True})
    table = driver.find_element("id", "sweep-table")
    assert f"failed: {HOSTILE}" in table.text
    assert (
        driver.execute_script(
            "return document.querySelectorAll('#sweep-table img, #injected, #sweep-table script').length"
        )
        == 0
    )
    button = table.find_element("css selector", "button[data-open=plan]")
    assert button.get_attribute("data-key") == row["key"]  # an attribute value, not markup
    assert driver.execute_script("return window.__pwned === undefined")
    assert [m for m in severe(driver) if "401 (Unauthorized)" not in m] == []  # the first load, keyless


def test_a_stage_row_with_markup_shows_as_text(server: Any, driver: Any) -> None:
    _open(server, driver)
    stage = {
        "stage": HOSTILE,
        "blocks": 1,
        "first_block": HOSTILE,
        "last_block": HOSTILE,
        "devices": 4,
        "mesh_shape": [2, 2],
        "micro_batch_time_s": 0.001,
        "receive_time_s": 0.0,
        "memory_per_device_bytes": 2**20,
        "in_flight": 1,
    }
    record = {
        "stages": [stage],
        "iteration_time_s": 0.01,
        "bubble_fraction": 0.1,
        "memory_per_device_bytes": 1,
    }
    driver.execute_script("showStages(arguments[0])", record)
    table = driver.find_element("id", "stages-table")
    assert table.is_displayed() and HOSTILE in table.text
    assert (
        driver.execute_script("return document.querySelectorAll('#stages-table img, #injected').length") == 0
    )
    assert driver.execute_script("return window.__pwned === undefined")
