"""Savepoints through the job master with ``ThreadRunner`` slots: of a running job, stop
with a savepoint, without checkpointing, and a runner lost on cancel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from jobmaster_support import (
    JOBMASTER_MARKS,
    WAIT,
    ThreadRunner,
    make_env,
    mod3,
    running_client,
    sums_pipeline,
    wait_for,
)

import epochstream as es
from epochstream.checkpoint.storage import load_metadata
from epochstream.deploy.jobmaster import JobMaster
from epochstream.deploy.runners import RunnerLost
from epochstream.exceptions import CheckpointError, JobExecutionError

pytestmark = JOBMASTER_MARKS


def _explode_on_13(i: int) -> int:
    if i == 13:
        raise ValueError("thirteen is unlucky")
    return i


# ---------------------------------------------------------------- savepoints


def test_savepoint_of_a_running_job(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    sums_pipeline(env, env.from_sequence(0, 10**9, rate=2_000), tmp_path / "out")
    client, master = running_client(env, "savepoint")
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
    env = make_env(tmp_path, parallelism=1)
    n = 10**9
    out = tmp_path / "out"
    (
        env.from_sequence(0, n, rate=4_000)
        .uid("numbers")
        .key_by(mod3)
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )
    client, master = running_client(env, "stop")
    wait_for(lambda: os.path.isdir(out) and es.testing.read_committed(out) != [])
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
    env = make_env(tmp_path, checkpointing=False)
    env.from_sequence(0, 10**9, rate=100).sink_to(es.sinks.DiscardSink())
    client, _ = running_client(env, "no-checkpoints")
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

    env = make_env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.05))
    markers = tmp_path / "markers"
    markers.mkdir()
    fail = es.testing.FailOnce(after_checkpoints=1, subtask=1, marker_dir=str(markers))
    sums_pipeline(env, env.from_sequence(0, 10**9, rate=8_000).map(fail), tmp_path / "out")
    runner = LosingRunner(2)
    master = JobMaster(env.job_description("lost"), runner=runner)
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

    env = make_env(tmp_path, checkpointing=False)
    env.from_collection(range(20)).map(_explode_on_13).sink_to(es.sinks.DiscardSink())
    master = JobMaster(env.job_description("lost"), runner=LosingRunner(2))
    with pytest.raises(JobExecutionError) as info:
        master.run()
    err = info.value
    assert "failed on record 13" in err.cause, "the first cause is the task's failure"
    assert len(err.history) == 2 and err.history[1] == "the Spark context was lost"
