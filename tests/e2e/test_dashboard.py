"""The web dashboard in a real browser (Debian's chromium + chromedriver via Selenium).

A job runs on Spark local; the page must show its vertices, rates and checkpoints and
see them change, then a slot is SIGKILLed and the page must show the restart and the
exception, and finally the job's final state. A screenshot is saved in the test's
tmp dir, and to ``$EPOCHSTREAM_DASHBOARD_SCREENSHOT`` when set (docs/img/dashboard.png).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Throttle, is_python_process

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

N = 30_000  # about 10 s per attempt at the throttle's 1,500 records/s per subtask


def _keyed(record: tuple[int, int]) -> int:
    return record[0]


def _stamp(i: int) -> tuple[int, int]:
    # Event time two seconds behind the wall clock: the watermark lag chart has a line.
    return i % 5, time.time_ns() // 1_000_000 - 2_000


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0], b[1]


def _until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never showed {what}")
        time.sleep(0.25)


def _text(driver: Any, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return "\n".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, selector))


def test_dashboard_shows_a_running_job_its_crash_and_recovery(
    spark: Any, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.5, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(
        timedelta(milliseconds=500)
    ).with_timestamp_assigner(lambda record, ts: record[1])
    (
        env.from_sequence(0, N)
        .name("numbers")
        .map(Throttle(1_500))
        .name("throttle")
        .map(_stamp)
        .name("stamp")
        .assign_timestamps_and_watermarks(strategy)
        .name("timestamps")
        .key_by(_keyed)
        .reduce(_add)
        .name("latest")
        .sink_to(es.sinks.DiscardSink())
        .name("discard")
    )
    client = env.execute_async("dashboard-demo")
    try:
        client.wait_until_running(timeout=120)
        login = client.dashboard_url
        assert login is not None and "/dashboard/login?code=" in login
        assert client._master.endpoint.token not in login, "the token never goes into a URL"
        browser.get(login)
        # Signed in by the one-time code: redirected to the page, with a cookie that
        # scripts cannot read (HttpOnly) sent only to the API (Path=/v1/).
        assert browser.current_url.endswith("/dashboard/"), browser.current_url
        assert browser.execute_script("return document.cookie") == ""

        vertices = _until(
            "two vertices",
            lambda: (
                len(browser.find_elements(By.CSS_SELECTOR, "#graph g.vertex")) == 2
                and browser.find_elements(By.CSS_SELECTOR, "#graph g.vertex")
            ),
        )
        names = {
            v.find_element(By.CSS_SELECTOR, "title").get_attribute("textContent") for v in vertices
        }
        assert names == {"numbers -> throttle -> stamp -> timestamps", "latest -> discard"}
        assert _text(browser, "#state") == "RUNNING"

        def totals() -> list[int]:
            shown = _text(browser, "#graph text.rate")
            return [
                int(line.split("·")[1].split()[0].replace(",", "")) for line in shown.splitlines()
            ]

        _until(
            "records counted",
            lambda: "\u2013" not in _text(browser, "#graph text.rate") and min(totals()) > 0,
        )
        first_totals = totals()
        _until(
            "checkpoints",
            lambda: browser.find_elements(By.CSS_SELECTOR, "#checkpoints tr.checkpoint"),
        )
        first_checkpoint = _text(browser, "#ckpt-counts")
        _until(
            "rates changing",
            lambda: min(b - a for a, b in zip(first_totals, totals(), strict=True)) > 0,
        )
        _until("more checkpoints", lambda: _text(browser, "#ckpt-counts") != first_checkpoint)
        assert "records/s" in _text(browser, "#graph text.rate")
        _until("a watermark lag", lambda: _text(browser, "#lag").endswith(" s"))

        # Expand a checkpoint: its per-task rows appear (2 vertices x 2 subtasks).
        browser.find_element(By.CSS_SELECTOR, "#checkpoints tr.checkpoint").click()
        rows = _until(
            "per-task rows",
            lambda: browser.find_elements(By.CSS_SELECTOR, "#checkpoints tr.tasks tbody tr"),
        )
        assert len(rows) == 4
        # Whether each task's snapshot overtook in-flight records (this job is aligned).
        assert all(r.find_elements(By.TAG_NAME, "td")[-1].text == "aligned" for r in rows)
        assert "in flight" in _text(browser, "#checkpoints thead")

        assert not client.done, "the job finished before the crash: raise N"
        pid = client.slot_pids()[0]
        assert pid != os.getpid() and is_python_process(pid)
        os.kill(pid, signal.SIGKILL)
        _until("the restart", lambda: _text(browser, "#restarts") == "1", timeout=120)
        _until("the exception", lambda: "attempt 1 failed" in _text(browser, "#exceptions"))
        assert "lost its control connection" in _text(browser, "#exceptions summary")

        result = client.result(timeout=240)
        assert result.restarts == 1
        _until("the final state", lambda: _text(browser, "#state") == "FINISHED", timeout=30)
        assert "final state" in _text(browser, "#notice")
        assert _text(browser, "#restarts") == "1"
        browser.execute_script("window.scrollTo(0, 0)")
        shot = tmp_path / "dashboard.png"
        height = browser.execute_script("return document.body.scrollHeight")
        browser.set_window_size(1400, max(int(height) + 120, 900))
        time.sleep(0.5)
        assert browser.save_screenshot(str(shot))
        target = os.environ.get("EPOCHSTREAM_DASHBOARD_SCREENSHOT")
        if target:
            shutil.copyfile(shot, target)

        # The code was good once; a browser without the cookie is asked to sign in.
        browser.get(login)
        assert "used up or expired" in browser.find_element(By.TAG_NAME, "body").text
        base = login.split("/dashboard/", 1)[0]
        browser.get(base + "/v1/job")  # the cookie's path: where WebDriver can delete it
        assert '"FINISHED"' in browser.find_element(By.TAG_NAME, "body").text
        browser.delete_all_cookies()
        browser.get(base + "/dashboard/")
        _until("the sign-in notice", lambda: "Not signed in" in _text(browser, "#notice"))
    finally:
        if not client.done:
            client.cancel()
