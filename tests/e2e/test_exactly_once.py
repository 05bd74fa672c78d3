"""Exactly-once word count through the two-phase-commit FileSink, with a real crash.

A slot's process is found by PID and SIGKILLed mid-run; the job must recover from its
latest checkpoint and the committed output must be exactly the failure-free updates:
each ``(word, k)`` for ``k = 1..count(word)`` once, no more, no less.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from e2e_support import build_wordcount, exactly_once_problems, is_python_process, write_corpus

import epochstream as es

LINES = 20_000
# Each source subtask reads about LINES / 2 lines, so one attempt lasts about 3.3 s.
LINES_PER_SECOND = 3_000


def _kill_mid_run(client: es.JobClient, out: Path, slot: int, total_updates: int) -> int:
    """SIGKILL ``slot``'s process after the first checkpoint, proving the job was mid-run."""
    client.wait_for_checkpoint(1, timeout=120)
    pids = client.slot_pids()
    pid = pids[slot]
    assert pid != os.getpid(), "slot PID is the test process itself"
    assert is_python_process(pid), f"slot {slot} PID {pid} is not a live Python process"
    committed_before = len(es.testing.read_committed(out))
    # Output is committed only by completed checkpoints (the last one at end of input), so
    # a partial commit proves the input is not fully processed and the job not finished.
    assert not client.done, "job finished before the kill: input too small or too fast"
    assert committed_before < total_updates, "all output committed before the kill"
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.slow
@pytest.mark.parametrize(
    ("runner", "slot"),
    [pytest.param("spark", 0, marks=pytest.mark.spark), pytest.param("local", 1)],
)
def test_wordcount_survives_sigkill_of_a_slot(
    runner: str, slot: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=LINES, seed=20_240_601)
    total_updates = sum(expected.values())
    options: dict[str, Any] = {"runner": runner}
    if runner == "spark":
        options["spark"] = request.getfixturevalue("spark")
    env = es.Environment(parallelism=2, **options)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    build_wordcount(env, text, out, lines_per_second=LINES_PER_SECOND)

    client = env.execute_async("wordcount-sigkill")
    try:
        killed = _kill_mid_run(client, out, slot, total_updates)
        result = client.result(timeout=240)
    finally:
        if not client.done:
            client.cancel()

    assert result.restarts >= 1, f"SIGKILL of pid {killed} caused no restart"
    assert len(result.failures) == result.restarts
    assert killed not in client.slot_pids().values()
    rows = es.testing.read_committed(out)
    assert exactly_once_problems(rows, expected) == []
    assert len(rows) == total_updates
    ids = [c.checkpoint_id for c in result.checkpoints]
    assert ids == sorted(set(ids)), f"checkpoint ids not unique and increasing: {ids}"


@pytest.mark.slow
def test_restarts_exhausted_raise_job_execution_error(tmp_path: Path, failure_markers: str) -> None:
    injector = es.testing.FailOnce(
        after_records=2_000, subtask=0, times=5, marker_dir=failure_markers
    )
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.1))
    (
        env.from_sequence(0, 200_000, rate=50_000)
        .map(injector)
        .map(lambda i: (i % 3, 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )

    with pytest.raises(es.JobExecutionError) as info:
        env.execute("exhaust-restarts")

    err = info.value
    assert err.restarts == 2
    assert len(err.history) == 3
    for attempt, failure in enumerate(err.history, start=1):
        assert f"injected failure #{attempt}" in failure, failure
    assert err.cause == err.history[0]
    # No fourth attempt ran: the injector fired exactly once per attempt.
    assert injector.failures_so_far() == 3
