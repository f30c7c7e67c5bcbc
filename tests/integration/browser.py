"""Headless Chromium for the tests that read seam's pages in a real browser (selenium + chromedriver)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.integration.kafka_helpers import program_missing

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"


def _binaries() -> tuple[str, str] | None:
    browser = next((path for path in map(shutil.which, CHROMIUM) if path), None)
    driver = shutil.which(DRIVER)
    return (browser, driver) if browser and driver else None


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium under chromedriver; where there is none the test skips, or fails in CI, saying why.

    ``make test`` installs Debian's ``chromium`` and ``chromium-driver`` when they are missing and it
    can (``scripts/system_tools.sh``).
    """
    found = _binaries()
    if found is None:
        program_missing("no Chromium with chromedriver here (Debian: apt-get install chromium chromium-driver; "
                        "make test installs them where it can)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--disable-extensions", "--no-first-run", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
