"""A pipeline plan on the explorer page, in a real browser (issue 36: the page shows the stages).

tiny-gpt on 1x8 as 2 stages of [2, 2] (K = 4, every block recomputed), asked for with the
page's stages control; the page shows the bubble and the iteration in its headline and one
row per stage; the plan's report (in the page's frame) has the same stages table.  Set
``AUTOPAR_SCREENSHOTS=docs/img`` to keep ``explorer-stages.png`` for docs/explorer.md.

Needs ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium chromium-driver``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.report.test_browser import BROWSER_MARKS, chromium_driver, severe, svg_count, until, until_solved
from tests.service.helpers import live_server, make_settings

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with live_server(make_settings(tmp_path_factory.mktemp("browser-stages"))) as s:
        yield s


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium_driver() as d:
        yield d


def _type(driver: Any, element_id: str, text: str) -> None:
    field = driver.find_element("id", element_id)
    field.clear()
    field.send_keys(text)


def _stage_rows(driver: Any) -> list[list[str]]:
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('#stages-table tr')].slice(1)"
            ".map(tr => [...tr.cells].map(td => td.textContent))"
        )
    )


def test_the_page_shows_a_two_stage_plan(server: Any, driver: Any, tmp_path: Path) -> None:
    driver.get(server.url + "/")
    until(
        driver,
        "the model list",
        lambda: driver.execute_script("return document.getElementById('model').length"),
    )
    options = driver.execute_script("return [...document.getElementById('stages').options].map(o => o.value)")
    assert options == ["1", "2", "4", "8", "auto"]
    assert driver.execute_script("return document.getElementById('stages').value") == "auto"  # the default
    assert not driver.find_element("id", "stages-table").is_displayed()  # no plan yet: no table
    _type(driver, "cluster", "1x8")
    _type(driver, "mesh", "2,2")
    _type(driver, "micro-batches", "4")
    driver.execute_script(
        "document.getElementById('checkpointing').value = 'full';"
        "document.getElementById('stages').value = '2';"
    )
    driver.find_element("id", "plan-button").click()

    until_solved(driver, "the 2-stage solve")
    status = driver.find_element("id", "status").text
    assert "in 2 stages, bubble " in status and "iteration " in status, status
    headline = driver.find_element("id", "pipeline-headline")
    assert headline.is_displayed()
    assert headline.text.startswith("2 pipeline stages (1F1B): iteration ") and "bubble" in headline.text
    table = driver.find_element("id", "stages-table")
    assert table.is_displayed()
    head = table.find_element("css selector", "tr").text
    for column in ("stage", "blocks", "devices", "mesh", "ms / micro-batch", "receives", "memory / device"):
        assert column in head, column
    assert "in flight" in head
    rows = _stage_rows(driver)
    assert [r[0] for r in rows] == ["0", "1"]
    assert [r[1] for r in rows] == ["1: layers.0", "1: layers.1"]
    assert [r[2:4] for r in rows] == [["4", "[2, 2]"]] * 2
    assert all(r[4].endswith(" ms") and r[6].endswith("iB") for r in rows)
    assert [r[7] for r in rows] == ["2", "1"]  # micro-batches in flight: min(S - s, K)
    assert "pipeline plan for tiny-gpt" in driver.find_element("id", "summary").text
    title = driver.execute_script("return document.getElementById('progress-chart').layout.title.text")
    assert title == "Solver progress, stage by stage"  # the stages' solves, one after the other
    driver.execute_script("document.getElementById('progress-section').scrollIntoView()")
    shots = Path(os.environ.get("AUTOPAR_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(shots / "explorer-stages.png"))

    # the report: the same stages, in the page's frame
    driver.find_element("id", "report-button").click()
    until(driver, "the report frame", lambda: driver.find_element("id", "report-section").is_displayed())
    driver.switch_to.frame(driver.find_element("id", "report-frame"))
    try:
        until(driver, "the report's charts", lambda: svg_count(driver, ".js-plotly-plot svg.main-svg") >= 4)
        assert "2 pipeline stages" in driver.find_element("tag name", "body").text
        cells = driver.execute_script(
            "return [...document.querySelectorAll('#stages-table tbody tr')]"
            ".map(tr => [...tr.cells].map(td => td.textContent))"
        )
        assert [c[1] for c in cells] == ["1: layers.0", "1: layers.1"]
        assert [c[-1] for c in cells] == ["2", "1"]
    finally:
        driver.switch_to.default_content()

    # back to one stage: the stages table goes away with the next plan
    driver.execute_script("document.getElementById('stages').value = '1'")
    _type(driver, "mesh", "4,2")
    _type(driver, "micro-batches", "1")
    driver.find_element("id", "plan-button").click()
    until_solved(driver, "the one-stage solve")
    assert not driver.find_element("id", "stages-table").is_displayed()
    assert not driver.find_element("id", "pipeline-headline").is_displayed()
    assert severe(driver) == []


def _search_rows(driver: Any) -> list[list[str]]:
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('#stage-search-table tr')].slice(1)"
            ".map(tr => [...tr.cells].map(td => td.textContent))"
        )
    )


def test_the_page_shows_every_number_of_stages_auto_tried(server: Any, driver: Any, tmp_path: Path) -> None:
    """Issue 43: ``--stages auto`` (the page's default) on two nodes shows a row per number of
    stages, with its iteration or why it has none, whichever plan it keeps."""
    driver.get(server.url + "/")
    until(
        driver,
        "the model list",
        lambda: driver.execute_script("return document.getElementById('model').length"),
    )
    _type(driver, "cluster", "2x2")
    _type(driver, "mesh", "")
    _type(driver, "micro-batches", "4")
    _type(driver, "time-limit", "40")
    driver.find_element("id", "plan-button").click()
    until_solved(driver, "the stage search")
    assert driver.find_element("id", "stage-search-table").is_displayed()
    rows = _search_rows(driver)
    assert [r[0] for r in rows] == ["1", "2"]  # tiny-gpt's 2 blocks: at most 2 stages
    for r in rows:
        assert r[2].endswith(" ms") or r[8], r  # an iteration, or why there is none
    assert "stage search" in driver.find_element("id", "summary").text
    shots = Path(os.environ.get("AUTOPAR_SCREENSHOTS") or tmp_path)
    driver.execute_script("document.getElementById('stage-search-table').scrollIntoView()")
    driver.save_screenshot(str(shots / "explorer-stage-search.png"))
    assert severe(driver) == []
