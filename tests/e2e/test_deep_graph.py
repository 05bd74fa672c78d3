"""Exactly-once across several network edges (rebalance, two key_by shuffles) with a crash."""

from __future__ import annotations

import collections

import pytest

import epochstream as es


class KeyedCounter(es.MapFunction):
    """A map on a keyed stream using keyed state: counts records per key."""

    def open(self, ctx):
        self.count = ctx.get_state(es.state.ValueStateDescriptor("count", default=0))

    def map(self, value):
        self.count.update(self.count.value() + 1)
        return [value[0], self.count.value()]


@pytest.mark.slow
def test_three_stage_graph_recovers_exactly_once(tmp_path) -> None:
    n = 90_000
    env = es.Environment(parallelism=3, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    (
        env.from_sequence(0, n, rate=60_000)
        .rebalance()
        .map(lambda i: (i % 101, i))
        .key_by(lambda t: t[0])
        .map(KeyedCounter())
        .uid("count-a")
        .map(es.testing.FailOnce(after_records=10_000, after_checkpoints=2, subtask=2, crash=True))
        .key_by(lambda t: t[1] % 7)
        .filter(lambda t: t[1] % 10 == 0)
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    result = env.execute("deep")
    assert result.restarts == 1
    rows = collections.Counter(tuple(r) for r in es.testing.read_committed(tmp_path / "out"))
    expected = collections.Counter(
        (k, c) for k in range(101) for c in range(10, len(range(k, n, 101)) + 1, 10)
    )
    assert rows == expected
