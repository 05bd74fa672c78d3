"""What follows a failed attempt, with a real restart tracker and a fake coordinator."""

from __future__ import annotations

from typing import Any, cast

import pytest

import epochstream as es
from epochstream.checkpoint.coordinator import CheckpointCoordinator
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.core.clock import ManualClock
from epochstream.deploy.failures import Failure, FailureHandler
from epochstream.exceptions import CorruptStateError, JobExecutionError


class FakeCoordinator:
    def __init__(self, fallback: CompletedCheckpoint | None) -> None:
        self.fallback = fallback
        self.discarded: list[int] = []

    def discard_corrupt(self, checkpoint_id: int, reason: str) -> CompletedCheckpoint | None:
        self.discarded.append(checkpoint_id)
        return self.fallback


def _handler(attempts: int, coordinator: Any = None) -> FailureHandler:
    tracker = es.restart.fixed_delay(attempts=attempts, delay=0.5).create_tracker(ManualClock())
    return FailureHandler("job-1", tracker, cast(CheckpointCoordinator | None, coordinator))


def _corrupt(checkpoint_id: int) -> Failure:
    error = CorruptStateError("truncated", path="/ck/j/chk-4/a.kst", checkpoint_id=checkpoint_id)
    return Failure("restore failed", error=error)


def test_restarts_after_the_strategys_delay_until_it_gives_up() -> None:
    handler = _handler(attempts=1)
    assert handler.restart_delay(Failure("boom"), ["boom"]) == 0.5
    with pytest.raises(JobExecutionError, match="fixed_delay: 1 of 1 restarts used"):
        handler.restart_delay(Failure("boom"), ["boom", "boom"])


def test_an_unrecoverable_error_ends_the_job_without_using_a_restart() -> None:
    handler = _handler(attempts=1)
    with pytest.raises(JobExecutionError, match="not recoverable by restarting"):
        handler.restart_delay(Failure("bad input", suppress_restarts=True), ["bad input"])
    assert handler.restart_delay(Failure("boom"), ["bad input", "boom"]) == 0.5


def test_a_corrupt_checkpoint_is_discarded_before_restarting_from_its_fallback() -> None:
    fallback = CompletedCheckpoint(3, "/ck/j/chk-3", None)  # type: ignore[arg-type]
    coordinator = FakeCoordinator(fallback)
    handler = _handler(attempts=2, coordinator=coordinator)
    assert handler.restart_delay(_corrupt(4), ["restore failed"]) == 0.5
    assert coordinator.discarded == [4]


def test_no_checkpoint_left_to_restore_ends_the_job() -> None:
    coordinator = FakeCoordinator(None)
    handler = _handler(attempts=2, coordinator=coordinator)
    with pytest.raises(
        JobExecutionError, match="it restored is corrupt and no older checkpoint is left"
    ):
        handler.restart_delay(_corrupt(4), ["restore failed"])


class FakeWaiter:
    def __init__(self) -> None:
        self.waits: list[str] = []

    def wait(self, error: BaseException | None, cause: str) -> None:
        self.waits.append(cause)


def _unavailable() -> Failure:
    error = es.StorageUnavailableError("cannot read keyed state file: down", path="s3://b/k")
    return Failure("restore failed: storage unavailable", error=error)


def test_storage_unavailable_waits_for_storage_without_using_restarts_or_checkpoints() -> None:
    coordinator = FakeCoordinator(None)
    waiter = FakeWaiter()
    tracker = es.restart.fixed_delay(attempts=1, delay=0.5).create_tracker(ManualClock())
    handler = FailureHandler("job-1", tracker, cast(Any, coordinator), cast(Any, waiter))
    # A 20 s outage meets many attempts; none of them spends the one restart.
    for _ in range(5):
        assert handler.restart_delay(_unavailable(), ["restore failed"]) == 0.0
    assert len(waiter.waits) == 5
    assert coordinator.discarded == []  # an outage is never a reason to fall back
    assert handler.restart_delay(Failure("boom"), ["boom"]) == 0.5
    with pytest.raises(JobExecutionError, match="1 of 1 restarts used"):
        handler.restart_delay(Failure("boom"), ["boom", "boom"])
