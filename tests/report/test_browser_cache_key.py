"""The page and the command line share the plan cache (issue 24, item 9), in a real browser.

The explorer page fetches a bundled model's graph and posts it re-encoded by JavaScript
(``JSON.stringify`` writes ``1.0`` as ``1``: 2,623 numbers in mt5-base).  The same mt5-base
request then sent over HTTP as Python encodes it (what ``autopar submit`` and curl send) must
have the page's plan key and be a cache hit: the graph's content hash is canonical over numbers.

Needs ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium chromium-driver``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.report.test_browser import BROWSER_MARKS, chromium_driver, until, until_solved
from tests.service.helpers import live_server, make_settings

pytestmark = BROWSER_MARKS

TIME_LIMIT_S = 30
"""The page's default; the HTTP request sends the same (the time limit is part of the key)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    settings = make_settings(tmp_path_factory.mktemp("browser-key"), solver_workers=2)
    with live_server(settings) as s:
        yield s


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium_driver() as d:
        yield d


def _plan_on_the_page(driver: Any, url: str) -> str:
    """Plan mt5-base on 2x4, mesh 4,2, with the page's defaults; the plan key it shows."""
    driver.get(url + "/")
    until(
        driver,
        "the model list",
        lambda: driver.execute_script("return document.getElementById('model').length"),
    )
    driver.execute_script("document.getElementById('model').value = 'mt5-base'")
    assert driver.find_element("id", "time-limit").get_attribute("value") == str(TIME_LIMIT_S)
    assert driver.find_element("id", "cluster").get_attribute("value") == "2x4"
    assert driver.find_element("id", "mesh").get_attribute("value") == "4,2"
    driver.find_element("id", "plan-button").click()

    until_solved(driver, "the page's solve")
    summary = driver.find_element("id", "summary").text
    assert "plan for mt5-base" in summary  # item 10: the plan keeps the model's name
    return summary.rsplit("plan ", 1)[1].strip()


def test_the_page_and_http_get_one_plan_key(server: Any, driver: Any) -> None:
    from autopar.models import build

    page_key = _plan_on_the_page(driver, server.url)
    graph = build("mt5-base").to_dict()
    body = {
        "graph": graph,
        "cluster": "2x4",
        "preset": "a100-40g",
        "mesh_shape": [4, 2],
        "memory_budget_bytes": None,
        "zero_stage": 2,
        "options": {"time_limit_s": TIME_LIMIT_S},
    }
    text = json.dumps(body)
    assert '"alpha": 1.0' in text  # Python keeps the floats the page's JavaScript drops
    with server.client() as client:
        r = client.post("/v1/plans", content=text, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text[:500]  # a cache hit: solved once, by the page's request
    assert r.json()["key"] == page_key
    assert r.json()["graph"]["name"] == "mt5-base"
