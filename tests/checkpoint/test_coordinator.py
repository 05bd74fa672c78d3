from __future__ import annotations

import logging
import os

import pytest

from epochstream.checkpoint.coordinator import CheckpointCoordinator
from epochstream.checkpoint.storage import CheckpointStorage
from epochstream.core.checkpoint_config import CheckpointConfig
from epochstream.core.checkpoint_stats import TaskCheckpointStats
from epochstream.core.clock import ManualClock
from epochstream.exceptions import CheckpointError, ConfigurationError
from epochstream.state.acknowledgements import AcknowledgeCheckpoint, DeclineCheckpoint
from epochstream.state.handles import HeapSnapshotHandle, HeapStateFile, OperatorSubtaskState

SRC0, SRC1, SINK0 = ("src", 0), ("src", 1), ("sink", 0)
TASKS = {SRC0, SRC1, SINK0}


class Recorder:
    """Records every callback in order, as ("trigger", id, final) etc.

    Storage work runs at once, in the calling thread (a synchronous stand-in for the
    job master's storage thread); ``hold_io`` queues it instead, to run with ``release``.
    """

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.fail_errors: list[BaseException | None] = []
        self.options: dict[int, object] = {}
        self.hold_io = False
        self.held: list[tuple] = []

    def trigger_sources(self, checkpoint_id: int, timestamp: float, final: bool, options) -> None:
        self.options[checkpoint_id] = options
        self.events.append(("trigger", checkpoint_id, final))

    def run_io(self, work, done) -> None:
        if self.hold_io:
            self.held.append((work, done))
            return
        error = None
        try:
            work()
        except Exception as exc:
            error = exc
        if done is not None:
            done(error)

    def release(self) -> None:
        held, self.held = self.held, []
        self.hold_io = False
        for work, done in held:
            self.run_io(work, done)

    def savepoint_done(self, checkpoint_id: int, path, error) -> None:
        self.events.append(("savepoint", checkpoint_id, path, error))

    def notify_complete(self, checkpoint_id: int, metadata: object) -> None:
        self.events.append(("complete", checkpoint_id))

    def notify_aborted(self, checkpoint_id: int, reason: str) -> None:
        self.events.append(("aborted", checkpoint_id, reason))

    def fail_job(self, reason: str, error: BaseException | None = None) -> None:
        self.events.append(("fail", reason))
        self.fail_errors.append(error)

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]

    def take(self) -> list[tuple]:
        events, self.events = self.events, []
        return events


class Harness:
    def __init__(self, tmp_path, **cfg) -> None:
        self.clock = ManualClock(start=1000.0)
        self.storage = CheckpointStorage(str(tmp_path), "job")
        self.cb = Recorder()
        self.config = CheckpointConfig(storage=str(tmp_path), **cfg)
        self.coord = self.new_coordinator()

    def new_coordinator(self, **kw) -> CheckpointCoordinator:
        return CheckpointCoordinator(
            config=self.config,
            storage=self.storage,
            clock=self.clock,
            job_id="job",
            parallelism=2,
            max_parallelism=128,
            operator_parallelism={"src": 2, "sink": 1},
            callbacks=self.cb,
            **kw,
        )

    def advance(self, seconds: float) -> float | None:
        self.clock.advance(seconds)
        return self.coord.tick()

    def ack(self, n: int, task, size: int = 10) -> None:
        chain, sub = task
        states = {chain: OperatorSubtaskState(operator_lists={"offsets": [n, sub]})}
        if chain == "sink":
            path = os.path.join(self.storage.checkpoint_path(n), f"sink-{sub}.kst")
            states[chain] = OperatorSubtaskState(
                keyed=HeapSnapshotHandle(
                    range(0, 128), (HeapStateFile(path, True, {7: (0, size)}, size, False),)
                )
            )
        self.coord.receive_ack(
            AcknowledgeCheckpoint(
                checkpoint_id=n,
                task=task,
                states=states,
                stats=TaskCheckpointStats(alignment_s=0.01 * sub, state_size=size),
            )
        )

    def ack_all(self, n: int) -> None:
        for task in sorted(TASKS):
            self.ack(n, task)


@pytest.fixture
def h(tmp_path) -> Harness:
    harness = Harness(tmp_path, interval=1.0, timeout=10.0)
    harness.coord.start_attempt(TASKS)
    return harness


def test_first_trigger_one_interval_after_start(h: Harness) -> None:
    assert h.coord.tick() == pytest.approx(1.0)
    assert h.advance(0.5) == pytest.approx(0.5)
    assert h.cb.events == []
    wait = h.advance(0.5)
    assert h.cb.take() == [("trigger", 1, False)]
    # max_concurrent=1: the next event is the timeout of checkpoint 1, not a trigger.
    assert wait == pytest.approx(10.0)
    assert h.coord.pending_ids == [1]


def test_interval_between_triggers(tmp_path) -> None:
    h = Harness(tmp_path, interval=2.0, max_concurrent=5)
    h.coord.start_attempt(TASKS)
    h.advance(2.0)
    assert h.advance(1.9) == pytest.approx(0.1)
    assert [e[1] for e in h.cb.of("trigger")] == [1]
    h.advance(0.1)
    h.advance(2.0)
    assert [e[1] for e in h.cb.of("trigger")] == [1, 2, 3]
    assert h.coord.pending_ids == [1, 2, 3]


def test_completion_writes_metadata_last(h: Harness) -> None:
    h.advance(1.0)
    directory = h.storage.checkpoint_path(1)
    h.ack(1, SRC0, size=5)
    h.ack(1, SINK0, size=30)
    assert not os.path.exists(os.path.join(directory, "_metadata"))
    assert h.storage.completed_ids() == [] and h.coord.latest_completed is None
    h.clock.advance(0.25)
    h.ack(1, SRC1, size=7)
    assert h.cb.take() == [("trigger", 1, False), ("complete", 1)]
    assert h.storage.completed_ids() == [1]
    latest = h.coord.latest_completed
    assert latest is not None and latest.checkpoint_id == 1 and latest.directory == directory
    md = h.storage.load(1)
    assert md == latest.metadata
    assert md.job_id == "job" and md.parallelism == 2 and md.max_parallelism == 128
    assert md.operator_parallelism == {"src": 2, "sink": 1}
    assert md.operators["src"][1].operator_lists == {"offsets": [1, 1]}
    assert md.operators["sink"][0].keyed == HeapSnapshotHandle(
        range(0, 128),
        (HeapStateFile(os.path.join(directory, "sink-0.kst"), True, {7: (0, 30)}, 30, False),),
    )
    assert md.stats.state_size == 42
    assert set(md.stats.tasks) == {"src/0", "src/1", "sink/0"}
    assert md.stats.duration == pytest.approx(0.25)
    assert md.stats.max_alignment_s == pytest.approx(0.01)
    assert h.coord.completed_stats == [md.stats]


def test_completion_is_logged(h: Harness, caplog) -> None:
    caplog.set_level(logging.INFO, logger="epochstream.checkpoint.coordinator")
    h.advance(1.0)
    h.ack_all(1)
    assert any("completed checkpoint 1" in r.getMessage() for r in caplog.records)


def test_duplicate_unknown_and_foreign_acks_are_ignored(h: Harness) -> None:
    h.advance(1.0)
    h.ack(1, SRC0)
    h.ack(1, SRC0)  # duplicate
    h.ack(1, ("other", 0))  # not part of this attempt
    h.ack(42, SRC1)  # unknown id
    assert h.cb.of("complete") == []
    h.ack(1, SRC1)
    h.ack(1, SINK0)
    assert h.cb.of("complete") == [("complete", 1)]
    h.ack(1, SINK0)  # after completion
    assert h.cb.of("complete") == [("complete", 1)]


def test_min_pause_after_completion(tmp_path) -> None:
    h = Harness(tmp_path, interval=1.0, min_pause=3.0)
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    h.clock.advance(0.5)
    h.ack_all(1)  # completes at t+1.5
    assert h.coord.tick() == pytest.approx(3.0)
    h.advance(2.9)
    assert len(h.cb.of("trigger")) == 1
    h.advance(0.1)
    assert [e[1] for e in h.cb.of("trigger")] == [1, 2]


def test_max_concurrent_limits_triggers(tmp_path) -> None:
    h = Harness(tmp_path, interval=1.0, max_concurrent=2, timeout=100.0)
    h.coord.start_attempt(TASKS)
    for _ in range(5):
        h.advance(1.0)
    assert h.coord.pending_ids == [1, 2]
    h.ack_all(2)  # completes 2, subsumes 1 -> room for new triggers
    assert h.cb.of("trigger")[-1] == ("trigger", 2, False)
    # Overdue: the tick triggers 3 at once; with one slot left, 4 is an interval away.
    assert h.coord.tick() == pytest.approx(1.0)
    assert h.cb.of("trigger")[-1] == ("trigger", 3, False)
    assert h.coord.pending_ids == [3]


def test_subsumption_on_completion(tmp_path) -> None:
    h = Harness(tmp_path, interval=1.0, max_concurrent=3, timeout=100.0, tolerable_failures=0)
    h.coord.start_attempt(TASKS)
    for _ in range(3):
        h.advance(1.0)
    h.cb.take()
    h.ack_all(2)
    events = h.cb.take()
    assert events[0] == ("complete", 2)
    assert events[1][:2] == ("aborted", 1) and "subsumed by completed checkpoint 2" in events[1][2]
    assert len(events) == 2
    assert h.coord.pending_ids == [3]
    assert not os.path.exists(h.storage.checkpoint_path(1))
    h.ack_all(1)  # late acks of a subsumed checkpoint are ignored
    assert h.cb.events == []
    h.advance(1.0)  # subsumption is not a failure: no fail_job despite tolerable=0
    assert h.cb.of("fail") == []


def test_retained_pruning_on_disk(tmp_path) -> None:
    h = Harness(tmp_path, interval=1.0, retained=2)
    os.makedirs(h.storage.checkpoint_path(1))  # leftover of a crashed earlier job master
    h.coord = h.new_coordinator()
    h.coord.start_attempt(TASKS)
    for n in (2, 3, 4):
        h.advance(1.0)
        h.ack_all(n)
        assert h.storage.completed_ids()[-1] == n
    assert h.storage.completed_ids() == [3, 4]
    assert h.storage.checkpoint_ids() == [3, 4]
    assert h.coord.latest_completed is not None
    assert h.coord.latest_completed.checkpoint_id == 4


def test_timeout_aborts_and_fails_job(h: Harness) -> None:
    h.advance(1.0)
    h.ack(1, SRC0)
    assert h.advance(9.9) == pytest.approx(0.1)
    assert h.cb.of("aborted") == []
    h.advance(0.1)
    events = h.cb.take()
    assert events[0] == ("trigger", 1, False)
    aborted = [e for e in events if e[0] == "aborted"]
    fails = [e for e in events if e[0] == "fail"]
    assert len(aborted) == 1 and aborted[0][1] == 1
    assert "expired after 10 s" in aborted[0][2] and "src/1" in aborted[0][2]
    assert "src/0" not in aborted[0][2]
    assert len(fails) == 1
    assert "checkpoint 1 expired" in fails[0][1] and "exceed the 0 tolerated" in fails[0][1]
    assert not os.path.exists(h.storage.checkpoint_path(1))
    # The attempt has failed: nothing more happens until the job master re-arms.
    assert h.advance(50.0) is None and h.cb.events == []


def test_tolerable_failures_and_reset_on_success(tmp_path) -> None:
    h = Harness(tmp_path, interval=1.0, timeout=5.0, tolerable_failures=2)
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    h.advance(5.0)  # 1 expires (failure 1), 2 is triggered one interval after 1
    h.advance(0.0)
    assert h.cb.of("fail") == []
    assert h.coord.pending_ids == [2]
    h.coord.receive_decline(DeclineCheckpoint(checkpoint_id=2, task=SINK0, reason="disk full"))
    assert h.cb.of("fail") == []  # failure 2 of 2 tolerated
    h.advance(1.0)
    h.ack_all(3)  # success resets the counter
    for n in (4, 5):
        h.advance(1.0)
        h.coord.receive_decline(DeclineCheckpoint(checkpoint_id=n, task=SRC0, reason="boom"))
    assert h.cb.of("fail") == []
    h.advance(1.0)
    h.coord.receive_decline(DeclineCheckpoint(checkpoint_id=6, task=SRC0, reason="boom"))
    fails = h.cb.of("fail")
    assert len(fails) == 1
    assert "checkpoint 6 declined by task src/0: boom" in fails[0][1]
    assert "3 consecutive" in fails[0][1]


def test_decline_aborts_and_notifies(h: Harness) -> None:
    h.advance(1.0)
    h.ack(1, SRC0)
    h.coord.receive_decline(
        DeclineCheckpoint(checkpoint_id=1, task=SINK0, reason="snapshot failed")
    )
    aborted = h.cb.of("aborted")
    assert aborted == [("aborted", 1, "declined by task sink/0: snapshot failed")]
    assert not os.path.exists(h.storage.checkpoint_path(1))
    assert h.coord.pending_ids == []
    h.coord.receive_decline(DeclineCheckpoint(checkpoint_id=1, task=SINK0, reason="again"))
    assert len(h.cb.of("aborted")) == 1


def test_ids_monotonic_across_attempts_and_coordinators(h: Harness) -> None:
    h.advance(1.0)
    h.ack_all(1)
    h.advance(1.0)  # 2 pending
    h.coord.stop_attempt("task failed")
    assert not os.path.exists(h.storage.checkpoint_path(2))
    assert h.cb.of("aborted") == []  # no notifications on failover
    h.coord.start_attempt(TASKS)
    h.ack_all(2)  # a stale ack from the old attempt
    assert h.storage.completed_ids() == [1]
    h.advance(1.0)
    assert h.cb.of("trigger")[-1] == ("trigger", 3, False)
    # A new job master process on the same storage continues after chk-3 (pending).
    h.coord = h.new_coordinator()
    assert h.coord.next_checkpoint_id == 4
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    assert h.cb.of("trigger")[-1] == ("trigger", 4, False)
    assert h.new_coordinator(first_checkpoint_id=100).next_checkpoint_id == 100


def test_restore_from_sets_latest_and_continues_ids(tmp_path, h: Harness) -> None:
    h.advance(1.0)
    h.ack_all(1)
    restored = h.coord.latest_completed
    assert restored is not None
    other = Harness(tmp_path / "other", interval=1.0)
    other.coord.restore_from([restored])
    assert other.coord.latest_completed == restored
    assert other.coord.completed_stats == []
    other.coord.start_attempt(TASKS)
    other.advance(1.0)
    assert other.cb.of("trigger") == [("trigger", 2, False)]
    with pytest.raises(CheckpointError, match="while checkpoints \\[2\\] are pending"):
        other.coord.restore_from([restored])


def test_final_checkpoint_waits_for_pending_then_stops_periodic(h: Harness) -> None:
    h.advance(1.0)
    h.coord.trigger_final()
    assert h.coord.final_checkpoint_id is None
    h.ack_all(1)
    assert h.cb.take() == [("trigger", 1, False), ("complete", 1), ("trigger", 2, True)]
    assert h.coord.final_checkpoint_id == 2 and not h.coord.final_completed
    h.coord.trigger_final()  # idempotent
    assert h.advance(5.0) == pytest.approx(5.0)  # only the timeout is scheduled
    assert h.cb.events == []
    h.ack_all(2)
    assert h.cb.take() == [("complete", 2)]
    assert h.coord.final_completed
    assert h.advance(100.0) is None and h.cb.events == []


def test_final_checkpoint_immediately_when_idle(h: Harness) -> None:
    h.coord.trigger_final()
    assert h.cb.take() == [("trigger", 1, True)]


def test_final_checkpoint_after_abort_of_pending(tmp_path) -> None:
    h = Harness(tmp_path, interval=1.0, timeout=10.0, tolerable_failures=1)
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    h.coord.trigger_final()
    h.coord.receive_decline(DeclineCheckpoint(checkpoint_id=1, task=SRC0, reason="x"))
    assert h.cb.take()[-1] == ("trigger", 2, True)


def test_failed_final_checkpoint_fails_job(tmp_path) -> None:
    h = Harness(tmp_path, interval=1.0, timeout=10.0, tolerable_failures=5)
    h.coord.start_attempt(TASKS)
    h.coord.trigger_final()
    h.advance(10.0)
    fails = h.cb.of("fail")
    assert len(fails) == 1 and fails[0][1].startswith("final checkpoint 1 expired")
    assert not h.coord.final_completed
    h.coord.stop_attempt("failover")
    h.coord.start_attempt(TASKS)  # a new attempt may take its own final checkpoint
    assert h.coord.final_checkpoint_id is None
    h.coord.trigger_final()
    assert h.cb.of("trigger")[-1] == ("trigger", 2, True)


def test_shutdown_cancel_respects_retain_on_cancel(tmp_path) -> None:
    for retain, expected in ((False, []), (True, [1])):
        h = Harness(tmp_path / str(retain), interval=1.0, retain_on_cancel=retain)
        h.coord.start_attempt(TASKS)
        h.advance(1.0)
        h.ack_all(1)
        h.advance(1.0)
        h.coord.shutdown(cancelled=True)
        assert h.storage.completed_ids() == expected
        assert h.storage.checkpoint_ids() == expected


def test_start_attempt_validates_tasks(tmp_path) -> None:
    coord = Harness(tmp_path).coord
    with pytest.raises(ConfigurationError, match="at least one task"):
        coord.start_attempt(set())


def test_storage_failure_at_completion_aborts(h: Harness) -> None:
    h.advance(1.0)
    os.mkdir(os.path.join(h.storage.checkpoint_path(1), "_metadata"))
    h.ack_all(1)
    aborted = h.cb.of("aborted")
    assert len(aborted) == 1 and "could not be finalized" in aborted[0][2]
    assert h.cb.of("complete") == [] and len(h.cb.of("fail")) == 1
    assert h.coord.latest_completed is None


def test_checkpoints_failing_on_unreachable_storage_open_an_outage_until_one_completes(
    tmp_path,
) -> None:
    from epochstream.checkpoint.outage import StorageOutage

    h = Harness(tmp_path, interval=1.0, timeout=10.0, tolerable_failures=2)
    outage = StorageOutage("job")
    h.coord = h.new_coordinator(outage=outage)
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    h.coord.receive_decline(
        DeclineCheckpoint(checkpoint_id=1, task=SRC0, reason="s3 down", storage_unavailable=True)
    )
    status = outage.status()
    assert status["storage_state"] == "UNAVAILABLE"
    assert "checkpoint 1 declined by task" in status["storage_last_error"]
    # Counted like any failed checkpoint (tolerable_failures), no job failure yet.
    assert h.cb.of("fail") == []
    h.advance(1.0)
    h.coord.receive_decline(DeclineCheckpoint(checkpoint_id=2, task=SRC0, reason="bug"))
    assert outage.status()["storage_failures"] == 1  # not an outage: not recorded
    h.advance(1.0)
    h.ack_all(3)
    assert h.cb.of("complete") == [("complete", 3)]
    assert outage.status()["storage_state"] == "AVAILABLE"


def test_a_metadata_write_on_unreachable_storage_is_an_outage(tmp_path) -> None:
    from epochstream.checkpoint.outage import StorageOutage
    from epochstream.exceptions import StorageUnavailableError

    h = Harness(tmp_path, interval=1.0, timeout=10.0, tolerable_failures=1)
    outage = StorageOutage("job")
    h.coord = h.new_coordinator(outage=outage)
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    h.cb.hold_io = True
    h.ack_all(1)
    h.cb.held = [(w, d) for w, d in h.cb.held if d is not None]
    assert len(h.cb.held) == 1
    _work, done = h.cb.held.pop()
    done(StorageUnavailableError("cannot write checkpoint metadata: down", path="/x"))
    assert outage.unavailable
    assert h.cb.of("aborted")[0][1] == 1


def test_checkpoints_failing_past_the_tolerance_on_unreachable_storage_fail_the_attempt_as_an_outage(
    tmp_path,
) -> None:
    """So the job master waits for the storage instead of spending a restart on each
    attempt a full disk or read-only mount fails at its first checkpoint."""
    from epochstream.exceptions import StorageUnavailableError

    h = Harness(tmp_path, interval=1.0, timeout=10.0, tolerable_failures=0)
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    h.coord.receive_decline(
        DeclineCheckpoint(checkpoint_id=1, task=SRC0, reason="disk full", storage_unavailable=True)
    )
    assert len(h.cb.of("fail")) == 1
    assert isinstance(h.cb.fail_errors[-1], StorageUnavailableError)
    # Any other failure past the tolerance is a plain one (the restart strategy decides).
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    h.coord.receive_decline(DeclineCheckpoint(checkpoint_id=2, task=SRC0, reason="bug"))
    assert len(h.cb.of("fail")) == 2 and h.cb.fail_errors[-1] is None


def test_maybe_completed_id_counts_a_checkpoint_once_its_metadata_write_began(tmp_path) -> None:
    # What cancelled sinks may abort: nothing filed under a checkpoint at or below it.
    h = Harness(tmp_path, interval=1.0, timeout=10.0, max_concurrent=3)
    h.coord.start_attempt(TASKS)
    assert h.coord.maybe_completed_id == 0
    h.advance(1.0)
    h.ack_all(1)
    assert h.coord.maybe_completed_id == 1
    h.advance(1.0)  # checkpoint 2: acked, its _metadata write held (may still land)
    h.cb.hold_io = True
    h.ack_all(2)
    h.advance(1.0)  # checkpoint 3: never acknowledged by every task
    h.coord.stop_attempt("failover")
    assert h.coord.maybe_completed_id == 2
