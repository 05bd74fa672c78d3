"""The job master's record of a storage outage: state, status fields, rate-limited log."""

from __future__ import annotations

import logging

import pytest

from epochstream.checkpoint.outage import StorageOutage, StorageState


def test_an_outage_opens_on_failure_and_closes_on_recovery() -> None:
    outage = StorageOutage("job-1234567")
    assert outage.status()["storage_state"] == "AVAILABLE"
    assert outage.status()["storage_message"] is None
    outage.failed("connection refused\ntraceback...", now=100.0)
    outage.failed("timed out", now=101.0)
    status = outage.status()
    assert outage.state is StorageState.UNAVAILABLE and outage.unavailable
    assert status["storage_unavailable_since"] == 100.0
    assert status["storage_last_error"] == "timed out"
    assert status["storage_failures"] == 2
    assert status["storage_message"].startswith("checkpoint storage unavailable, retrying (since ")
    assert "last error: timed out" in status["storage_message"]
    outage.recovered(now=110.0)
    assert outage.status() == {
        "storage_state": "AVAILABLE",
        "storage_unavailable_since": None,
        "storage_last_error": None,
        "storage_failures": 0,
        "storage_message": None,
    }


def test_the_log_says_so_once_per_interval_not_once_per_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="epochstream.checkpoint.outage")
    outage = StorageOutage("job-1", log_every=30.0)
    for second in range(0, 61):
        outage.failed("connection refused", now=1000.0 + second)
    lines = [r.getMessage() for r in caplog.records if "unavailable, retrying" in r.getMessage()]
    assert len(lines) == 3  # at 0, 30 and 60 s
    outage.recovered(now=1070.0)
    assert "available again after 70.0 s (61 failed operations)" in caplog.text


def test_recovering_without_an_outage_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    StorageOutage("job-1").recovered(now=1.0)
    assert caplog.text == ""
