"""Columnar joins end to end.

1. Golden: on random rows, the columnar window join (tumbling and sliding) gives the
   same pairs as the row path's window join over the same stream.
2. On Spark with checkpoints, a slot SIGKILLed mid-run: a window join and a regular
   join of record batches commit every pair exactly once.
"""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from e2e_support import run_with_slot_killed

import epochstream as es

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("ts", pa.int64())])


def _ts(row: dict[str, int], _: Any) -> int:
    return row["ts"]


def _random_rows(rng: random.Random, n: int, keys: int) -> list[dict[str, int]]:
    times = sorted(rng.randrange(0, 60_000) for _ in range(n))
    return [{"k": rng.randrange(keys), "v": rng.randrange(1_000_000), "ts": t} for t in times]


def _row_pair(a: dict[str, int], b: dict[str, int]) -> list[int]:
    return [a["k"], a["v"], b["v"]]


def _key(row: dict[str, int]) -> int:
    return row["k"]


def _columnar_pair(row: dict[str, Any]) -> list[int]:
    return [row["k"], row["v"], row["v_right"]]


@pytest.mark.slow
def test_columnar_window_join_equals_the_row_window_join(tmp_path: Path) -> None:
    rng = random.Random(7)
    left_rows, right_rows = _random_rows(rng, 3_000, 40), _random_rows(rng, 2_000, 40)
    env = es.Environment(parallelism=2, runner="local")
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_assigner(_ts)
    left = env.from_collection(left_rows, watermark_strategy=strategy)
    right = env.from_collection(right_rows, watermark_strategy=strategy)
    left_batches, right_batches = left.to_batches(SCHEMA), right.to_batches(SCHEMA)
    windows = {
        "tumbling": es.TumblingEventTimeWindows.of(5_000),
        "sliding": es.SlidingEventTimeWindows.of(6_000, 2_000),
    }
    for name, window in windows.items():
        rows = left.join(right).where(_key).equal_to(_key).window(window).apply(_row_pair)
        rows.sink_to(es.sinks.FileSink(str(tmp_path / f"rows-{name}")))
        batches = left_batches.join(right_batches).where("k").equal_to("k").window(window).apply()
        batches.to_rows().map(_columnar_pair).sink_to(
            es.sinks.FileSink(str(tmp_path / f"batches-{name}"))
        )
    env.execute("golden-window-join")
    for name in windows:
        expected = sorted(map(tuple, es.testing.read_committed(tmp_path / f"rows-{name}")))
        got = sorted(map(tuple, es.testing.read_committed(tmp_path / f"batches-{name}")))
        assert expected, name
        assert got == expected, name


N = 140_000  # 3.5 s at the source rate: the kill lands mid-run
KEYS = 97
WINDOW_MS = 1_000
EVERY = 50  # the right side of the window join: every 50th number


def _numbers(env: es.Environment, name: str) -> es.DataStream:
    from epochstream.connectors.generators import SequenceSource

    # Event time is the number itself (ms): monotonous per subtask, so no row is late.
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("value")
    source = SequenceSource(0, N, rate=40_000, batch_size=2_048)
    return env.from_source(source, name=name, watermark_strategy=strategy).uid(name)


def _keyed(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch([b["value"], pc.remainder(b["value"], KEYS)], names=["i", "k"])


def _pipeline(env: es.Environment, out: Path) -> None:
    left = _numbers(env, "left").map_batches(_keyed).uid("left-keyed")
    right = (
        _numbers(env, "right")
        .filter(pc.equal(pc.remainder(pc.field("value"), EVERY), 0))
        .uid("right-sparse")
        .map_batches(_keyed)
        .uid("right-keyed")
    )
    pairs = (
        left.join(right)
        .where("k")
        .equal_to("k")
        .window(es.TumblingEventTimeWindows.of(WINDOW_MS))
        .apply(lambda b: b.select(["i", "i_right", "_ts"]))
        .uid("window-join")
    )
    pairs.to_rows().sink_to(es.sinks.FileSink(str(out / "window"))).uid("window-files")
    # Regular join with a dimension of one row per key (no event time on that side).
    dimension = (
        env.from_sequence(0, KEYS, batch_size=16)
        .uid("dimension")
        .map_batches(
            lambda b: pa.record_batch([b["value"], pc.multiply(b["value"], 10)], names=["k", "ten"])
        )
        .uid("dimension-columns")
    )
    enriched = left.join(dimension).where("k").equal_to("k").apply().uid("regular-join")
    enriched.to_rows().sink_to(es.sinks.FileSink(str(out / "regular"))).uid("regular-files")


def _window_problems(rows: list[dict[str, int]]) -> list[str]:
    counts = collections.Counter((r["i"], r["i_right"]) for r in rows)
    twice = [pair for pair, n in counts.items() if n > 1]
    right_by: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    for j in range(0, N, EVERY):
        right_by[(j // WINDOW_MS, j % KEYS)].append(j)
    expected = {(i, j) for i in range(N) for j in right_by.get((i // WINDOW_MS, i % KEYS), ())}
    problems = [f"pair {p} committed twice" for p in twice[:3]]
    if set(counts) != expected:
        problems.append(
            f"{len(expected - set(counts))} pairs missing, {len(set(counts) - expected)} unexpected"
        )
    return problems


@pytest.mark.slow
@pytest.mark.spark
def test_columnar_joins_survive_sigkill_with_exactly_once_output(
    spark: Any, tmp_path: Path
) -> None:
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    _pipeline(env, tmp_path)
    result = run_with_slot_killed(env, "columnar-joins-sigkill")
    assert result.restarts >= 1
    assert _window_problems(es.testing.read_committed(tmp_path / "window")) == []
    regular = es.testing.read_committed(tmp_path / "regular")
    assert sorted(r["i"] for r in regular) == list(range(N))
    assert all(r["ten"] == 10 * r["k"] for r in regular)


INTERVAL_N = 20_000


def _interval_columns(b: pa.RecordBatch) -> pa.RecordBatch:
    """Sequence numbers as rows of a two-column key: (i % 97, (i // 97) % 2), v = i."""
    value = b["value"]
    group = pc.cast(pc.bit_wise_and(pc.divide(value, 97), 1), pa.string())
    return pa.record_batch(
        [pc.remainder(value, 97), group, value, b["_ts"]], names=["k", "g", "v", "_ts"]
    )


@pytest.mark.slow
def test_interval_join_on_two_keys_with_checkpoints_equals_duckdb(tmp_path: Path) -> None:
    """The SQL interval join (``between``) on a two-column key, at parallelism 2 with
    checkpoints on the local runner: every pair once, as DuckDB's BETWEEN join gives
    (in-order sources and ``lower <= 0 <= upper``: no row is late)."""
    import duckdb

    from epochstream.connectors.generators import SequenceSource

    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("value")
    streams = []
    for name in ("left", "right"):
        source = SequenceSource(0, INTERVAL_N, rate=15_000, batch_size=500)
        stream = env.from_source(source, name=name, watermark_strategy=strategy).uid(name)
        if name == "right":  # a sparser side
            stream = stream.filter(pc.equal(pc.remainder(pc.field("value"), 7), 0)).uid("sparse")
        streams.append(stream.map_batches(_interval_columns).uid(f"{name}-columns"))
    pairs = (
        streams[0]
        .join(streams[1])
        .where(["k", "g"])
        .equal_to(["k", "g"])
        .between(-500, 200)
        .select(["k", "g", ("v", "lv")], [("v", "rv")])
        .uid("interval-join")
    )
    # The pairs' event time as a column (to_rows() turns _ts into the rows' timestamps).
    stamped = pairs.map_batches(lambda b: b.append_column("t", b["_ts"])).uid("stamped")
    stamped.to_rows().sink_to(es.sinks.FileSink(str(tmp_path / "pairs"))).uid("files")
    result = env.execute("interval-join")
    assert result.checkpoints  # checkpoints were taken while the join held state
    got = sorted(
        (r["k"], r["g"], r["lv"], r["rv"], r["t"])
        for r in es.testing.read_committed(tmp_path / "pairs")
    )
    expected = duckdb.sql(
        f"""
        WITH s AS (SELECT i AS v, i % 97 AS k, CAST((i // 97) % 2 AS VARCHAR) AS g
                   FROM range({INTERVAL_N}) t(i))
        SELECT l.k, l.g, l.v, r.v, greatest(l.v, r.v) FROM s l JOIN s r
        ON l.k = r.k AND l.g = r.g AND r.v % 7 = 0 AND l.v BETWEEN r.v - 500 AND r.v + 200
        """
    ).fetchall()
    assert len(expected) > 1_000
    assert got == sorted(expected)
