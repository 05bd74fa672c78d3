"""The job master's waits outside the attempt loop, driven through a real queue with
fake connections and requests."""

from __future__ import annotations

import queue
from typing import Any

import pytest

from epochstream.core.clock import SystemClock
from epochstream.deploy.failures import Failure
from epochstream.deploy.inbox import Inbox
from epochstream.exceptions import JobCancelled
from epochstream.runtime.messages import CancelSlot, RegisterSlot, SlotClosed, TaskFailed


class FakeConn:
    def __init__(self, slot: int, attempt: int) -> None:
        self.slot, self.attempt, self.pid = slot, attempt, 1000 + slot


class FakeRequest:
    def __init__(self) -> None:
        self.failed: str | None = None

    def fail(self, reason: str) -> None:
        self.failed = reason


class FakeMetrics:
    def __init__(self) -> None:
        self.samples: list[Any] = []

    def record(self, samples: Any, *, wall: float) -> None:
        self.samples.append(samples)


def _inbox() -> Inbox:
    return Inbox(queue.Queue(), SystemClock(), "job-1", FakeMetrics())  # type: ignore[arg-type]


def test_root_cause_prefers_the_primary_failure_that_follows_a_symptom() -> None:
    inbox = _inbox()
    symptom = Failure("input channel broke")
    inbox.events.put(("message", FakeConn(1, 3), TaskFailed(("map", 1), "map (2/2): boom", "tb")))
    assert inbox.root_cause(symptom, attempt=3, closed=set()).cause == "map (2/2): boom\ntb"


def test_root_cause_names_a_slot_that_died_and_keeps_a_cancel() -> None:
    inbox = _inbox()
    inbox.events.put(("closed", FakeConn(0, 2), ConnectionError("gone")))
    assert (
        "slot 0 (pid 1000) lost its control connection"
        in inbox.root_cause(Failure("symptom"), attempt=2, closed=set()).cause
    )
    inbox.events.put(("cancel", None, None))
    assert inbox.root_cause(Failure("symptom"), attempt=2, closed=set()).cause == "symptom"
    assert inbox.events.get_nowait()[0] == "cancel", "the cancel is left for run()"


def test_between_attempts_fails_savepoints_serves_storage_and_keeps_cancel() -> None:
    inbox = _inbox()
    request, done = FakeRequest(), []
    inbox.events.put(("savepoint", None, request))
    inbox.events.put(("io-done", done.append, None))
    inbox.events.put(("message", FakeConn(0, 1), SlotClosed(0)))
    inbox.events.put(("cancel", None, None))
    inbox.drain_stale()
    assert request.failed == "job job-1 is restarting"
    assert done == [None]
    assert inbox.events.get_nowait()[0] == "cancel" and inbox.events.empty()


def test_sleep_returns_after_the_delay_and_raises_on_cancel() -> None:
    inbox = _inbox()
    inbox.sleep(0.01)
    inbox.events.put(("cancel", None, None))
    with pytest.raises(JobCancelled):
        inbox.sleep(5.0)


def test_final_reports_are_taken_until_every_slot_closed() -> None:
    inbox = _inbox()
    inbox.events.put(("message", FakeConn(0, 1), SlotClosed(0)))
    inbox.events.put(("message", FakeConn(1, 0), SlotClosed(1)))  # an older attempt's
    inbox.events.put(("closed", FakeConn(1, 1), None))
    inbox.events.put(("message", FakeConn(2, 1), SlotClosed(2)))  # not awaited: stays
    inbox.take_final_reports([0, 1], attempt=1, closed=set())
    assert inbox.events.qsize() == 1


class FakeSlotConn(FakeConn):
    def __init__(self, slot: int, attempt: int) -> None:
        super().__init__(slot, attempt)
        self.sent: list[Any] = []
        self.closed = False

    def send(self, msg: Any) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        self.closed = True


def test_a_slot_registering_between_attempts_is_sent_away() -> None:
    inbox = _inbox()
    conn = FakeSlotConn(1, 2)
    inbox.events.put(("message", conn, RegisterSlot(1, 2, 4242, "127.0.0.1")))
    inbox.drain_stale()
    assert len(conn.sent) == 1 and isinstance(conn.sent[0], CancelSlot) and conn.closed
    assert "attempt 2 of job job-1 has ended" in conn.sent[0].reason
