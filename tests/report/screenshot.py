"""Screenshot a page (a report file or a URL) with the system's headless Chromium.

::

    .venv/bin/python -m tests.report.screenshot report.html docs/img/report-mt5-base.png [--anchor memory]

Waits until every Plotly chart on the page has drawn its SVG.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


def screenshot(
    target: str, out: str, width: int = 1500, height: int = 2400, anchor: str = "", timeout_s: float = 300
) -> int:
    """Save a PNG of ``target``; return the number of charts drawn."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
    try:
        url = target if "://" in target else Path(target).resolve().as_uri()
        driver.get(url + (f"#{anchor}" if anchor else ""))
        deadline = time.monotonic() + timeout_s
        script = (
            "const p = document.querySelectorAll('.js-plotly-plot');"
            "return [p.length, document.querySelectorAll('.js-plotly-plot svg.main-svg').length > 0"
            " ? [...p].filter(e => e.querySelector('svg.main-svg')).length : 0]"
        )
        while True:
            total, drawn = driver.execute_script(script)
            if (total and drawn == total) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if anchor:
            driver.execute_script(f"document.getElementById({anchor!r}).scrollIntoView()")
        driver.save_screenshot(out)
        return int(drawn)
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="HTML file or URL")
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("--height", type=int, default=2400)
    parser.add_argument("--anchor", default="", help="scroll to this element id first (e.g. memory)")
    args = parser.parse_args()
    drawn = screenshot(args.target, args.out, args.width, args.height, args.anchor)
    print(f"{args.out}: {drawn} charts drawn")


if __name__ == "__main__":
    main()
