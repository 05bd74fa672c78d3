"""Checkpointing off: a failure restarts the job from scratch, or fails it for good.

This is the "gap/rollback" behaviour: with no checkpoint to restore, a restart rolls the
whole job back to the beginning. Keyed state starts empty and the (replayable) sources
rewind to their first record, so the final results are still complete and correct (no
gap), but everything the earlier attempt already published stays published: the FileSink
commits on roll and at end of input when checkpointing is off (at-least-once), so the
output holds the earlier attempt's updates twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from e2e_support import at_least_once_problems, final_values, update_counts

import epochstream as es

N = 80_000
KEYS = 7


def _count_pipeline(env: es.Environment, inject: es.testing.FailOnce, out: Path) -> None:
    (
        env.from_sequence(0, N, rate=40_000)  # about 2 s per attempt
        .map(inject)
        .map(lambda i: (i % KEYS, 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .sink_to(es.sinks.FileSink(str(out), roll_records=500))
    )


@pytest.mark.slow
def test_restart_without_checkpoint_replays_from_scratch(
    tmp_path: Path, failure_markers: str
) -> None:
    out = tmp_path / "out"
    env = es.Environment(parallelism=2, runner="local")
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.1))
    inject = es.testing.FailOnce(after_records=10_000, subtask=1, marker_dir=failure_markers)
    _count_pipeline(env, inject, out)

    result = env.execute("no-checkpoints-restart")

    assert result.restarts == 1
    assert result.checkpoints == []
    assert "injected failure #1" in result.failures[0]
    expected = Counter(i % KEYS for i in range(N))
    rows = es.testing.read_committed(out)
    # Full-run results: every update of the last attempt, and exact final counts. A restored
    # (non-empty) state would end above the truth, an unrewound source below it.
    assert at_least_once_problems(rows, expected) == []
    assert final_values(rows) == dict(expected)
    seen = update_counts(rows)
    assert max(seen.values()) == 2, "an update was committed more than twice (two attempts)"
    duplicated = {u for u, n in seen.items() if n == 2}
    assert duplicated, "the first attempt committed nothing before failing (no rollback shown)"
    # The first attempt's committed output per key is a prefix of its updates (rolled
    # files in order), and the restart from scratch re-emitted that prefix from count 1.
    for key in expected:
        counts = sorted(k for (kk, k) in duplicated if kk == key)
        assert counts == list(range(1, len(counts) + 1)), f"key {key}: duplicates {counts[:10]}"
    assert len(rows) == sum(expected.values()) + len(duplicated)


@pytest.mark.slow
def test_failure_without_restart_strategy_fails_the_job(
    tmp_path: Path, failure_markers: str
) -> None:
    env = es.Environment(parallelism=2, runner="local")  # no checkpointing: default none()
    inject = es.testing.FailOnce(after_records=1_000, subtask=0, marker_dir=failure_markers)
    _count_pipeline(env, inject, tmp_path / "out")

    with pytest.raises(es.JobExecutionError) as info:
        env.execute("no-restart-strategy")

    err = info.value
    assert "injected failure #1" in err.cause
    assert "InjectedFailure" in err.cause
    assert err.restarts == 0
    assert len(err.history) == 1
    assert inject.failures_so_far() == 1
