"""Slot logs forwarded to the job master (fake sender), and logged there with slot and attempt."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from epochstream.runtime.slotlogs import ForwardLogs, SlotLog, log_slot_record


def test_records_at_or_above_the_level_are_forwarded_while_installed() -> None:
    sent: list[Any] = []
    user = logging.getLogger("userjob.forward-test")
    with ForwardLogs(sent.append, slot=1, attempt=3, level=logging.WARNING):
        user.info("too quiet")
        user.warning("disk %s is slow", "sda")
        try:
            raise ValueError("bad record")
        except ValueError:
            user.exception("map failed")
    user.warning("after the slot ended")
    assert [(m.slot, m.attempt, m.level, m.logger) for m in sent] == [
        (1, 3, logging.WARNING, "userjob.forward-test"),
        (1, 3, logging.ERROR, "userjob.forward-test"),
    ]
    assert sent[0].message == "disk sda is slow"
    assert sent[1].message.startswith("map failed\nTraceback")
    assert "ValueError: bad record" in sent[1].message
    assert not any(isinstance(h, ForwardLogs) for h in logging.getLogger().handlers)


def test_the_root_level_is_lowered_for_the_slot_and_restored() -> None:
    root = logging.getLogger()
    before = root.level
    sent: list[Any] = []
    with ForwardLogs(sent.append, slot=0, attempt=1, level=logging.DEBUG):
        assert root.level == logging.DEBUG
        logging.getLogger("userjob.debug-test").debug("fine detail")
    assert root.level == before
    assert [m.message for m in sent] == ["fine detail"]


def test_a_record_logged_while_sending_does_not_recurse() -> None:
    sent: list[Any] = []

    def send(msg: Any) -> None:
        logging.getLogger("epochstream.runtime.auth").warning("send is slow")
        sent.append(msg)

    with ForwardLogs(send, slot=0, attempt=1, level=logging.WARNING):
        logging.getLogger("userjob.recursion-test").warning("once")
    assert [m.message for m in sent] == ["once"]


def test_the_job_master_logs_with_slot_and_attempt(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="epochstream.slots")
    log_slot_record(SlotLog(2, 5, logging.ERROR, "epochstream.runtime.task", "sum (3/4) failed"))
    [record] = [r for r in caplog.records if r.name == "epochstream.slots"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "[slot 2 attempt 5] epochstream.runtime.task: sum (3/4) failed"


def test_a_record_the_job_master_can_no_longer_take_goes_to_stderr_as_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def gone(msg: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    logger = logging.getLogger("epochstream.test.gone")
    with ForwardLogs(gone, slot=1, attempt=2, level=logging.WARNING):
        logger.warning("cannot report the failure")
    err = capsys.readouterr().err
    assert "[slot 1 attempt 2] WARNING epochstream.test.gone: cannot report the failure" in err
    assert "job master connection lost" in err and "Traceback" not in err
