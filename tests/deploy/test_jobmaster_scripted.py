"""The job master against a scripted control plane: ``ScriptedRunner`` starts connections
that answer as slots would, so the order of the events is fixed by the test: finishing,
runner exits that overtake slot messages, stop with a savepoint, split requests."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jobmaster_support import JOBMASTER_MARKS, WAIT, drop_jsonl, make_env, mod3, wait_for

import epochstream as es
from epochstream.checkpoint.storage import load_metadata
from epochstream.deploy.client import JobClient
from epochstream.deploy.enumeration import EnumeratorCheckpoint
from epochstream.deploy.jobmaster import JobMaster
from epochstream.deploy.runners import OnExit, Runner
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
from epochstream.runtime.slot import SlotLaunch

pytestmark = JOBMASTER_MARKS


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
    env = make_env(tmp_path, checkpointing=not bounded, interval=3_600.0)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=1, delay=0.0))
    env.from_collection([1, 2, 3]).map(mod3).key_by(mod3).sink_to(es.sinks.DiscardSink())
    runner = ScriptedRunner(2, bounded=bounded)
    master = JobMaster(env.job_description("scripted"), runner=runner)
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


def _split_files(conn: ScriptedConn) -> list[str]:
    return [
        os.path.basename(s.path) for m in conn.sent if isinstance(m, AddSplits) for s in m.splits
    ]


def test_scripted_split_requests_get_pending_splits_then_discovered_ones(tmp_path: Path) -> None:
    """Splits of a monitored directory go to the subtask that asks; a request with
    nothing pending waits for discovery; triggers carry the pending splits."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    drop_jsonl(inbox, "a.jsonl", range(0, 3))
    drop_jsonl(inbox, "b.jsonl", range(3, 6))
    env = make_env(tmp_path, interval=3_600.0)
    env.from_files(str(inbox), format="jsonl", monitor_interval=0.05).sink_to(
        es.sinks.DiscardSink()
    )
    runner = ScriptedRunner(2, bounded=False)
    master = JobMaster(env.job_description("requests"), runner=runner)
    runner.master = master
    client = JobClient(master)
    client.wait_until_running(WAIT)
    (chain_id,) = [c.chain_id for c in master.graph.chains if c.is_source]
    first, second = runner.conns
    try:
        (deploy,) = [m for m in first.sent if isinstance(m, DeploySlot)]
        assert [t.splits for t in deploy.tasks if t.chain_id == chain_id] == [[]]
        second.reply(RequestSplit(chain_id, 1))
        wait_for(lambda: _split_files(second) == ["a.jsonl"])
        master.request_savepoint(str(tmp_path / "sp"), terminate=False).wait(WAIT)
        (trigger,) = [m for m in second.sent if isinstance(m, TriggerCheckpoint)]
        stored = trigger.enumerators[chain_id]
        assert isinstance(stored, EnumeratorCheckpoint)
        assert [os.path.basename(s.path) for s in stored.pending] == ["b.jsonl"]
        second.reply(RequestSplit(chain_id, 1))  # the fast subtask asks again first
        first.reply(RequestSplit(chain_id, 0))
        wait_for(lambda: _split_files(second) == ["a.jsonl", "b.jsonl"])
        time.sleep(0.2)  # discoveries run meanwhile and find nothing new
        assert _split_files(first) == [], "nothing pending: the request waits"
        drop_jsonl(inbox, "c.jsonl", range(6, 9))
        wait_for(lambda: _split_files(first) == ["c.jsonl"])
    finally:
        client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(WAIT)
