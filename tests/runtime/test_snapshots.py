"""The slot's asynchronous snapshot thread: order, failure isolation, draining on stop."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from epochstream.runtime.snapshots import (
    SNAPSHOT_SWITCH_INTERVAL_S,
    SnapshotExecutor,
    switch_interval,
)


@pytest.fixture
def executor() -> Iterator[SnapshotExecutor]:
    ex = SnapshotExecutor(name="test-snapshots")
    ex.start()
    try:
        yield ex
    finally:
        ex.stop()


def test_jobs_run_in_submission_order_on_one_thread(executor: SnapshotExecutor) -> None:
    ran: list[tuple[int, int]] = []
    for i in range(50):
        executor.submit(lambda i=i: ran.append((i, threading.get_ident())))
    executor.stop()
    assert [i for i, _ in ran] == list(range(50))
    threads = {ident for _, ident in ran}
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_a_job_runs_while_the_submitter_goes_on(executor: SnapshotExecutor) -> None:
    release = threading.Event()
    done = threading.Event()

    def slow() -> None:
        release.wait(10)
        done.set()

    executor.submit(slow)  # returns at once although the job waits for us
    assert not done.is_set()
    release.set()
    assert done.wait(10)


def test_a_failing_job_does_not_stop_later_ones(
    executor: SnapshotExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise OSError("disk full")

    executor.submit(lambda: ran.append("first"))
    executor.submit(boom)
    executor.submit(lambda: ran.append("after"))
    with caplog.at_level(logging.ERROR, logger="epochstream.runtime.snapshots"):
        executor.stop()
    assert ran == ["first", "boom", "after"]
    assert "asynchronous snapshot job failed" in caplog.text and "disk full" in caplog.text


def test_stop_drains_every_queued_job_before_the_thread_ends(executor: SnapshotExecutor) -> None:
    started, gate = threading.Event(), threading.Event()
    ran: list[int] = []

    def hold() -> None:
        started.set()
        gate.wait(10)

    executor.submit(hold)  # keeps the other jobs queued until stop() was called
    for i in range(20):
        executor.submit(lambda i=i: ran.append(i))
    assert started.wait(10)
    stopper = threading.Thread(target=executor.stop, kwargs={"timeout": 10})
    stopper.start()
    _wait_for(lambda: executor._queue.qsize() == 21)  # the 20 jobs, then the stop marker
    assert ran == []
    gate.set()
    stopper.join(10)
    assert ran == list(range(20))
    assert not executor._thread.is_alive()


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_stop_twice_is_harmless(executor: SnapshotExecutor) -> None:
    ran: list[int] = []
    executor.submit(lambda: ran.append(1))
    executor.stop()
    executor.stop()
    assert ran == [1]


def test_jobs_run_at_the_snapshot_switch_interval_and_it_is_restored_after(
    executor: SnapshotExecutor,
) -> None:
    before = sys.getswitchinterval()
    seen: list[float] = []
    executor.submit(lambda: seen.append(sys.getswitchinterval()))
    executor.stop()
    assert seen == [pytest.approx(min(SNAPSHOT_SWITCH_INTERVAL_S, before))]
    assert sys.getswitchinterval() == before


def test_overlapping_switch_intervals_restore_the_first_value_when_the_last_ends() -> None:
    before = sys.getswitchinterval()
    with switch_interval(0.002):
        assert sys.getswitchinterval() == pytest.approx(0.002)
        with switch_interval(0.001):
            assert sys.getswitchinterval() == pytest.approx(0.001)
        # An inner block ending does not restore while another block is still inside.
        assert sys.getswitchinterval() == pytest.approx(0.001)
    assert sys.getswitchinterval() == before
    with switch_interval(1.0):  # never longer than the interval it found
        assert sys.getswitchinterval() == pytest.approx(before)
    assert sys.getswitchinterval() == before


def test_the_switch_interval_is_restored_when_a_job_fails(executor: SnapshotExecutor) -> None:
    before = sys.getswitchinterval()

    def boom() -> None:
        raise RuntimeError("boom")

    executor.submit(boom)
    executor.stop()
    assert sys.getswitchinterval() == before
