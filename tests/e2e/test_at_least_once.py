"""At-least-once checkpointing: after a crash nothing is lost; duplicates are allowed.

In ``at_least_once`` mode barriers are counted, not aligned: a task snapshots when the
barrier arrived on every input but keeps processing inputs whose barrier came first. The
restored state may therefore already hold records that the restored sources replay, so a
count may end above the truth and updates may repeat. What must hold: every update
``(word, k)`` for ``k = 1..true count`` is in the committed output, and no count ends below
its true total.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_support import at_least_once_problems, build_wordcount, final_values, write_corpus

import epochstream as es


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_at_least_once_crash_loses_nothing(
    runner: str, tmp_path: Path, failure_markers: str, request: pytest.FixtureRequest
) -> None:
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=16_000, seed=4242)
    options: dict[str, Any] = {"runner": runner}
    if runner == "spark":
        options["spark"] = request.getfixturevalue("spark")
    env = es.Environment(parallelism=2, **options)
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"), mode="at_least_once")
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    # A real crash (SIGKILL of the slot's own process) after 2000 lines of subtask 0, once a
    # checkpoint completed; at 3000 lines/s its 8000 lines last about 2.7 s.
    crash = es.testing.FailOnce(
        after_records=2_000, after_checkpoints=1, subtask=0, crash=True, marker_dir=failure_markers
    )
    build_wordcount(env, text, out, lines_per_second=3_000, inject=crash)

    result = env.execute("wordcount-at-least-once")

    assert crash.failures_so_far() == 1
    assert result.restarts >= 1
    assert result.checkpoints, "no checkpoint completed"
    rows = es.testing.read_committed(out)
    assert at_least_once_problems(rows, expected) == []
    assert set(final_values(rows)) == set(expected)
    assert len(rows) >= sum(expected.values())
