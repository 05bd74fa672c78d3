"""Waiting for checkpoint storage between attempts: fake probe, fake sleep, no real waiting."""

from __future__ import annotations

import pytest

from epochstream.checkpoint.outage import StorageOutage
from epochstream.deploy.storage_wait import StorageWaiter
from epochstream.exceptions import JobCancelled, StorageUnavailableError

DOWN = ConnectionRefusedError(111, "Connection refused")


class Probe:
    def __init__(self, *results: BaseException | None) -> None:
        self.results = list(results)
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        result = self.results.pop(0)
        if result is not None:
            raise result


def _waiter(probe: Probe | None) -> tuple[StorageWaiter, list[float], StorageOutage]:
    sleeps: list[float] = []
    outage = StorageOutage("job-1")
    waiter = StorageWaiter(outage, probe=probe, sleep=sleeps.append, wall=lambda: 50.0)
    return waiter, sleeps, outage


def test_probes_with_back_off_until_storage_answers() -> None:
    probe = Probe(DOWN, DOWN, DOWN, None)
    waiter, sleeps, outage = _waiter(probe)
    waiter.wait(StorageUnavailableError("restore failed", path="s3://b/k"), "restore failed")
    assert sleeps == [0.5, 1.0, 2.0, 4.0]
    assert probe.calls == 4
    # Still unavailable until the next attempt restores: a probe is not a restore.
    status = outage.status()
    assert status["storage_state"] == "UNAVAILABLE" and status["storage_failures"] == 4


def test_an_attempt_running_does_not_end_the_outage() -> None:
    """Slots report running before their tasks read their state: the outage goes on
    until a checkpoint completes (the coordinator ends it), not when slots connect."""
    waiter, _, outage = _waiter(Probe(None))
    waiter.wait(StorageUnavailableError("restore failed", path="s3://b/k"), "restore failed")
    waiter.restored()
    assert outage.status()["storage_state"] == "UNAVAILABLE"
    outage.recovered(now=60.0)  # what the coordinator does on a completed checkpoint
    assert outage.status()["storage_state"] == "AVAILABLE"


def test_a_long_outage_never_gives_up() -> None:
    probe = Probe(*([DOWN] * 200), None)
    waiter, sleeps, _ = _waiter(probe)
    waiter.wait(None, "restore failed")
    assert len(sleeps) == 201 and max(sleeps) == 10.0


def test_a_probe_error_that_is_no_outage_ends_the_wait() -> None:
    probe = Probe(DOWN, FileNotFoundError(2, "no _metadata"))
    waiter, sleeps, _ = _waiter(probe)
    waiter.wait(None, "restore failed")
    assert sleeps == [0.5, 1.0]


def test_a_cancel_while_waiting_propagates() -> None:
    outage = StorageOutage("job-1")

    def sleep(_seconds: float) -> None:
        raise JobCancelled("cancelled")

    waiter = StorageWaiter(outage, probe=Probe(DOWN), sleep=sleep, wall=lambda: 1.0)
    with pytest.raises(JobCancelled):
        waiter.wait(None, "restore failed")


def test_without_a_probe_each_consecutive_wait_is_longer() -> None:
    waiter, sleeps, _ = _waiter(None)
    for _ in range(3):
        waiter.wait(None, "restore failed")
    assert sleeps == [0.5, 1.0, 2.0]
    waiter.restored()
    waiter.wait(None, "restore failed")
    assert sleeps[-1] == 0.5
