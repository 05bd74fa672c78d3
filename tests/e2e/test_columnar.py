"""The columnar path end to end: Arrow batches through keyed and window aggregations.

1. Rolling keyed sum on record batches (workload W1's keys) on Spark with a slot
   SIGKILLed mid-run: the committed output is exactly-once (per key, running sums
   strictly increase and the last equals the closed-form total).
2. Stop with a savepoint at parallelism 2, resume at 3: columnar state is redistributed
   by key group and the totals are exact.
3. Parquet in, tumbling and sliding event-time window aggregations with checkpoints,
   compared with the same query in DuckDB over the same file.
4. Session-window state and regular-join state through a savepoint from parallelism 2
   to 3: the committed output equals the uninterrupted run's (closed forms).
5. Session windows on the RocksDB backend with more open sessions than its 1 MB block
   caches hold, a slot SIGKILLed mid-run: every session committed exactly once.
6. A HOP window aggregation with COUNT(DISTINCT) over many keys on RocksDB (1 MB
   caches), a slot SIGKILLed mid-run: every window committed once, equal to NumPy.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from e2e_support import run_with_slot_killed

import epochstream as es

N = 400_000
KEYS = 5_000


def _to_kv(b: pa.RecordBatch) -> pa.RecordBatch:
    v = b["value"]
    # Values are positive, so every update of a key has its own running sum.
    return pa.record_batch(
        [pc.remainder(pc.multiply(v, 7919), KEYS), pc.add(pc.remainder(v, 1000), 1)],
        names=["k", "v"],
    )


def _pipeline(env: es.Environment, out: Path, *, rate: float | None) -> None:
    (
        env.from_sequence(0, N, batch_size=4_096, rate=rate)
        .uid("numbers")
        .map_batches(_to_kv)
        .uid("kv")
        .key_by("k")
        .sum("v")
        .uid("sums")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


def _expected() -> dict[int, int]:
    totals: dict[int, int] = collections.defaultdict(int)
    for i in range(N):
        totals[i * 7919 % KEYS] += i % 1000 + 1
    return totals


def _problems(rows: list[dict[str, int]]) -> list[str]:
    sums: dict[int, list[int]] = collections.defaultdict(list)
    for row in rows:
        sums[row["k"]].append(row["v"])
    problems = []
    for key, total in _expected().items():
        got = sorted(sums.get(key, []))
        if len(set(got)) != len(got):
            problems.append(f"key {key}: a running sum was committed twice")
        if not got or got[-1] != total:
            problems.append(f"key {key}: last sum {got[-1] if got else None}, expected {total}")
    return problems[:5]


def _env(spark: Any, parallelism: int, ckpt: Path) -> es.Environment:
    env = es.Environment(parallelism=parallelism, spark=spark)
    env.enable_checkpointing(0.3, storage=str(ckpt))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    return env


@pytest.mark.slow
@pytest.mark.spark
def test_columnar_running_sum_survives_sigkill(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = _env(spark, 2, tmp_path / "ckpt")
    _pipeline(env, out, rate=80_000)
    result = run_with_slot_killed(env, "columnar-sigkill")
    assert result.restarts >= 1
    assert _problems(es.testing.read_committed(out)) == []


ROCKS_N = 600_000
ROCKS_KEYS = 200_000


def _to_many_keys(b: pa.RecordBatch) -> pa.RecordBatch:
    v = b["value"]
    return pa.record_batch(
        [pc.remainder(pc.multiply(v, 7919), ROCKS_KEYS), pc.add(pc.remainder(v, 1000), 1)],
        names=["k", "v"],
    )


@pytest.mark.slow
@pytest.mark.spark
def test_columnar_state_in_rocksdb_larger_than_its_memory_survives_sigkill(
    spark: Any, tmp_path: Path
) -> None:
    """A rolling columnar sum on the RocksDB backend with 200k keys (about 5 MB stored
    per subtask) through 1 MB block caches and write buffers, a slot SIGKILLed mid-run:
    every key's last committed sum is its exact total and no running sum is committed
    twice (exactly-once), the state restored from RocksDB checkpoints."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    env = _env(spark, 2, ckpt)
    env.set_state_backend(es.state.RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1))
    (
        env.from_sequence(0, ROCKS_N, batch_size=8_192, rate=60_000)
        .uid("numbers")
        .map_batches(_to_many_keys)
        .uid("kv")
        .key_by("k")
        .sum("v")
        .uid("sums")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )
    result = run_with_slot_killed(env, "columnar-rocksdb-sigkill")
    assert result.restarts >= 1
    # The checkpoints are RocksDB's (SST files), more bytes than the memory bounds.
    ssts = list(ckpt.rglob("*.sst"))
    assert ssts and sum(p.stat().st_size for p in ssts) > 2 * 2**20
    expected: dict[int, int] = collections.defaultdict(int)
    for i in range(ROCKS_N):
        expected[i * 7919 % ROCKS_KEYS] += i % 1000 + 1
    sums: dict[int, list[int]] = collections.defaultdict(list)
    for row in es.testing.read_committed(out):
        sums[row["k"]].append(row["v"])
    assert set(sums) == set(expected)
    twice = [k for k, got in sums.items() if len(set(got)) != len(got)]
    assert twice == [], f"running sums committed twice, e.g. keys {twice[:5]}"
    wrong = {k: (max(got), expected[k]) for k, got in sums.items() if max(got) != expected[k]}
    assert wrong == {}, f"final sums (got, expected) differ: {list(wrong.items())[:5]}"


@pytest.mark.slow
@pytest.mark.spark
def test_columnar_state_rescales_through_a_savepoint(spark: Any, tmp_path: Path) -> None:
    ckpt, out, sp = tmp_path / "ckpt", tmp_path / "out", tmp_path / "sp"
    first = _env(spark, 2, ckpt)
    _pipeline(first, out, rate=80_000)
    client = first.execute_async("columnar-rescale")
    client.wait_for_checkpoint(2, timeout=120)
    path = client.cancel(savepoint=str(sp))
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)
    assert 0 < len(es.testing.read_committed(out)), "the first job committed nothing"
    # The savepoint's columnar state reads offline like any keyed state.
    table = es.savepoint.read(path, "sums", "sum")
    assert set(table.column("key").to_pylist()) == set(range(KEYS))

    second = _env(spark, 3, ckpt)
    _pipeline(second, out, rate=None)
    result = second.execute("columnar-rescale", from_savepoint=path)
    assert result.restored_from == path
    assert _problems(es.testing.read_committed(out)) == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_parquet_window_aggregations_match_duckdb(tmp_path: Path, backend: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    n = 60_000
    source = tmp_path / "events.parquet"
    ids = pa.array(range(n), pa.int64())
    table = pa.table(
        {
            "user": pc.cast(pc.remainder(pc.multiply(ids, 31), 97), pa.string()),
            "price": pc.remainder(pc.multiply(ids, 17), 1001),
            # Out of order within 3 s, never further.
            "ts": pc.add(pc.multiply(ids, 5), pc.multiply(pc.remainder(ids, 7), 400)),
        }
    )
    pq.write_table(table, source, row_group_size=8_000)

    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    if backend == "rocksdb":  # each open window a column family, dropped when it fires
        env.set_state_backend(es.state.RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1))
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(3_000).with_timestamp_column("ts")
    events = env.from_parquet(str(source), batch_size=2_000, watermark_strategy=strategy)
    keyed = events.filter(pc.field("price") > 100).key_by("user")
    keyed.window(es.TumblingEventTimeWindows.of(10_000)).sum("price").to_rows().sink_to(
        es.sinks.FileSink(str(tmp_path / "tumbling"))
    )
    keyed.window(es.SlidingEventTimeWindows.of(10_000, 5_000)).max("price").to_rows().sink_to(
        es.sinks.FileSink(str(tmp_path / "sliding"))
    )
    env.execute("parquet-windows")

    def rows(name: str, column: str) -> list[tuple[Any, ...]]:
        got = es.testing.read_committed(tmp_path / name)
        return sorted((r["user"], r["window_start"], r[column]) for r in got)

    con = duckdb.connect()
    tumbling = con.execute(
        f"SELECT user, ts - ts % 10000 AS ws, SUM(price) FROM '{source}' WHERE price > 100 "
        "GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    sliding = con.execute(
        f"SELECT user, ws, MAX(price) FROM (SELECT user, price, ts - ts % 5000 - o AS ws "
        f"FROM '{source}', (VALUES (0), (5000)) AS t(o) WHERE price > 100) "
        "GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert rows("tumbling", "price") == [tuple(r) for r in tumbling]
    assert rows("sliding", "price") == [tuple(r) for r in sliding]


def test_parquet_microsecond_timestamps_are_event_time_floored_to_milliseconds(
    tmp_path: Path,
) -> None:
    """Parquet from pandas or Spark holds timestamp[us]: its sub-millisecond values are
    event time, floored to the millisecond (DuckDB's ``epoch_ms`` rounds instead: the
    oracle floors the microseconds itself)."""
    duckdb = pytest.importorskip("duckdb")
    source = tmp_path / "events.parquet"
    micros = [1_000_000_500, 1_000_999_999, 1_001_000_000, 1_002_500_700, 999_999_999]
    pq.write_table(
        pa.table(
            {
                "k": ["a", "b", "a", "a", "b"],
                "v": [1, 2, 3, 4, 5],
                "t": pa.array(micros, pa.timestamp("us")),
            }
        ),
        source,
    )
    env = es.Environment(parallelism=1, runner="local")
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(5_000).with_timestamp_column("t")
    (
        env.from_parquet(str(source), watermark_strategy=strategy)
        .key_by("k")
        .window(es.TumblingEventTimeWindows.of(1_000))
        .sum("v")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("parquet-micros")
    got = sorted(
        (r["k"], r["window_start"], r["v"]) for r in es.testing.read_committed(tmp_path / "out")
    )
    expected = (
        duckdb.connect()
        .execute(
            f"SELECT k, ms - ms % 1000 AS ws, SUM(v) FROM (SELECT k, v, epoch_us(t) // 1000 AS ms "
            f"FROM '{source}') GROUP BY ALL ORDER BY ALL"
        )
        .fetchall()
    )
    assert got == [tuple(r) for r in expected]
    assert got == [
        ("a", 1_000_000, 1),
        ("a", 1_001_000, 3),
        ("a", 1_002_000, 4),
        ("b", 999_000, 5),
        ("b", 1_000_000, 2),
    ]


RUN = 100  # session test: key (value // RUN) % SESSION_KEYS, a run of RUN values per key
SESSION_KEYS = 7
GAP = 200  # ms; event time is the value: runs of a key are RUN * SESSION_KEYS ms apart
SESSION_N = 70_000


def _session_and_join(env: es.Environment, out: Path, *, rate: float | None) -> None:
    from epochstream.connectors.generators import SequenceSource

    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("value")
    source = SequenceSource(0, SESSION_N, rate=rate, batch_size=1_024)
    numbers = (
        env.from_source(source, name="numbers", watermark_strategy=strategy)
        .uid("numbers")
        .map_batches(
            lambda b: pa.record_batch(
                [b["value"], pc.remainder(pc.divide(b["value"], RUN), SESSION_KEYS), b["_ts"]],
                names=["value", "k", "_ts"],
            )
        )
        .uid("keys")
    )
    (
        numbers.key_by("k")
        .window(es.EventTimeSessionWindows.with_gap(GAP))
        .sum("value")
        .uid("sessions")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(out / "sessions")))
        .uid("session-files")
    )
    names = (
        env.from_sequence(0, SESSION_KEYS, batch_size=4)
        .uid("names")
        .map_batches(
            lambda b: pa.record_batch(
                [b["value"], pc.multiply(b["value"], 10)], names=["id", "ten"]
            )
        )
        .uid("name-columns")
    )
    (
        numbers.join(names)
        .where("k")
        .equal_to("id")
        .apply()
        .uid("join")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(out / "joined")))
        .uid("join-files")
    )


@pytest.mark.slow
@pytest.mark.spark
def test_session_and_join_state_rescale_through_a_savepoint(spark: Any, tmp_path: Path) -> None:
    ckpt, out, sp = tmp_path / "ckpt", tmp_path / "out", tmp_path / "sp"
    first = _env(spark, 2, ckpt)
    _session_and_join(first, out, rate=14_000)
    client = first.execute_async("columnar-session-join-rescale")
    client.wait_for_checkpoint(2, timeout=120)
    path = client.cancel(savepoint=str(sp))
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)
    assert es.testing.read_committed(out / "joined"), "the first job committed nothing"
    # Both operators had state in flight: open sessions and the rows of both join inputs.
    assert es.savepoint.read(path, "sessions", "sessions").num_rows > 0
    assert es.savepoint.read(path, "join", "left").num_rows > 0

    second = _env(spark, 3, ckpt)
    _session_and_join(second, out, rate=None)
    result = second.execute("columnar-session-join-rescale", from_savepoint=path)
    assert result.restored_from == path and result.restarts == 0
    sessions = sorted(
        (r["k"], r["window_start"], r["window_end"], r["value"])
        for r in es.testing.read_committed(out / "sessions")
    )
    expected = [
        (
            run % SESSION_KEYS,
            run * RUN,
            run * RUN + RUN - 1 + GAP,
            sum(range(run * RUN, run * RUN + RUN)),
        )
        for run in range(SESSION_N // RUN)
    ]
    assert sessions == sorted(expected)
    joined = es.testing.read_committed(out / "joined")
    assert sorted(r["value"] for r in joined) == list(range(SESSION_N))
    assert all(r["ten"] == 10 * r["k"] == 10 * r["id"] for r in joined)


SESSION_ROCKS_N = 600_000
SESSION_ROCKS_KEYS = 100_000
SESSION_ROCKS_GAP = 50_000  # ms: a key's sessions are 2 * KEYS ms apart, so never merge


@pytest.mark.slow
@pytest.mark.spark
def test_columnar_sessions_in_rocksdb_larger_than_its_memory_survive_sigkill(
    spark: Any, tmp_path: Path
) -> None:
    """Session windows on the RocksDB backend through 1 MB block caches and write
    buffers: values ``2m`` and ``2m + 1`` (event time = value) of key ``m % 100_000``
    make one session, about 25k sessions are open at a time (megabytes of row-table
    state per subtask), and a slot is SIGKILLed mid-run: every session is committed
    exactly once with its exact bounds and sum, restored from RocksDB checkpoints."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    env = _env(spark, 2, ckpt)
    env.set_state_backend(es.state.RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1))
    from epochstream.connectors.generators import SequenceSource

    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("value")
    source = SequenceSource(0, SESSION_ROCKS_N, rate=40_000, batch_size=8_192)
    (
        env.from_source(source, name="numbers", watermark_strategy=strategy)
        .uid("numbers")
        .map_batches(
            lambda b: pa.record_batch(
                [
                    b["value"],
                    pc.remainder(pc.divide(b["value"], 2), SESSION_ROCKS_KEYS),
                    b["_ts"],
                ],
                names=["value", "k", "_ts"],
            )
        )
        .uid("keys")
        .key_by("k")
        .window(es.EventTimeSessionWindows.with_gap(SESSION_ROCKS_GAP))
        .sum("value")
        .uid("sessions")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )
    result = run_with_slot_killed(env, "columnar-sessions-rocksdb-sigkill")
    assert result.restarts >= 1
    ssts = list(ckpt.rglob("*.sst"))
    assert ssts and sum(p.stat().st_size for p in ssts) > 2 * 2**20
    got = [
        (r["k"], r["window_start"], r["window_end"], r["value"])
        for r in es.testing.read_committed(out)
    ]
    twice = [s for s, n in collections.Counter(got).items() if n > 1]
    assert twice == [], f"sessions committed twice, e.g. {twice[:5]}"
    expected = {
        (m % SESSION_ROCKS_KEYS, 2 * m, 2 * m + 1 + SESSION_ROCKS_GAP, 4 * m + 1)
        for m in range(SESSION_ROCKS_N // 2)
    }
    assert set(got) == expected


WA_ROCKS_N = 240_000
WA_ROCKS_KEYS = 8_000
WA_ROCKS_SLIDE = 8_000  # ms; event time = value, so a key has one row per slice
WA_ROCKS_SIZE = 32_000


def _hop_oracle() -> set[tuple[int, int, int, int, int, int]]:
    """``(k, window_start, window_end, rows, distinct d, sum v)`` of every HOP window of
    the test below, by NumPy: each value ``t`` is in the 4 windows starting at
    ``t - t % slide - j * slide``."""
    t = np.arange(WA_ROCKS_N, dtype=np.int64)
    k, d = t % WA_ROCKS_KEYS, (t // WA_ROCKS_KEYS) % 3
    per = WA_ROCKS_SIZE // WA_ROCKS_SLIDE
    starts = np.concatenate([t - t % WA_ROCKS_SLIDE - j * WA_ROCKS_SLIDE for j in range(per)])
    keys, ds, vs = np.tile(k, per), np.tile(d, per), np.tile(t, per)
    groups, group = np.unique(np.stack([keys, starts]), axis=1, return_inverse=True)
    group = group.reshape(-1)
    rows = np.bincount(group)
    sums = np.bincount(group, weights=vs).astype(np.int64)
    pairs = np.unique(np.stack([group, ds]), axis=1)
    distinct = np.bincount(pairs[0], minlength=len(rows))
    return {
        (int(g_k), int(g_s), int(g_s) + WA_ROCKS_SIZE, int(n), int(nd), int(total))
        for g_k, g_s, n, nd, total in zip(*groups, rows, distinct, sums, strict=True)
    }


@pytest.mark.slow
@pytest.mark.spark
def test_hop_window_aggregation_in_rocksdb_with_count_distinct_survives_sigkill(
    spark: Any, tmp_path: Path
) -> None:
    """The SQL window aggregation on the RocksDB backend through 1 MB block caches and
    write buffers: HOP(32 s, 8 s) by ``k = value % 8_000`` (event time = value) with
    COUNT(*), COUNT(DISTINCT d) and SUM(value), about 40k partial and distinct rows
    open per subtask in its slices' row tables, and a slot SIGKILLed mid-run: every
    window is committed once, exactly as NumPy computes it."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    env = _env(spark, 2, ckpt)
    env.set_state_backend(es.state.RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1))
    from epochstream.connectors.generators import SequenceSource

    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("value")
    source = SequenceSource(0, WA_ROCKS_N, rate=30_000, batch_size=8_192)
    (
        env.from_source(source, name="numbers", watermark_strategy=strategy)
        .uid("numbers")
        .map_batches(
            lambda b: pa.record_batch(
                [
                    b["value"],
                    pc.remainder(b["value"], WA_ROCKS_KEYS),
                    pc.remainder(pc.divide(b["value"], WA_ROCKS_KEYS), 3),
                    b["_ts"],
                ],
                names=["value", "k", "d", "_ts"],
            )
        )
        .uid("keys")
        .key_by(["k"])
        .window(es.SlidingEventTimeWindows.of(WA_ROCKS_SIZE, WA_ROCKS_SLIDE))
        .aggregate(
            es.agg.count_star("n"),
            es.agg.count("d", "nd", distinct=True),
            es.agg.sum("value", "total"),
        )
        .uid("windows")
        .map_batches(_window_bounds_in_ms)
        .uid("ms")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )
    result = run_with_slot_killed(env, "columnar-window-aggregate-rocksdb-sigkill")
    assert result.restarts >= 1
    assert list(ckpt.rglob("*.sst")), "the slices were checkpointed from RocksDB"
    got = [
        (r["k"], r["window_start"], r["window_end"], r["n"], r["nd"], r["total"])
        for r in es.testing.read_committed(out)
    ]
    twice = [w for w, n in collections.Counter(got).items() if n > 1]
    assert twice == [], f"windows committed twice, e.g. {twice[:5]}"
    assert set(got) == _hop_oracle()


def _window_bounds_in_ms(b: pa.RecordBatch) -> pa.RecordBatch:
    """``window_start``/``window_end`` as int64 ms (JSON lines hold no timestamps)."""
    for name in ("window_start", "window_end"):
        b = b.set_column(b.schema.get_field_index(name), name, b[name].cast(pa.int64()))
    return b
