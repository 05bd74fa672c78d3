"""The job master with fake runners: slots as threads of this process, or a scripted plane.

``ThreadRunner`` runs the real slot code (``run_slot``) in threads, so the job master's
control plane, the slots' data plane and the tasks are all real, without subprocesses.
``ScriptedRunner`` replaces the slots by connections that answer like slots would,
which fixes the order of events that real slots produce on different threads.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import epochstream as es
from epochstream.checkpoint.storage import load_metadata
from epochstream.connectors.base import GlobalCommitter, SinkWriter
from epochstream.deploy.client import JobClient
from epochstream.deploy.enumeration import EnumeratorCheckpoint
from epochstream.deploy.jobmaster import JobMaster, Phase
from epochstream.deploy.runners import OnExit, Runner, RunnerLost
from epochstream.exceptions import CheckpointError, JobExecutionError
from epochstream.runtime.clock import ManualClock
from epochstream.runtime.messages import (
    AcknowledgeCheckpoint,
    AddSplits,
    ConnectPeers,
    DeploySlot,
    FinishSlot,
    NotifyCheckpointComplete,
    RegisterSlot,
    RequestSplit,
    SlotClosed,
    SlotMetrics,
    SlotReady,
    SlotRunning,
    TaskCheckpointStats,
    TaskFailed,
    TaskFinished,
    TriggerCheckpoint,
)
from epochstream.runtime.metrics import OperatorSample, TaskMetricsSample
from epochstream.runtime.slot import SlotLaunch, run_slot

#: Seconds any single wait of these tests may take before the test fails.
WAIT = 20.0


# Cancelled slots are threads here: one whose data or control socket the shutdown closed
# under it dies with BrokenPipeError while reporting (a subprocess slot just exits).
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


@pytest.fixture(autouse=True)
def _isolated(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Functions of this module go to the slots by value, as a job script's would; no
    job entry is written outside ``tmp_path``."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    cloudpickle.register_pickle_by_value(request.module)
    yield
    cloudpickle.unregister_pickle_by_value(request.module)


class ThreadRunner(Runner):
    """Runs every slot of an attempt as a thread of this process calling ``run_slot``.

    A slot that raises is reported through ``on_exit``; clean exits are not: the job
    master learns that a finished attempt's slots are done from their ``SlotClosed``
    (reporting the exit too would race with that message, see
    ``test_runner_exit_before_the_last_slot_closed_message_still_finishes``).
    """

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.attempts: list[int] = []
        self.cancels = 0
        self.closed = False
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    def control_host(self) -> str:
        return "127.0.0.1"

    def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
        self.attempts.append(launch.attempt)
        errors: list[BaseException] = []

        def slot(index: int) -> None:
            try:
                run_slot(launch, index=index, host="127.0.0.1")
            except BaseException as exc:  # reported like a failed slot process
                errors.append(exc)

        threads = [
            threading.Thread(
                target=slot, args=(i,), name=f"slot-a{launch.attempt}-{i}", daemon=True
            )
            for i in range(self.parallelism)
        ]
        for t in threads:
            t.start()
        self._threads = threads

        def watch() -> None:
            for t in threads:
                t.join()
            if errors:
                self.errors.extend(errors)
                on_exit(errors[0])

        threading.Thread(target=watch, name=f"watch-a{launch.attempt}", daemon=True).start()

    def cancel(self) -> None:
        # The job master has told the slots (CancelSlot, closed connection) already.
        self.cancels += 1

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        self.closed = True
        self.wait(WAIT)


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _env(
    tmp_path: Path, *, checkpointing: bool = True, parallelism: int = 2, **cfg: Any
) -> es.Environment:
    env = es.Environment(parallelism=parallelism, runner="local", heartbeat_interval=0.2)
    env.endpoint_host = None  # no HTTP endpoint: the job master is driven directly
    if checkpointing:
        env.enable_checkpointing(cfg.pop("interval", 0.1), storage=str(tmp_path / "ckpt"), **cfg)
    return env


def _pair(i: int) -> tuple[int, int]:
    return (i % 5, i + 1)


def _key(t: tuple[int, int]) -> int:
    return t[0]


def _sum(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0], a[1] + b[1])


def _mod3(i: int) -> int:
    return i % 3


def _sums_pipeline(env: es.Environment, source: es.DataStream, out: Path) -> None:
    source.map(_pair).key_by(_key).reduce(_sum).sink_to(es.sinks.FileSink(str(out)))


def _exactly_once_problems(rows: list[list[int]], n: int, keys: int = 5) -> list[str]:
    """Running sums arrive in a nondeterministic order per key (parallel splits), so check
    what every order must give: sorted sums step by exactly the key's inputs, each once."""
    sums: dict[int, list[int]] = collections.defaultdict(list)
    for key, value in rows:
        sums[key].append(value)
    problems = []
    for k in range(keys):
        got = sorted(sums.get(k, []))
        steps = [b - a for a, b in zip([0, *got], got, strict=False)]
        inputs = [i + 1 for i in range(k, n, keys)]
        if collections.Counter(steps) != collections.Counter(inputs):
            problems.append(f"key {k}: {len(got)} updates, expected {len(inputs)}")
    return problems


# ---------------------------------------------------------------- finishing and failing


def test_bounded_job_finishes_with_a_result_and_a_final_checkpoint(tmp_path: Path) -> None:
    env = _env(tmp_path)
    n = 200
    _sums_pipeline(env, env.from_collection(range(n)), tmp_path / "out")
    runner = ThreadRunner(2)
    master = JobMaster(env, env.job_graph("bounded"), runner=runner)
    result = master.run()

    assert result.job_id == master.job_id
    assert result.restarts == 0 and result.failures == [] and result.restored_from is None
    assert runner.attempts == [1] and runner.cancels == 0 and runner.closed
    assert master.phase is Phase.DONE
    coordinator = master.coordinator
    assert coordinator is not None and coordinator.final_completed
    final_id = coordinator.final_checkpoint_id
    assert final_id is not None and result.checkpoints[-1].checkpoint_id == final_id
    latest = coordinator.latest_completed
    assert latest is not None and latest.checkpoint_id == final_id
    assert os.path.exists(os.path.join(latest.directory, "_metadata"))
    assert _exactly_once_problems(es.testing.read_committed(tmp_path / "out"), n) == []


def test_a_failing_slot_restarts_from_the_latest_checkpoint_exactly_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = _env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.05))
    n = 12_000  # 1.5 s of input: the first checkpoint completes well before its end
    markers = tmp_path / "markers"
    markers.mkdir()
    fail = es.testing.FailOnce(after_checkpoints=1, subtask=0, marker_dir=str(markers))
    source = env.from_sequence(0, n, rate=8_000).map(fail)
    _sums_pipeline(env, source, tmp_path / "out")
    runner = ThreadRunner(2)
    master = JobMaster(env, env.job_graph("failover"), runner=runner)
    with caplog.at_level(logging.WARNING, logger="epochstream.deploy.jobmaster"):
        result = master.run()

    assert result.restarts == 1 and runner.attempts == [1, 2] and runner.cancels == 1
    assert "InjectedFailure" in result.failures[0]
    assert "injected failure #1 in subtask 0" in result.failures[0]
    assert "attempt 2: restoring checkpoint" in caplog.text
    assert _exactly_once_problems(es.testing.read_committed(tmp_path / "out"), n) == []


def _explode_on_13(i: int) -> int:
    if i == 13:
        raise ValueError("thirteen is unlucky")
    return i


def _reject_seven(i: int) -> int:
    if i == 7:
        raise es.DataError("record 7 is malformed")
    return i


def test_errors_that_suppress_restarts_fail_the_job_at_once(tmp_path: Path) -> None:
    env = _env(tmp_path, checkpointing=False)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.05))
    env.from_collection(range(20)).map(_reject_seven).sink_to(es.sinks.DiscardSink())
    runner = ThreadRunner(2)
    master = JobMaster(env, env.job_graph("data-error"), runner=runner)
    with pytest.raises(JobExecutionError) as info:
        master.run()
    err = info.value
    assert err.restarts == 0 and runner.attempts == [1]
    assert "not recoverable by restarting" in str(err)
    assert "failed on record 7" in err.cause and "record 7 is malformed" in err.cause
    assert err.history == [err.cause]


def test_slots_that_stop_heartbeating_fail_the_attempt(tmp_path: Path) -> None:
    """The heartbeat deadline runs on the injected clock: jump it, no real waiting."""
    env = _env(tmp_path, checkpointing=False)
    env.from_sequence(0, 10**9, rate=100).sink_to(es.sinks.DiscardSink())
    clock = ManualClock(start=100.0)
    master = JobMaster(env, env.job_graph("silent"), runner=ThreadRunner(2), clock=clock)
    client = JobClient(master)
    client.wait_until_running(WAIT)
    clock.advance(env.heartbeat_timeout + 1)
    with pytest.raises(JobExecutionError) as info:
        client.result(WAIT)
    assert "missed heartbeats" in info.value.cause


def test_slots_that_never_register_time_out_on_the_injected_clock(tmp_path: Path) -> None:
    class NoSlots(ThreadRunner):
        def __init__(self, clock: ManualClock) -> None:
            super().__init__(2)
            self.clock = clock

        def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
            self.attempts.append(launch.attempt)
            self.clock.advance(1_000.0)  # the cluster never gives us slots

    env = _env(tmp_path, checkpointing=False)
    env.from_collection([1]).sink_to(es.sinks.DiscardSink())
    clock = ManualClock()
    runner = NoSlots(clock)
    master = JobMaster(env, env.job_graph("no-slots"), runner=runner, clock=clock)
    with pytest.raises(JobExecutionError) as info:
        master.run()
    assert "only 0 of 2 slots registered within 180s" in info.value.cause
    assert runner.cancels == 1 and runner.closed


# ---------------------------------------------------------------- savepoints


def _running_client(env: es.Environment, name: str) -> tuple[JobClient, JobMaster]:
    master = JobMaster(env, env.job_graph(name), runner=ThreadRunner(env.parallelism))
    client = JobClient(master)
    client.wait_until_running(WAIT)
    return client, master


def test_savepoint_of_a_running_job(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _sums_pipeline(env, env.from_sequence(0, 10**9, rate=2_000), tmp_path / "out")
    client, master = _running_client(env, "savepoint")
    try:
        path = master.request_savepoint(str(tmp_path / "sp"), terminate=False).wait(WAIT)
        assert path.startswith(str(tmp_path / "sp" / f"savepoint-{master.job_id[:6]}-"))
        assert os.path.exists(os.path.join(path, "_metadata"))
        _, md = load_metadata(path)
        assert md.kind == "savepoint" and md.job_id == master.job_id
        assert md.stats.kind == "savepoint"
        assert not client.done, "the job keeps running"
    finally:
        client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(WAIT)


def test_stop_with_savepoint_commits_what_it_covers_and_cancels_the_job(tmp_path: Path) -> None:
    # One slot: with two, the slot that closes first breaks the other's input channels,
    # and whether that report comes before the job ends depends on thread timing; the
    # scripted test_a_broken_channel_while_stopping_with_a_savepoint_does_not_restart_the_job
    # covers that case deterministically.
    env = _env(tmp_path, parallelism=1)
    n = 10**9
    out = tmp_path / "out"
    (
        env.from_sequence(0, n, rate=4_000)
        .uid("numbers")
        .key_by(_mod3)
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )
    client, master = _running_client(env, "stop")
    _wait_for(lambda: os.path.isdir(out) and es.testing.read_committed(out) != [])
    request = master.request_savepoint(str(tmp_path / "sp"), terminate=True)
    path = request.wait(WAIT)
    with pytest.raises(es.JobCancelled, match="stopped with a savepoint") as info:
        client.result(WAIT)
    assert path in str(info.value)

    _, md = load_metadata(path)
    assert md.kind == "savepoint"
    starts = {s.split_id: s.next for s in es.sources.SequenceSource(0, n).create_splits(1)}
    positions = [
        split
        for state in md.operators["numbers"].values()
        for split in state.operator_lists["splits"]
    ]
    assert len(positions) == 1
    covered = sorted(i for s in positions for i in range(starts[s.split_id], s.next))
    committed = sorted(es.testing.read_committed(out))
    assert committed == covered, "sinks commit exactly what the savepoint covers"


def test_savepoint_without_checkpointing_fails_clearly(tmp_path: Path) -> None:
    env = _env(tmp_path, checkpointing=False)
    env.from_sequence(0, 10**9, rate=100).sink_to(es.sinks.DiscardSink())
    client, _ = _running_client(env, "no-checkpoints")
    try:
        with pytest.raises(CheckpointError, match=r"savepoints need checkpointing"):
            client.trigger_savepoint(str(tmp_path / "sp"), timeout=WAIT)
        assert not client.done
    finally:
        client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(WAIT)
    assert not os.path.exists(tmp_path / "sp")


def test_runner_lost_on_cancel_says_how_to_resume(tmp_path: Path) -> None:
    class LosingRunner(ThreadRunner):
        def cancel(self) -> None:
            super().cancel()
            raise RunnerLost("the Spark context was lost")

    env = _env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.05))
    markers = tmp_path / "markers"
    markers.mkdir()
    fail = es.testing.FailOnce(after_checkpoints=1, subtask=1, marker_dir=str(markers))
    _sums_pipeline(env, env.from_sequence(0, 10**9, rate=8_000).map(fail), tmp_path / "out")
    runner = LosingRunner(2)
    master = JobMaster(env, env.job_graph("lost"), runner=runner)
    with pytest.raises(JobExecutionError) as info:
        master.run()
    err = info.value
    assert master.storage is not None
    text = str(err)
    assert "cannot continue: the Spark context was lost" in text
    assert "--restore-from" in text and master.storage.job_dir in text
    assert err.history[-1] == "the Spark context was lost" and err.restarts == 0
    assert runner.attempts == [1] and runner.closed
    coordinator = master.coordinator
    assert coordinator is not None and coordinator.latest_completed is not None
    assert os.path.exists(os.path.join(coordinator.latest_completed.directory, "_metadata"))


def test_runner_lost_error_keeps_the_failure_that_ended_the_attempt(tmp_path: Path) -> None:
    class LosingRunner(ThreadRunner):
        def cancel(self) -> None:
            raise RunnerLost("the Spark context was lost")

    env = _env(tmp_path, checkpointing=False)
    env.from_collection(range(20)).map(_explode_on_13).sink_to(es.sinks.DiscardSink())
    master = JobMaster(env, env.job_graph("lost"), runner=LosingRunner(2))
    with pytest.raises(JobExecutionError) as info:
        master.run()
    err = info.value
    assert "failed on record 13" in err.cause, "the first cause is the task's failure"
    assert len(err.history) == 2 and err.history[1] == "the Spark context was lost"


# ---------------------------------------------------------------- a scripted control plane


class ScriptedConn:
    """A slot's control connection as the job master sees it, answering as a slot would:
    DeploySlot -> SlotReady; ConnectPeers -> SlotRunning (and TaskFinished of its tasks
    when ``bounded``); TriggerCheckpoint -> an acknowledgement of each of its tasks;
    FinishSlot -> ``on_finish(conn)``."""

    def __init__(
        self,
        master: JobMaster,
        index: int,
        on_finish: Callable[[ScriptedConn], None],
        *,
        bounded: bool,
    ) -> None:
        self.master = master
        self.index = index
        self.on_finish = on_finish
        self.bounded = bounded
        self.slot: int | None = None
        self.attempt: int | None = None
        self.pid: int | None = None
        self.closed = False
        self.sent: list[Any] = []

    def reply(self, msg: Any) -> None:
        self.master.events.put(("message", self, msg))

    def lose(self) -> None:
        """The connection ends, as when the slot closes it."""
        self.master.events.put(("closed", self, ConnectionError("connection closed")))

    def tasks(self) -> list[tuple[str, int]]:
        return [(chain.chain_id, self.index) for chain in self.master.graph.chains]

    def send(self, msg: Any) -> bool:
        self.sent.append(msg)
        if isinstance(msg, DeploySlot):
            self.reply(SlotReady(self.index, "127.0.0.1", 40_000 + self.index))
        elif isinstance(msg, ConnectPeers):
            self.reply(SlotRunning(self.index))
            if self.bounded:
                for task in self.tasks():
                    self.reply(TaskFinished(task))
        elif isinstance(msg, TriggerCheckpoint):
            for task in self.tasks():
                stats = TaskCheckpointStats()
                self.reply(AcknowledgeCheckpoint(msg.checkpoint_id, task, {}, stats))
        elif isinstance(msg, FinishSlot):
            self.on_finish(self)
        return True

    def close(self) -> None:
        self.closed = True


class ScriptedRunner(Runner):
    """Starts scripted slots that register at once; ``on_finish`` scripts their end.

    Only the first attempt gets slots: a second one ends at once with an error, so a
    test whose job restarts ends instead of running on.
    """

    def __init__(self, parallelism: int, *, bounded: bool) -> None:
        self.parallelism = parallelism
        self.bounded = bounded
        self.master: JobMaster | None = None
        self.on_exit: OnExit | None = None
        self.attempts: list[int] = []
        self.conns: list[ScriptedConn] = []
        self.on_finish: Callable[[ScriptedConn], None] = lambda conn: None

    def control_host(self) -> str:
        return "127.0.0.1"

    def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
        master = self.master
        assert master is not None
        self.attempts.append(launch.attempt)
        self.on_exit = on_exit
        if len(self.attempts) > 1:
            on_exit(RuntimeError(f"no slots for attempt {launch.attempt}"))
            return
        self.conns = [
            ScriptedConn(master, i, self.on_finish, bounded=self.bounded)
            for i in range(self.parallelism)
        ]
        for conn in self.conns:
            conn.reply(RegisterSlot(conn.index, launch.attempt, 1_000 + conn.index, "127.0.0.1"))

    def cancel(self) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        return True


def _scripted_master(tmp_path: Path, *, bounded: bool) -> tuple[JobMaster, ScriptedRunner]:
    env = _env(tmp_path, checkpointing=not bounded, interval=3_600.0)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=1, delay=0.0))
    env.from_collection([1, 2, 3]).map(_mod3).key_by(_mod3).sink_to(es.sinks.DiscardSink())
    runner = ScriptedRunner(2, bounded=bounded)
    master = JobMaster(env, env.job_graph("scripted"), runner=runner)
    runner.master = master
    return master, runner


def test_scripted_slots_finish_a_job_without_checkpointing(tmp_path: Path) -> None:
    master, runner = _scripted_master(tmp_path, bounded=True)

    def finish(conn: ScriptedConn) -> None:  # SlotClosed, then the runner sees the exit
        conn.reply(SlotClosed(conn.index))
        if conn.index == runner.parallelism - 1:
            assert runner.on_exit is not None
            runner.on_exit(None)

    runner.on_finish = finish
    result = master.run()
    assert result.restarts == 0 and result.checkpoints == []
    for conn in runner.conns:
        assert [type(m) for m in conn.sent] == [DeploySlot, ConnectPeers, FinishSlot]
        assert conn.closed


def test_runner_exit_before_the_last_slot_closed_message_still_finishes(tmp_path: Path) -> None:
    """A slot sends SlotClosed and exits; the runner may see the exit before the control
    plane's reader thread queues that message. The job finished all the same."""
    master, runner = _scripted_master(tmp_path, bounded=True)

    def finish(conn: ScriptedConn) -> None:
        if conn.index == runner.parallelism - 1:
            assert runner.on_exit is not None
            runner.on_exit(None)  # the exit overtakes the message in the event queue
        conn.reply(SlotClosed(conn.index))

    runner.on_finish = finish
    result = master.run()
    assert result.restarts == 0 and result.failures == []


def test_final_metrics_that_the_runner_exit_overtakes_are_still_recorded(tmp_path: Path) -> None:
    """Each slot's last SlotMetrics (the final counts) comes just before SlotClosed; an
    exit seen first must not lose them."""
    master, runner = _scripted_master(tmp_path, bounded=True)

    def final_counts(conn: ScriptedConn) -> SlotMetrics:
        samples = []
        for chain_id, subtask in conn.tasks():
            uid = master.graph.chain(chain_id).head.uid
            op = OperatorSample(uid, uid, 100 + subtask, 0, 0.0, 0.0, None)
            samples.append(
                TaskMetricsSample((chain_id, subtask), [op], 0.0, 1000.0, 0.0, 0.0, None, None, 0)
            )
        return SlotMetrics(conn.index, samples)

    def finish(conn: ScriptedConn) -> None:
        if conn.index == runner.parallelism - 1:
            assert runner.on_exit is not None
            runner.on_exit(None)  # the exit overtakes the final report in the event queue
        conn.reply(final_counts(conn))
        conn.reply(SlotClosed(conn.index))

    runner.on_finish = finish
    master.run()
    p = runner.parallelism
    for vertex in master.metrics.vertices():
        assert vertex["operators"][0]["records_in"] == sum(100 + i for i in range(p))


def _stop_with_savepoint(master: JobMaster, directory: Path) -> tuple[JobClient, str]:
    client = JobClient(master)
    client.wait_until_running(WAIT)
    path = master.request_savepoint(str(directory), terminate=True).wait(WAIT)
    return client, path


def test_scripted_slots_stop_with_a_savepoint(tmp_path: Path) -> None:
    master, runner = _scripted_master(tmp_path, bounded=False)

    def finish(conn: ScriptedConn) -> None:
        conn.reply(SlotClosed(conn.index))
        conn.lose()

    runner.on_finish = finish
    client, path = _stop_with_savepoint(master, tmp_path / "sp")
    with pytest.raises(es.JobCancelled, match="stopped with a savepoint"):
        client.result(WAIT)
    assert load_metadata(path)[1].kind == "savepoint"
    assert runner.attempts == [1]
    for conn in runner.conns:
        sent = [type(m) for m in conn.sent]
        assert sent[-2:] == [NotifyCheckpointComplete, FinishSlot], "commit, then stop"


def test_a_broken_channel_while_stopping_with_a_savepoint_does_not_restart_the_job(
    tmp_path: Path,
) -> None:
    """After a stop-with-savepoint no slot sends END_OF_INPUT, so the slot that closes
    first breaks the other's input channels, which that one reports (secondary). The job
    stopped all the same: restarting it from the latest checkpoint, older than the
    savepoint whose transactions the sinks committed, would write them twice."""
    master, runner = _scripted_master(tmp_path, bounded=False)
    sink_chain = master.graph.chains[-1].chain_id

    def finish(conn: ScriptedConn) -> None:
        if conn.index == 0:
            return  # slot 0 closes first, once slot 1 has seen its channels break
        first, second = runner.conns
        second.reply(
            TaskFailed(
                task=(sink_chain, 1),
                description=f"input channel from {sink_chain} subtask 0 broke: EOFError()",
                traceback="",
                secondary=True,
            )
        )
        first.reply(SlotClosed(0))
        first.lose()
        second.reply(SlotClosed(1))
        second.lose()

    runner.on_finish = finish
    client, _ = _stop_with_savepoint(master, tmp_path / "sp")
    with pytest.raises(es.JobCancelled, match="stopped with a savepoint"):
        client.result(WAIT)
    assert runner.attempts == [1], "a stopped job is not restarted"


# ---------------------------------------------------------------- enumerators and global commits

class _TaggedBatches(SinkWriter):
    """Pre-commits each checkpoint interval's records, tagged with the checkpoint id, until
    it hears that a checkpoint covering them completed (the DeltaSink pattern)."""

    def __init__(self) -> None:
        self.buffer: list[int] = []
        self.pending: list[tuple[int, tuple[int, ...]]] = []

    def restore(self, entries: list[Any]) -> None:
        """The job master's committer commits the restored checkpoint."""

    def write_batch(self, records: list[Any]) -> None:
        self.buffer.extend(records)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self.buffer:
            self.pending.append((checkpoint_id, tuple(self.buffer)))
            self.buffer = []
        return list(self.pending)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.pending = [p for p in self.pending if p[0] > checkpoint_id]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Pending entries wait for the next completed checkpoint."""

    def end_input(self) -> None:
        """The final checkpoint covers the rest."""

    def close(self) -> None:
        """Nothing held."""


def _commits(log: Path) -> list[tuple[int, list[int]]]:
    if not log.exists():
        return []
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()]  # type: ignore[misc]


class _RecordingCommitter(GlobalCommitter):
    """Appends each commit to a JSON-lines log (the graph reaches the job master as a
    copy, so the record must live outside the objects)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def commit(self, checkpoint_id: int, entries: list[Any]) -> None:
        done = _commits(self.log)
        last = done[-1][0] if done else 0
        if checkpoint_id <= last:
            return
        new = sorted(r for tag, records in entries if tag > last for r in records)
        if new:
            with open(self.log, "a", encoding="utf-8") as f:
                f.write(json.dumps([checkpoint_id, new]) + "\n")


class _GlobalSink(es.sinks.Sink):
    transactional = True

    def __init__(self, log: Path) -> None:
        self.log = log

    def create_writer(self, ctx: es.sinks.SinkContext) -> SinkWriter:
        return _TaggedBatches()

    def create_committer(self, job_id: str) -> GlobalCommitter:
        return _RecordingCommitter(self.log)


def _drop_jsonl(directory: Path, name: str, values: range) -> None:
    hidden = directory / f".{name}"
    hidden.write_text("".join(f'{{"i": {i}}}\n' for i in values))
    os.replace(hidden, directory / name)


def _field_i(record: dict[str, int]) -> int:
    return record["i"]


def test_discovered_files_and_global_commits_are_exactly_once_across_a_failure(
    tmp_path: Path,
) -> None:
    inbox, markers, log = tmp_path / "in", tmp_path / "markers", tmp_path / "commits.jsonl"
    inbox.mkdir()
    markers.mkdir()
    _drop_jsonl(inbox, "a.jsonl", range(0, 40))
    _drop_jsonl(inbox, "b.jsonl", range(40, 80))
    env = _env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.05))
    fail = es.testing.FailOnce(after_checkpoints=1, subtask=0, marker_dir=str(markers))
    (
        env.from_files(str(inbox), format="jsonl", monitor_interval=0.05)
        .map(_field_i)
        .map(fail)
        .sink_to(_GlobalSink(log))
    )
    client, master = _running_client(env, "discover")
    try:
        _wait_for(lambda: bool(_commits(log)))
        for k, name in enumerate(["c.jsonl", "d.jsonl", "e.jsonl"]):  # both subtasks wait for one
            _drop_jsonl(inbox, name, range(80 + 30 * k, 110 + 30 * k))
        _wait_for(lambda: sum(len(c[1]) for c in _commits(log)) >= 170 and master.attempt == 2)
    finally:
        client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(WAIT)

    assert master.attempt == 2, "the injected failure restarted the job"
    commits = _commits(log)
    committed = sorted(r for _, records in commits for r in records)
    assert committed == list(range(170)), "each record committed once, none skipped"
    ids = [cid for cid, _ in commits]
    assert ids == sorted(set(ids)), f"one commit per checkpoint: {ids}"


def _split_files(conn: ScriptedConn) -> list[str]:
    return [os.path.basename(s.path) for m in conn.sent if isinstance(m, AddSplits) for s in m.splits]


def test_scripted_split_requests_get_pending_splits_then_discovered_ones(tmp_path: Path) -> None:
    """Splits of a monitored directory go to the subtask that asks; a request with
    nothing pending waits for discovery; triggers carry the pending splits."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    _drop_jsonl(inbox, "a.jsonl", range(0, 3))
    _drop_jsonl(inbox, "b.jsonl", range(3, 6))
    env = _env(tmp_path, interval=3_600.0)
    env.from_files(str(inbox), format="jsonl", monitor_interval=0.05).sink_to(
        es.sinks.DiscardSink()
    )
    runner = ScriptedRunner(2, bounded=False)
    master = JobMaster(env, env.job_graph("requests"), runner=runner)
    runner.master = master
    client = JobClient(master)
    client.wait_until_running(WAIT)
    (chain_id,) = [c.chain_id for c in master.graph.chains if c.is_source]
    first, second = runner.conns
    try:
        (deploy,) = [m for m in first.sent if isinstance(m, DeploySlot)]
        assert [t.splits for t in deploy.tasks if t.chain_id == chain_id] == [[]]
        second.reply(RequestSplit(chain_id, 1))
        _wait_for(lambda: _split_files(second) == ["a.jsonl"])
        master.request_savepoint(str(tmp_path / "sp"), terminate=False).wait(WAIT)
        (trigger,) = [m for m in second.sent if isinstance(m, TriggerCheckpoint)]
        stored = trigger.enumerators[chain_id]
        assert isinstance(stored, EnumeratorCheckpoint)
        assert [os.path.basename(s.path) for s in stored.pending] == ["b.jsonl"]
        second.reply(RequestSplit(chain_id, 1))  # the fast subtask asks again first
        first.reply(RequestSplit(chain_id, 0))
        _wait_for(lambda: _split_files(second) == ["a.jsonl", "b.jsonl"])
        time.sleep(0.2)  # discoveries run meanwhile and find nothing new
        assert _split_files(first) == [], "nothing pending: the request waits"
        _drop_jsonl(inbox, "c.jsonl", range(6, 9))
        _wait_for(lambda: _split_files(first) == ["c.jsonl"])
    finally:
        client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(WAIT)


def test_a_slot_that_registers_after_a_cancel_is_sent_away(tmp_path: Path) -> None:
    """Cancelling while a slot is still starting: when it registers, after the attempt
    ended, it is told to stop at once, so the cancel does not wait out the timeout."""

    class LateSlot(ThreadRunner):
        def __init__(self, parallelism: int, gate: threading.Event) -> None:
            super().__init__(parallelism)
            self.gate = gate

        def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
            def slot(index: int) -> None:
                if index == 1:
                    self.gate.wait(WAIT)
                try:
                    run_slot(launch, index=index, host="127.0.0.1")
                except BaseException as exc:
                    self.errors.append(exc)

            self._threads = [
                threading.Thread(target=slot, args=(i,), daemon=True) for i in range(self.parallelism)
            ]
            for t in self._threads:
                t.start()

    env = _env(tmp_path, checkpointing=False)
    env.from_collection([1]).sink_to(es.sinks.DiscardSink())
    gate = threading.Event()
    master = JobMaster(env, env.job_graph("late-slot"), runner=LateSlot(2, gate))
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            master.run()
        except BaseException as exc:
            outcome.append(exc)

    driver = threading.Thread(target=run, daemon=True)
    driver.start()
    _wait_for(lambda: len(master._slots) == 1)  # slot 0 registered, slot 1 still starting
    master.cancel()
    _wait_for(lambda: master.phase is Phase.FAILING)
    gate.set()  # slot 1 registers only now
    driver.join(20.0)  # the cancel timeout is 60 s
    assert not driver.is_alive(), "the cancel waited for a slot that registered late"
    assert len(outcome) == 1 and isinstance(outcome[0], es.JobCancelled)
