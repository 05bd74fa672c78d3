"""Fixtures of the end-to-end suite: one shared SparkSession and user code shipped by value.

Every test here is an acceptance test through the public API (``import epochstream as es``),
marked ``slow``; the ones that need Spark are also marked ``spark``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

JOBS_DIR = Path(__file__).parent / "jobs"
# The job scripts in jobs/ run as subprocesses with their folder on sys.path; the tests
# import the same helpers in-process, so the folder must be importable here too.
if str(JOBS_DIR) not in sys.path:
    sys.path.insert(0, str(JOBS_DIR))

import e2e_support  # noqa: E402 - needs JOBS_DIR on sys.path


@pytest.fixture(autouse=True)
def _ship_test_code_by_value(request: pytest.FixtureRequest) -> None:
    """Pickle the test module's functions and classes by value, as for a user's ``__main__``.

    Slots import by-reference functions by module name; pytest's importlib mode gives
    test modules names that a slot process cannot import.
    """
    for module in (request.module, e2e_support):
        cloudpickle.register_pickle_by_value(module)


@pytest.fixture
def failure_markers(tmp_path: Path) -> str:
    """A fresh ``marker_dir`` for ``es.testing.FailOnce``, inside the test's tmp_path."""
    path = tmp_path / "failonce-markers"
    path.mkdir()
    return str(path)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[3] SparkSession for the whole session (starting one takes seconds); three
    task slots, so jobs can be rescaled from 2 to 3 slots on it."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from epochstream.deploy.spark import create_session

    session = create_session("local[3]", app_name="epochstream-e2e")
    try:
        yield session
    finally:
        session.stop()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium driven by Selenium (the dashboard tests); skips without one."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
