"""Operator (non-keyed) list state in a user function survives a crash exactly once."""

from __future__ import annotations

import collections

import pytest

import epochstream as es


class RunningCount(es.MapFunction):
    """Counts the records its subtask saw, in operator list state; emits [subtask, count]."""

    def open(self, ctx):
        self.subtask = ctx.subtask_index
        self.state = ctx.get_list_state("count")
        restored = self.state.get()
        self.count = restored[0] if restored else 0

    def map(self, value):
        self.count += 1
        self.state.update([self.count])
        return [self.subtask, self.count]


@pytest.mark.slow
def test_operator_list_state_restores_after_crash(tmp_path) -> None:
    n = 60_000
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.1))
    (
        env.from_sequence(0, n, rate=40_000)
        .map(es.testing.FailOnce(after_records=8_000, after_checkpoints=1, subtask=0, crash=True))
        .map(RunningCount())
        .uid("running-count")
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    result = env.execute("operator-state")
    assert result.restarts == 1
    rows = collections.Counter(tuple(r) for r in es.testing.read_committed(tmp_path / "out"))
    # from_sequence gives each subtask one contiguous half; each subtask's count must run
    # 1..n/2 with every value committed exactly once (restored state, rewound source).
    expected = {(s, k): 1 for s in (0, 1) for k in range(1, n // 2 + 1)}
    assert dict(rows) == expected
