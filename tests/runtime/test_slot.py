"""The slot's report of a broken input channel, with an injected control connection."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from epochstream.runtime.network import ChannelHello
from epochstream.runtime.slot import _Slot


def _slot(send: Any) -> Any:
    edge = SimpleNamespace(edge_id=3, source_chain="numbers", target_chain="counts")
    return SimpleNamespace(
        _stop=threading.Event(), graph=SimpleNamespace(edges=[edge]), index=1, send=send
    )


def test_a_broken_input_channel_is_reported_to_the_job_master() -> None:
    sent: list[Any] = []
    _Slot._broken(_slot(sent.append), ChannelHello(3, 0, 1), ConnectionError("closed"))
    (failure,) = sent
    assert failure.task == ("counts", 1) and failure.secondary
    assert "input channel from numbers subtask 0 broke" in failure.description


def test_after_the_control_connection_closed_it_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stopping with a savepoint printed the data thread's BrokenPipeError traceback."""

    def closed(msg: Any) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with caplog.at_level(logging.INFO, logger="epochstream.runtime.slot"):
        _Slot._broken(_slot(closed), ChannelHello(3, 0, 1), ConnectionError("closed"))
    assert "input channel from numbers subtask 0 broke" in caplog.text
    assert "after the control connection closed" in caplog.text


def test_nothing_is_reported_once_the_slot_stops() -> None:
    slot = _slot(lambda msg: pytest.fail("reported while stopping"))
    slot._stop.set()
    _Slot._broken(slot, ChannelHello(3, 0, 1), ConnectionError("closed"))
