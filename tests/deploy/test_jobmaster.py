"""The job master with fake runners: slots as threads of this process, or a scripted plane.

``ThreadRunner`` (in ``jobmaster_support``) runs the real slot code (``run_slot``) in
threads, so the job master's control plane, the slots' data plane and the tasks are all
real, without subprocesses. ``ScriptedRunner`` (in ``test_jobmaster_scripted``) replaces
the slots by connections that answer like slots would, which fixes the order of events
that real slots produce on different threads.

This module: jobs that finish, fail, restart, time out or are cancelled.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import pytest
from jobmaster_support import (
    JOBMASTER_MARKS,
    WAIT,
    ThreadRunner,
    exactly_once_problems,
    make_env,
    sums_pipeline,
    wait_for,
)

import epochstream as es
from epochstream.connectors.kafka.client import KafkaClientError
from epochstream.core.clock import ManualClock
from epochstream.deploy import jobmaster as jobmaster_module
from epochstream.deploy.client import JobClient
from epochstream.deploy.jobmaster import JobMaster, Phase
from epochstream.deploy.runners import OnExit
from epochstream.exceptions import JobExecutionError
from epochstream.runtime.slot import SlotLaunch, run_slot

pytestmark = JOBMASTER_MARKS


# ---------------------------------------------------------------- finishing and failing


def test_bounded_job_finishes_with_a_result_and_a_final_checkpoint(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    n = 200
    sums_pipeline(env, env.from_collection(range(n)), tmp_path / "out")
    runner = ThreadRunner(2)
    master = JobMaster(env.job_description("bounded"), runner=runner)
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
    assert exactly_once_problems(es.testing.read_committed(tmp_path / "out"), n) == []


def test_a_failing_slot_restarts_from_the_latest_checkpoint_exactly_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = make_env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.05))
    n = 12_000  # 1.5 s of input: the first checkpoint completes well before its end
    markers = tmp_path / "markers"
    markers.mkdir()
    fail = es.testing.FailOnce(after_checkpoints=1, subtask=0, marker_dir=str(markers))
    source = env.from_sequence(0, n, rate=8_000).map(fail)
    sums_pipeline(env, source, tmp_path / "out")
    runner = ThreadRunner(2)
    master = JobMaster(env.job_description("failover"), runner=runner)
    with caplog.at_level(logging.WARNING, logger="epochstream.deploy.jobmaster"):
        result = master.run()

    assert result.restarts == 1 and runner.attempts == [1, 2] and runner.cancels == 1
    assert "InjectedFailure" in result.failures[0]
    assert "injected failure #1 in subtask 0" in result.failures[0]
    assert "attempt 2: restoring checkpoint" in caplog.text
    assert exactly_once_problems(es.testing.read_committed(tmp_path / "out"), n) == []


class _StartFails(ThreadRunner):
    """A ``ThreadRunner`` whose first ``failures`` starts raise ``error`` (Popen's EMFILE)."""

    def __init__(self, parallelism: int, failures: int, error: Exception) -> None:
        super().__init__(parallelism)
        self.failures = failures
        self.error = error
        self.tries = 0

    def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise self.error
        super().start(launch, on_exit)


def test_an_attempt_that_cannot_start_its_slots_goes_through_the_restart_strategy(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.01))
    sums_pipeline(env, env.from_collection(range(200)), tmp_path / "out")
    runner = _StartFails(2, failures=2, error=OSError(errno.EMFILE, "Too many open files"))
    result = JobMaster(env.job_description("emfile"), runner=runner).run()

    assert result.restarts == 2 and runner.attempts == [3]
    assert len(result.failures) == 2
    assert all(
        "could not start its slots" in f and "Too many open files" in f for f in result.failures
    )
    assert exactly_once_problems(es.testing.read_committed(tmp_path / "out"), 200) == []


def test_an_attempt_that_never_starts_ends_the_job_when_restarts_run_out(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.01))
    sums_pipeline(env, env.from_collection(range(20)), tmp_path / "out")
    runner = _StartFails(2, failures=99, error=OSError(errno.EAGAIN, "Resource unavailable"))
    with pytest.raises(JobExecutionError) as info:
        JobMaster(env.job_description("eagain"), runner=runner).run()

    assert info.value.restarts == 2 and runner.tries == 3 and runner.attempts == []
    assert "could not start its slots" in info.value.cause
    assert "Resource unavailable" in info.value.cause


def test_a_start_error_that_says_restarting_cannot_help_ends_the_job_at_once(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path, checkpointing=False)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.01))
    env.from_collection(range(20)).sink_to(es.sinks.DiscardSink())
    runner = _StartFails(2, failures=99, error=es.ConfigurationError("no such master"))
    with pytest.raises(JobExecutionError) as info:
        JobMaster(env.job_description("config"), runner=runner).run()

    assert info.value.restarts == 0 and runner.tries == 1
    assert "not recoverable by restarting" in str(info.value)


class _EnumerationFails:
    """Makes the first ``failures`` enumerators of a job master fail as a Kafka
    enumerator does when its broker is not up yet."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failures: int, error: Exception) -> None:
        self.calls = 0
        real = jobmaster_module.SourceEnumerators

        def enumerators(*args: object) -> object:
            self.calls += 1
            if self.calls <= failures:
                raise error
            return real(*args)

        monkeypatch.setattr(jobmaster_module, "SourceEnumerators", enumerators)


def test_sources_that_cannot_list_their_splits_go_through_the_restart_strategy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.01))
    sums_pipeline(env, env.from_collection(range(200)), tmp_path / "out")
    outage = _EnumerationFails(monkeypatch, 2, KafkaClientError("Broker transport failure"))
    runner = ThreadRunner(2)
    result = JobMaster(env.job_description("broker-late"), runner=runner).run()

    assert result.restarts == 2 and outage.calls == 3 and runner.attempts == [3]
    assert all(
        "could not list its sources' splits" in f and "Broker transport failure" in f
        for f in result.failures
    )
    assert exactly_once_problems(es.testing.read_committed(tmp_path / "out"), 200) == []


def test_a_source_misconfiguration_found_while_listing_splits_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.01))
    sums_pipeline(env, env.from_collection(range(20)), tmp_path / "out")
    outage = _EnumerationFails(
        monkeypatch, 99, es.ConfigurationError("topic(s) ['bds'] do not exist")
    )
    with pytest.raises(es.ConfigurationError, match="bds"):
        JobMaster(env.job_description("typo"), runner=ThreadRunner(2)).run()
    assert outage.calls == 1


def _reject_seven(i: int) -> int:
    if i == 7:
        raise es.DataError("record 7 is malformed")
    return i


def test_errors_that_suppress_restarts_fail_the_job_at_once(tmp_path: Path) -> None:
    env = make_env(tmp_path, checkpointing=False)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.05))
    env.from_collection(range(20)).map(_reject_seven).sink_to(es.sinks.DiscardSink())
    runner = ThreadRunner(2)
    master = JobMaster(env.job_description("data-error"), runner=runner)
    with pytest.raises(JobExecutionError) as info:
        master.run()
    err = info.value
    assert err.restarts == 0 and runner.attempts == [1]
    assert "not recoverable by restarting" in str(err)
    assert "failed on record 7" in err.cause and "record 7 is malformed" in err.cause
    assert err.history == [err.cause]


def test_slots_that_stop_heartbeating_fail_the_attempt(tmp_path: Path) -> None:
    """The heartbeat deadline runs on the injected clock: jump it, no real waiting."""
    env = make_env(tmp_path, checkpointing=False)
    env.from_sequence(0, 10**9, rate=100).sink_to(es.sinks.DiscardSink())
    clock = ManualClock(start=100.0)
    master = JobMaster(env.job_description("silent"), runner=ThreadRunner(2), clock=clock)
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

    env = make_env(tmp_path, checkpointing=False)
    env.from_collection([1]).sink_to(es.sinks.DiscardSink())
    clock = ManualClock()
    runner = NoSlots(clock)
    master = JobMaster(env.job_description("no-slots"), runner=runner, clock=clock)
    with pytest.raises(JobExecutionError) as info:
        master.run()
    assert "only 0 of 2 slots registered within 180s" in info.value.cause
    assert runner.cancels == 1 and runner.closed


# ---------------------------------------------------------------- cancelling


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
                threading.Thread(target=slot, args=(i,), daemon=True)
                for i in range(self.parallelism)
            ]
            for t in self._threads:
                t.start()

    env = make_env(tmp_path, checkpointing=False)
    env.from_collection([1]).sink_to(es.sinks.DiscardSink())
    gate = threading.Event()
    master = JobMaster(env.job_description("late-slot"), runner=LateSlot(2, gate))
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            master.run()
        except BaseException as exc:
            outcome.append(exc)

    driver = threading.Thread(target=run, daemon=True)
    driver.start()
    wait_for(lambda: len(master._slots) == 1)  # slot 0 registered, slot 1 still starting
    master.cancel()
    wait_for(lambda: master.phase is Phase.FAILING)
    gate.set()  # slot 1 registers only now
    driver.join(20.0)  # the cancel timeout is 60 s
    assert not driver.is_alive(), "the cancel waited for a slot that registered late"
    assert len(outcome) == 1 and isinstance(outcome[0], es.JobCancelled)
