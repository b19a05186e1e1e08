"""The explorer page in a real browser: headless Chromium from the distribution, driven by Selenium.

Needs ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium chromium-driver``);
nothing is downloaded at test time.  Set ``AUTOPAR_SCREENSHOTS=docs/img`` to keep the
screenshots (page during a solve, sweep chart, report) for the docs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.helpers import live_server, make_settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
BROWSER_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="needs the system Chromium and its driver: apt-get install -y chromium chromium-driver",
    ),
]
"""The marks of every test that drives the system Chromium (slow; skipped without it)."""
pytestmark = BROWSER_MARKS

API_KEY = "explorer-test-key"
WAIT_S = 900.0
"""Longest wait for a solve, a report or a sweep (generous: CI machines are shared)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Any]:
    settings = make_settings(tmp_path_factory.mktemp("browser"), api_keys=[API_KEY])
    with live_server(settings) as s:
        yield s


@contextlib.contextmanager
def chromium_driver() -> Iterator[Any]:
    """The system Chromium, headless, through its chromedriver (browser console logs kept)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1100"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium_driver() as d:
        yield d


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    target = os.environ.get("AUTOPAR_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def until(driver: Any, what: str, check: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` and the page status."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    status = driver.find_element("id", "status").text
    raise AssertionError(f"timed out waiting for {what}; page status: {status!r}")


def until_solved(driver: Any, what: str, timeout_s: float = 600) -> None:
    """Wait for the page's solve to succeed; fail at once, with the page's status, when it fails."""

    def done() -> bool:
        status = driver.find_element("id", "status")
        if "failed" in (status.get_attribute("class") or ""):
            raise AssertionError(f"the page's solve failed: {status.text}")
        return "succeeded" in (status.get_attribute("class") or "")

    until(driver, what, done, timeout_s=timeout_s)


def severe(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def svg_count(driver: Any, selector: str) -> int:
    return int(driver.execute_script(f"return document.querySelectorAll({selector!r}).length"))


def test_plan_progress_report_and_sweep(server, driver, shots: Path) -> None:
    by_id = "id"
    driver.get(server.url + "/")  # a fresh browser: no key stored
    # every /v1 route needs the key, the form's choices too: the page says so
    until(driver, "the 401 of the choices", lambda: "401" in driver.find_element(by_id, "status").text)
    assert "API key" in driver.find_element(by_id, "status").text
    # issue 34: before the solver's first plan the progress chart shows no empty axes (they
    # read -1 to 4), only what it waits for; K and the budget are as wide as their figures
    assert svg_count(driver, "#progress-chart .xtick") == 0
    assert "appear here as the solver finds them" in driver.find_element(by_id, "progress-chart").text
    for narrow, most_px in (("micro-batches", 80), ("budget", 110)):
        assert driver.find_element(by_id, narrow).size["width"] <= most_px, narrow
    driver.get_log("browser")  # the 401 is logged by the browser; start the console check afresh

    key = driver.find_element(by_id, "api-key")
    key.send_keys(API_KEY)
    driver.find_element(by_id, "cluster").click()  # blur: the key is stored, the choices load
    assert driver.execute_script("return localStorage.getItem('autopar.apiKey')") == API_KEY
    until(
        driver,
        "the model list",
        lambda: driver.execute_script("return document.getElementById('model').length"),
    )
    assert driver.find_element(by_id, "model").get_attribute("value") == "tiny-gpt"

    # without the key, the API refuses the write and the page says so
    driver.execute_script("document.getElementById('api-key').value = ''")
    driver.find_element(by_id, "plan-button").click()
    until(driver, "the 401", lambda: "401" in driver.find_element(by_id, "status").text)
    assert "X-API-Key" in driver.find_element(by_id, "status").text
    driver.get_log("browser")
    key.send_keys(API_KEY)
    driver.find_element(by_id, "cluster").click()
    driver.find_element(by_id, "time-limit").clear()
    driver.find_element(by_id, "time-limit").send_keys("15")
    k = driver.find_element(by_id, "micro-batches")  # the job's iteration: 2 micro-batches, recomputed
    k.clear()
    k.send_keys("2")
    driver.execute_script("document.getElementById('checkpointing').value = 'full'")
    driver.find_element(by_id, "plan-button").click()

    seen: set[str] = set()

    def finished() -> bool:
        status = driver.find_element(by_id, "status")
        state = status.text.split(" · ")[0]
        if state in ("queued", "running") and "shot" not in seen:
            driver.save_screenshot(str(shots / "explorer-solve.png"))  # the page during the solve
            seen.add("shot")
        seen.add(state)
        return "succeeded" in (status.get_attribute("class") or "")

    until(driver, "the solve to finish", finished)
    assert seen & {"queued", "running"}, f"no progress event was shown: {seen}"
    assert "MiB per device" in driver.find_element(by_id, "status").text  # a tiny plan: not "0.00 GiB"
    # the plan keeps the model's display name (issue 24, item 10)
    summary = driver.find_element(by_id, "summary").text
    assert "plan for tiny-gpt" in summary
    head = summary.splitlines()[0]
    assert "(K = 2 micro-batches of " in head and "checkpointing full)" in head, summary
    assert summary.startswith("iteration ") and "ms" in head
    assert svg_count(driver, "#progress-chart svg.main-svg") > 0
    assert svg_count(driver, "#progress-chart .xtick") > 0  # the axes came with the first point
    driver.save_screenshot(str(shots / "explorer-solved.png"))

    driver.find_element(by_id, "report-button").click()
    until(driver, "the report frame", lambda: driver.find_element(by_id, "report-section").is_displayed())
    frame = driver.find_element(by_id, "report-frame")
    driver.switch_to.frame(frame)
    try:
        until(driver, "the report's charts", lambda: svg_count(driver, ".js-plotly-plot svg.main-svg") >= 4)
        for chart in ("chart-step", "chart-comm", "chart-layers", "chart-memory"):
            assert svg_count(driver, f"#{chart} svg.main-svg") > 0, chart
        assert "Headline" in driver.find_element("tag name", "body").text
    finally:
        driver.switch_to.default_content()
    driver.execute_script("document.getElementById('report-section').scrollIntoView()")
    driver.save_screenshot(str(shots / "explorer-report.png"))

    # the report's own address, as "open in a new tab" gives it
    href = driver.find_element(by_id, "report-tab").get_attribute("href")
    driver.get(href)
    until(driver, "the report page's charts", lambda: svg_count(driver, ".js-plotly-plot svg.main-svg") >= 4)
    assert severe(driver) == []

    driver.get(server.url + "/")
    until(
        driver,
        "the model list",
        lambda: driver.execute_script("return document.getElementById('model').length"),
    )
    assert driver.find_element(by_id, "api-key").get_attribute("value") == API_KEY  # from localStorage
    driver.find_element(by_id, "time-limit").clear()
    driver.find_element(by_id, "time-limit").send_keys("15")
    meshes = driver.find_element(by_id, "sweep-meshes")
    meshes.clear()
    meshes.send_keys("4,2; 8,1; 2,4")
    zero = driver.find_element(by_id, "sweep-zero")
    zero.clear()
    zero.send_keys("0, 2")
    driver.find_element(by_id, "sweep-button").click()
    until(
        driver,
        "the sweep",
        lambda: (
            "6 of 6 points done" in driver.find_element(by_id, "sweep-status").text
            and "solving" not in driver.find_element(by_id, "sweep-status").text
        ),
    )
    assert svg_count(driver, "#sweep-chart svg.main-svg") > 0
    pareto_points = driver.execute_script(
        "const d = document.getElementById('sweep-chart').data; return d[1].x.length"
    )
    assert pareto_points >= 1
    table = driver.find_element(by_id, "sweep-table").text
    assert "Pareto" in table and "iteration" in table and "checkpointing" in table
    driver.execute_script("document.getElementById('sweep-section').scrollIntoView()")
    driver.save_screenshot(str(shots / "explorer-sweep.png"))

    # issue 34: a solved sweep row opens its plan and its report
    plan_link = driver.find_element("css selector", "#sweep-table button[data-open=plan]")
    point = plan_link.get_attribute("data-key")
    plan_link.click()
    until(
        driver,
        "the sweep point's plan",
        lambda: f"plan {point}" in driver.find_element(by_id, "summary").text,
    )
    assert driver.find_element(by_id, "status").text.startswith("sweep point · iteration ")
    driver.find_element("css selector", f"#sweep-table button[data-open=report][data-key='{point}']").click()
    until(
        driver,
        "the sweep point's report",
        lambda: driver.find_element(by_id, "report-section").is_displayed(),
    )
    assert point in (driver.find_element(by_id, "report-tab").get_attribute("href") or "")
    assert severe(driver) == []
