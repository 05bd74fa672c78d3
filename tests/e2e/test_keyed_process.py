"""A KeyedProcessFunction counting per key in ValueState survives a crash with exact counts.

The count lives only in keyed state, so after the crash it must come back from the
checkpoint: a lost state would restart counts at 1 (duplicated updates), a replay on top
of a restored state would skip or repeat counts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from e2e_support import CountPerKey, exactly_once_problems

import epochstream as es

N = 120_000
KEYS = 11


def _key(i: int) -> str:
    return f"k{i % KEYS}"


@pytest.mark.slow
def test_value_state_counts_are_exact_after_crash(tmp_path: Path, failure_markers: str) -> None:
    out = tmp_path / "out"
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    crash = es.testing.FailOnce(
        after_records=15_000, after_checkpoints=1, subtask=1, crash=True, marker_dir=failure_markers
    )
    (
        env.from_sequence(0, N, rate=60_000)  # about 2 s: the crash lands mid-run
        .map(crash)
        .key_by(_key)
        .process(CountPerKey())
        .uid("count-per-key")
        .sink_to(es.sinks.FileSink(str(out)))
    )

    result = env.execute("keyed-process-count")

    assert crash.failures_so_far() == 1
    assert result.restarts >= 1
    assert any(c.state_size > 0 for c in result.checkpoints), "checkpoints hold no keyed state"
    expected = Counter(_key(i) for i in range(N))
    rows = es.testing.read_committed(out)
    assert exactly_once_problems(rows, expected) == []
    assert len(rows) == N


class AllStateKinds(es.KeyedProcessFunction):
    """Uses every keyed state kind through the names Flink users reach for."""

    def open(self, ctx):
        self.items = ctx.get_list_state(es.state.ListStateDescriptor("items"))
        self.seen = ctx.get_map_state(es.state.MapStateDescriptor("seen"))
        self.total = ctx.get_reducing_state(
            es.state.ReducingStateDescriptor("total", lambda a, b: a + b)
        )
        self.value = ctx.get_state(es.state.ValueStateDescriptor("last"))
        self.per_subtask = ctx.get_list_state("records-in-subtask")  # operator list state

    def process_element(self, value, ctx, out):
        self.items.add(value)
        self.seen.put(value, True)
        self.total.add(value)
        self.value.update(value)
        count = self.per_subtask.get()
        self.per_subtask.update([(count[0] if count else 0) + 1])
        out.collect(
            [ctx.current_key, len(self.items.get()), len(self.seen.keys()), self.total.get()]
        )


@pytest.mark.slow
def test_keyed_list_map_reducing_state_are_per_key(tmp_path) -> None:
    env = es.Environment(parallelism=2, runner="local")
    (
        env.from_sequence(0, 300)
        .key_by(lambda i: i % 3)
        .process(AllStateKinds())
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("state-kinds")
    rows = es.testing.read_committed(tmp_path / "out")
    last = {}
    for key, n_items, n_seen, total in rows:
        last[key] = (n_items, n_seen, total)
    assert last == {k: (100, 100, sum(range(k, 300, 3))) for k in range(3)}
