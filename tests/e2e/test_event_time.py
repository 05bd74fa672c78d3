"""Event time end to end on Spark: windowed word counts against a batch oracle, late
data, a crash with open windows, sessions across a restore, a savepoint with open
windows and timers resumed at another parallelism, and an idle split.

Events are a pure function of their sequence number (``event(i)``), so the oracle is
computed from the same function, and any order the parallel sources produce them in
must give the same results.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

BASE = 1_700_000_000_000  # ms since the epoch
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
WINDOW = 5_000
BOUND = 2_000


def event(i: int) -> tuple[int, str]:
    """Event ``i``: (timestamp, word). Timestamps advance 10 ms per event and jitter by
    up to 1.9 s backwards (within the 2 s bound)."""
    jitter = (i * 7_919) % 1_900
    return (BASE + i * 10 - jitter, WORDS[(i * 31 + i // 7) % len(WORDS)])


def strategy() -> es.WatermarkStrategy:
    return es.WatermarkStrategy.bounded_out_of_orderness(
        timedelta(milliseconds=BOUND)
    ).with_timestamp_assigner(lambda e, ts: e[0])


class WindowCount(es.ProcessWindowFunction):
    """(window start, word, count) per window."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for count in elements:
            out.collect([ctx.window.start, key, count])


class Count(es.AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


def tumbling_oracle(n: int) -> collections.Counter[tuple[int, str, int]]:
    counts: collections.Counter[tuple[int, str]] = collections.Counter()
    for i in range(n):
        ts, word = event(i)
        counts[(ts - (ts % WINDOW), word)] += 1
    return collections.Counter((start, word, c) for (start, word), c in counts.items())


def _rows(out: Path) -> collections.Counter[tuple[Any, ...]]:
    return collections.Counter(tuple(r) for r in es.testing.read_committed(out))


def _windowed_counts(env: es.Environment, n: int, out: Path, *, rate: float | None = None) -> None:
    (
        env.from_sequence(0, n, rate=rate)
        .uid("numbers")
        .map(event)
        .assign_timestamps_and_watermarks(strategy())
        .key_by(lambda e: e[1])
        .window(es.TumblingEventTimeWindows.of(WINDOW))
        .aggregate(Count(), WindowCount())
        .uid("window-counts")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


def test_windowed_word_count_is_exact_and_order_does_not_matter(spark: Any, tmp_path: Path) -> None:
    n = 30_000
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.5, storage=str(tmp_path / "ckpt"))
    _windowed_counts(env, n, tmp_path / "out")
    env.execute("windowed-counts")
    assert _rows(tmp_path / "out") == tumbling_oracle(n)


def test_a_crash_with_open_windows_commits_each_result_once(spark: Any, tmp_path: Path) -> None:
    n = 40_000
    out = tmp_path / "out"
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    _windowed_counts(env, n, out, rate=8_000)
    client = env.execute_async("windowed-crash")
    try:
        client.wait_for_checkpoint(2, timeout=120)
        assert not client.done
        os.kill(client.slot_pids()[1], signal.SIGKILL)
        result = client.result(timeout=240)
    finally:
        if not client.done:
            client.cancel()
    assert result.restarts >= 1
    rows = _rows(out)
    assert rows == tumbling_oracle(n), "every window result committed exactly once"


def _timestamped_text(path: Path, lines: int) -> collections.Counter[tuple[str, int]]:
    """Lines ``"<ms> word word ..."``, up to 1.5 s out of order; the oracle counts
    (word, count) per 5 s window."""
    counts: collections.Counter[tuple[int, str]] = collections.Counter()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            ts = BASE + i * 37 - (i * 613) % 1_500
            words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(1 + i % 4)]
            f.write(f"{ts} {' '.join(words)}\n")
            for word in words:
                counts[(ts - ts % WINDOW, word)] += 1
    return collections.Counter((word, n) for (_, word), n in counts.items())


def test_the_seeds_windowed_word_count_over_timestamped_text(spark: Any, tmp_path: Path) -> None:
    expected = _timestamped_text(tmp_path / "words.txt", 8_000)
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.5, storage=str(tmp_path / "ckpt"))
    (
        env.from_text_file(str(tmp_path / "words.txt"))
        .assign_timestamps_and_watermarks(
            es.WatermarkStrategy.bounded_out_of_orderness(
                timedelta(seconds=2)
            ).with_timestamp_assigner(lambda line, ts: int(line.split(" ", 1)[0]))
        )
        .flat_map(lambda line: line.split()[1:])
        .map(lambda w: (w, 1))
        .key_by(lambda t: t[0])
        .window(es.TumblingEventTimeWindows.of(timedelta(seconds=5)))
        .sum(1)
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("seed-window-wordcount")
    assert _rows(tmp_path / "out") == expected


# ---------------------------------------------------------------- late data


def test_late_records_go_to_the_side_output_and_lateness_refires(
    spark: Any, tmp_path: Path
) -> None:
    # (timestamp, word): in order within the 1 s bound, then two records far behind.
    events = [(1_000, "a"), (2_500, "a"), (1_800, "a"), (4_000, "b"), (6_200, "a")]
    events += [(4_900, "a")]  # watermark 5_199: window [0,5000) has fired; lateness keeps it
    events += [(12_000, "b"), (3_000, "a")]  # watermark 10_999: window [0,5000) is gone
    events += [(13_000, "b")]
    late = es.OutputTag("late")
    env = es.Environment(parallelism=1, spark=spark)
    env.enable_checkpointing(0.5, storage=str(tmp_path / "ckpt"))
    counts = (
        env.from_collection(events)
        .assign_timestamps_and_watermarks(
            es.WatermarkStrategy.bounded_out_of_orderness(1_000).with_timestamp_assigner(
                lambda e, ts: e[0]
            )
        )
        .key_by(lambda e: e[1])
        .window(es.TumblingEventTimeWindows.of(5_000))
        .allowed_lateness(timedelta(seconds=3))
        .side_output_late_data(late)
        .aggregate(Count(), WindowCount())
    )
    counts.sink_to(es.sinks.FileSink(str(tmp_path / "counts")))
    counts.get_side_output(late).map(list).sink_to(es.sinks.FileSink(str(tmp_path / "late")))
    env.execute("late-data")
    assert sorted(es.testing.read_committed(tmp_path / "counts")) == sorted(
        [
            [0, "a", 3],  # fired at watermark 5_199 (after 6_200)...
            [0, "a", 4],  # ...and again for the late 4_900 (within the allowed lateness)
            [0, "b", 1],
            [5_000, "a", 1],
            [10_000, "b", 2],
        ]
    )
    assert es.testing.read_committed(tmp_path / "late") == [[3_000, "a"]]


# ---------------------------------------------------------------- sessions


SESSION_GAP = 1_000


def session_event(i: int) -> tuple[int, str, int]:
    """(timestamp, user, value): each user is active in bursts of 20 events 100 ms
    apart, bursts separated by 3 s; users are interleaved."""
    user = f"u{i % 5}"
    k = i // 5
    burst, within = divmod(k, 20)
    return (BASE + burst * 5_000 + within * 100, user, i)


def session_oracle(n: int) -> collections.Counter[tuple[Any, ...]]:
    by_user: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for i in range(n):
        ts, user, value = session_event(i)
        by_user[user].append((ts, value))
    out: collections.Counter[tuple[Any, ...]] = collections.Counter()
    for user, items in by_user.items():
        items.sort()
        start, end, total = items[0][0], items[0][0] + SESSION_GAP, 0
        for ts, value in items:
            if ts >= end:
                out[(user, start, end, total)] += 1
                start, total = ts, 0
            end = max(end, ts + SESSION_GAP)
            total += value
        out[(user, start, end, total)] += 1
    return out


class SessionSum(es.ProcessWindowFunction):
    """[user, session start, session end, sum of values] from the reduced (ts, user, sum)."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for _, _, total in elements:
            out.collect([key, ctx.window.start, ctx.window.end, total])


def test_session_windows_merge_across_a_checkpoint_and_a_restore(
    spark: Any, tmp_path: Path, failure_markers: str
) -> None:
    n = 4_000
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    (
        env.from_sequence(0, n, rate=2_000)
        .map(session_event)
        .map(
            es.testing.FailOnce(
                after_records=1_200, after_checkpoints=2, subtask=0, marker_dir=failure_markers
            )
        )
        .assign_timestamps_and_watermarks(
            es.WatermarkStrategy.bounded_out_of_orderness(500).with_timestamp_assigner(
                lambda e, ts: e[0]
            )
        )
        .key_by(lambda e: e[1])
        .window(es.EventTimeSessionWindows.with_gap(SESSION_GAP))
        .reduce(lambda a, b: (max(a[0], b[0]), a[1], a[2] + b[2]), SessionSum())
        .uid("sessions")
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    result = env.execute("sessions")
    assert result.restarts == 1
    assert _rows(tmp_path / "out") == session_oracle(n)


# ---------------------------------------------------------------- savepoint with open windows


#: Past what the first job's watermark reaches before it is stopped: the timers are
#: pending in the savepoint.
DEADLINE = BASE + 150_000


class Deadline(es.KeyedProcessFunction):
    """Per key: an event-time timer at DEADLINE, emitting how many events it saw."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(es.state.ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        if self.count.value() == 0:
            ctx.timer_service().register_event_time_timer(DEADLINE)
        self.count.update(self.count.value() + 1)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        out.collect(["deadline", ctx.current_key, self.count.value(), timestamp])


def _savepoint_job(env: es.Environment, n: int, out: Path, rate: float | None) -> None:
    keyed = (
        env.from_sequence(0, n, rate=rate)
        .uid("numbers")
        .map(event)
        .uid("events")
        .assign_timestamps_and_watermarks(strategy())
        .uid("timestamps")
        .key_by(lambda e: e[1])
    )
    keyed.window(es.TumblingEventTimeWindows.of(WINDOW)).aggregate(Count(), WindowCount()).uid(
        "window-counts"
    ).sink_to(es.sinks.FileSink(str(out / "windows"))).uid("window-files")
    keyed.process(Deadline()).uid("deadlines").sink_to(
        es.sinks.FileSink(str(out / "deadlines"))
    ).uid("deadline-files")


def test_savepoint_with_open_windows_and_timers_resumes_at_another_parallelism(
    spark: Any, tmp_path: Path
) -> None:
    n = 20_000
    out = tmp_path / "out"
    first = es.Environment(parallelism=2, spark=spark)
    first.enable_checkpointing(0.5, storage=str(tmp_path / "ckpt"))
    _savepoint_job(first, n, out, rate=5_000)
    client = first.execute_async("v1")
    client.wait_for_checkpoint(1, timeout=120)
    time.sleep(0.5)
    path = client.cancel(savepoint=str(tmp_path / "sp"))
    assert not (_rows(out / "windows") == tumbling_oracle(n)), "stopped before the end"

    second = es.Environment(parallelism=3, spark=spark)
    second.enable_checkpointing(0.5, storage=str(tmp_path / "ckpt"))
    _savepoint_job(second, n, out, rate=None)
    second.execute("v2", from_savepoint=path)

    assert _rows(out / "windows") == tumbling_oracle(n)
    deadlines = es.testing.read_committed(out / "deadlines")
    assert sorted((w, t) for _, w, _, t in deadlines) == sorted((w, DEADLINE) for w in WORDS), (
        "each key's timer fired once, after the savepoint"
    )


# ---------------------------------------------------------------- idleness


class TwoSplits(es.sources.Source):
    """Split ``busy`` yields timestamps forever (slowly); split ``idle`` never yields."""

    bounded = False
    replayable = True

    def create_splits(self, parallelism: int) -> list[Any]:
        return [_Split("busy", 0), _Split("idle", 0)]

    def create_reader(self, ctx: Any) -> Any:
        return _TwoSplitReader()


class _Split:
    def __init__(self, split_id: str, position: int) -> None:
        self.split_id = split_id
        self.position = position


class _TwoSplitReader(es.sources.SourceReader):
    def __init__(self) -> None:
        self.splits: list[_Split] = []
        self.last = 0.0

    def add_splits(self, splits: list[Any]) -> None:
        self.splits.extend(splits)

    def poll(self, max_records: int) -> list[Any]:
        return [r for _, records, _ in self.poll_splits(max_records) for r in records]

    def poll_splits(self, max_records: int) -> list[tuple[Any, list[Any], bool]]:
        out: list[tuple[Any, list[Any], bool]] = []
        now = time.monotonic()
        for split in self.splits:
            if split.split_id == "busy" and now - self.last >= 0.01:
                self.last = now
                records = [BASE + (split.position + k) * 100 for k in range(10)]
                split.position += 10
                out.append((split.split_id, records, False))
        return out

    @property
    def exhausted(self) -> bool:
        return False

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        return [_Split(s.split_id, s.position) for s in self.splits]

    def close(self) -> None:
        self.splits = []


def test_an_idle_split_stops_holding_back_windows_after_the_timeout(
    spark: Any, tmp_path: Path
) -> None:
    env = es.Environment(parallelism=1, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    strategy_ = (
        es.WatermarkStrategy.monotonous_timestamps()
        .with_timestamp_assigner(lambda ts, previous: ts)
        .with_idleness(timedelta(milliseconds=500))
    )
    (
        env.from_source(TwoSplits(), watermark_strategy=strategy_)
        .key_by(lambda ts: "all")
        .window(es.TumblingEventTimeWindows.of(1_000))
        .aggregate(Count(), WindowCount())
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    client = env.execute_async("idle-split")
    try:
        deadline = time.monotonic() + 60
        rows: list[Any] = []
        while time.monotonic() < deadline and len(rows) < 3:
            time.sleep(0.3)
            if (tmp_path / "out").is_dir():
                rows = es.testing.read_committed(tmp_path / "out")
    finally:
        client.cancel()
    assert len(rows) >= 3, "windows fire although one split never produces anything"
    assert all(r[1:] == ["all", 10] for r in rows[:3]), rows[:3]
