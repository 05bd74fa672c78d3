"""The SQL window aggregation's API: ``key_by([...]).window(...).aggregate(es.agg...)``,
``window_aggregate`` for a global one, and the errors that say why; one local job
against DuckDB."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import AggCall, WindowTvf
from epochstream.graph.transformations import ColumnKeys


def _batches(env: es.Environment) -> es.DataStream:
    def columns(b: pa.RecordBatch) -> pa.RecordBatch:
        v = b["value"]
        return pa.record_batch([v, v, v], names=["a", "b", "_ts"])

    return env.from_sequence(0, 9, batch_size=4).map_batches(columns)


def test_key_by_columns_builds_the_sql_window_aggregation() -> None:
    env = es.Environment(parallelism=1, runner="local")
    keyed = _batches(env).key_by(["a", "b"])
    assert keyed.key_columns == ("a", "b")
    assert keyed._edge().partitioning.key_selector == ColumnKeys(("a", "b"))
    out = keyed.window(es.SlidingEventTimeWindows.of(10_000, 3_000)).aggregate(
        es.agg.count_star("n"), es.agg.count("b", "nb", distinct=True, filter="f")
    )
    assert out.columnar and out._t.kind == "columnar_window_aggregate"
    spec = out._t.payload
    assert spec.keys == ("a", "b") and spec.window == WindowTvf.hop(10_000, 3_000)
    assert spec.aggs[1] == AggCall("count", "b", "nb", distinct=True, filter="f")
    cumulate = keyed.window(es.CumulativeEventTimeWindows.of(6_000, 2_000)).aggregate(
        es.agg.sum("a", "s")
    )
    assert cumulate._t.payload.window == WindowTvf.cumulate(6_000, 2_000)
    assert _batches(env).key_by(["a"]).key_column == "a"  # one column: key_by("a")


def test_session_windows_build_the_session_aggregation() -> None:
    env = es.Environment(parallelism=1, runner="local")
    out = (
        _batches(env)
        .key_by(["a", "b"])
        .window(es.EventTimeSessionWindows.with_gap(4_000))
        .aggregate(es.agg.count_star("n"), es.agg.avg("a", "mean"))
    )
    assert out.columnar and out._t.kind == "columnar_session_aggregate"
    spec = out._t.payload
    assert spec.keys == ("a", "b") and spec.gap == 4_000 and len(spec.aggs) == 2


def test_window_aggregate_is_the_global_aggregation() -> None:
    env = es.Environment(parallelism=1, runner="local")
    out = _batches(env).window_aggregate(
        es.TumblingEventTimeWindows.of(5_000), es.agg.max("a", "top")
    )
    assert out._t.payload.keys == () and out._t.payload.window == WindowTvf.tumble(5_000)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: s.key_by(["a", "b"]).sum("a"), "keyed by the columns"),
        (
            lambda s: s.key_by("a").window(es.TumblingEventTimeWindows.of(5)).aggregate(len),
            "es.agg",
        ),
        (
            lambda s: (
                s.key_by("a")
                .window(es.EventTimeSessionWindows.with_dynamic_gap(lambda r: 5))
                .aggregate(es.agg.count_star("n"))
            ),
            "fixed gap",
        ),
        (
            lambda s: (
                s.to_rows().key_by(lambda r: r["a"]).window(es.CumulativeEventTimeWindows.of(6, 2))
            ),
            "columnar SQL window aggregation",
        ),
        (lambda s: s.key_by([1]), "column names"),
        (lambda s: s.to_rows().window_aggregate(es.TumblingEventTimeWindows.of(5)), "columnar"),
        (  # window_assign has no processing time: the windows would be of _ts
            lambda s: s.window_assign(es.TumblingProcessingTimeWindows.of(5)),
            "tumbling, sliding or cumulative event-time",
        ),
    ],
)
def test_misuse_is_refused_when_the_job_is_built(build: Any, message: str) -> None:
    env = es.Environment(parallelism=1, runner="local")
    with pytest.raises(ConfigurationError, match=message):
        build(_batches(env))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9)
    return bool(a == b)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_local_job_with_checkpoints_equals_duckdb(tmp_path: Path, backend: str) -> None:
    rng = random.Random(3)
    n = 6_000
    table = pa.table(
        {
            "auction": [rng.randint(0, 20) for _ in range(n)],
            "bidder": [rng.choice(["ann", "bob", "cy", None]) for _ in range(n)],
            "price": [rng.choice([None, float("nan"), rng.uniform(1, 100)]) for _ in range(n)],
            "qty": [rng.randint(-5, 50) for _ in range(n)],
            "ts": sorted(rng.randint(0, 60_000) for _ in range(n)),
        }
    )
    pq.write_table(table, tmp_path / "bids.parquet", row_group_size=500)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "checkpoints"))
    if backend == "rocksdb":
        env.set_state_backend(es.state.RocksDBStateBackend())
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("ts")
    bids = env.from_parquet(
        str(tmp_path / "bids.parquet"), batch_size=500, watermark_strategy=strategy
    )
    out = (
        bids.key_by(["auction", "bidder"])
        .window(es.SlidingEventTimeWindows.of(10_000, 4_000))
        .aggregate(
            es.agg.count_star("n"),
            es.agg.sum("qty", "total"),
            es.agg.max("price", "top"),
            es.agg.min("price", "low"),
            es.agg.count("qty", "kinds", distinct=True),
        )
    )
    out.to_rows().map(
        lambda r: [
            r["auction"],
            r["bidder"],
            int(r["window_start"].timestamp() * 1000),
            r["n"],
            r["total"],
            r["top"],
            r["low"],
            r["kinds"],
        ]
    ).sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    result = env.execute("window-aggregate")
    assert result.checkpoints, "no checkpoint completed while the job ran"
    got = sorted(map(tuple, es.testing.read_committed(tmp_path / "out")), key=repr)
    db = duckdb.connect()
    db.register("t", table)
    expected = db.execute(
        """
        SELECT auction, bidder, ws, count(*), sum(qty), max(price), min(price),
               count(DISTINCT qty)
        FROM (SELECT t.*, ts - ts % 4000 - 4000 * j AS ws FROM t, range(0, 3) r(j)) x
        WHERE ws > ts - 10000
        GROUP BY auction, bidder, ws
        """
    ).fetchall()
    expected = sorted(expected, key=repr)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert all(_same(a, b) for a, b in zip(g, e, strict=True)), (g, e)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_local_session_job_with_checkpoints_equals_duckdb(tmp_path: Path, backend: str) -> None:
    rng = random.Random(4)
    n = 4_000
    table = pa.table(
        {
            "bidder": [rng.randint(0, 40) for _ in range(n)],
            "price": [rng.choice([None, rng.randint(1, 100)]) for _ in range(n)],
            "ts": sorted(rng.randint(0, 400_000) for _ in range(n)),
        }
    )
    pq.write_table(table, tmp_path / "bids.parquet", row_group_size=400)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "checkpoints"))
    if backend == "rocksdb":
        env.set_state_backend(es.state.RocksDBStateBackend())
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("ts")
    bids = env.from_parquet(
        str(tmp_path / "bids.parquet"), batch_size=400, watermark_strategy=strategy
    )
    out = (
        bids.key_by("bidder")
        .window(es.EventTimeSessionWindows.with_gap(5_000))
        .aggregate(
            es.agg.count_star("n"),
            es.agg.sum("price", "total"),
            es.agg.count("price", "kinds", distinct=True),
            es.agg.avg("price", "mean"),
        )
    )
    out.to_rows().map(
        lambda r: [
            r["bidder"],
            round(r["window_start"].timestamp() * 1000),
            round(r["window_end"].timestamp() * 1000),
            r["n"],
            r["total"],
            r["kinds"],
            r["mean"],
        ]
    ).sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    result = env.execute("session-aggregate")
    assert result.checkpoints, "no checkpoint completed while the job ran"
    got = sorted(map(tuple, es.testing.read_committed(tmp_path / "out")), key=repr)
    db = duckdb.connect()
    db.register("t", table)
    # A row opens a session when it starts after every ts + gap before it (ties by rid).
    expected = db.execute(
        """
        SELECT bidder, min(ts), max(ts) + 5000, count(*), sum(price), count(DISTINCT price),
               trunc(avg(price))::BIGINT
        FROM (SELECT *, sum(CASE WHEN reach IS NULL OR ts > reach THEN 1 ELSE 0 END)
                        OVER (PARTITION BY bidder ORDER BY ts, rid ROWS UNBOUNDED PRECEDING) s
              FROM (SELECT *, max(ts + 5000) OVER (PARTITION BY bidder ORDER BY ts, rid
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) reach
                    FROM (SELECT *, row_number() OVER () rid FROM t)))
        GROUP BY bidder, s
        """
    ).fetchall()
    assert got == sorted(expected, key=repr)


def test_processing_time_windows_build_the_processing_time_window_aggregation() -> None:
    env = es.Environment(parallelism=1, runner="local")
    keyed = _batches(env).key_by(["a", "b"])
    aggs = (es.agg.count_star("n"), es.agg.count("b", "nb", distinct=True))
    tumbling = keyed.window(es.TumblingProcessingTimeWindows.of(10_000, 2_000)).aggregate(*aggs)
    sliding = keyed.window(es.SlidingProcessingTimeWindows.of(10_000, 4_000)).aggregate(*aggs)
    for out in (tumbling, sliding):
        assert out.columnar and out._t.kind == "columnar_processing_window_aggregate"
        assert out._t.payload.proctime and out._t.payload.aggs == aggs
    assert tumbling._t.payload.window == WindowTvf.tumble(10_000, 2_000)
    assert sliding._t.payload.window == WindowTvf.hop(10_000, 4_000)
    event = keyed.window(es.TumblingEventTimeWindows.of(10_000)).aggregate(*aggs)
    assert not event._t.payload.proctime  # the same windows over event time: another uid
    assert repr(event._t.payload) != repr(tumbling._t.payload)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_local_job_on_processing_time_windows_counts_every_row_in_each_window(
    tmp_path: Path, backend: str
) -> None:
    """Whenever the clock fires windows, the end of the bounded input fires the rest: each
    row counts once in each of the size / slide windows of its arrival."""
    rng = random.Random(4)
    n = 3_000
    table = pa.table(
        {
            "auction": [rng.randint(0, 15) for _ in range(n)],
            "bidder": [rng.choice(["ann", "bob", "cy", None]) for _ in range(n)],
            "qty": [rng.randint(-5, 50) for _ in range(n)],
            "new": [rng.choice([True, False]) for _ in range(n)],
        }
    )
    pq.write_table(table, tmp_path / "bids.parquet", row_group_size=300)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "checkpoints"))
    if backend == "rocksdb":
        env.set_state_backend(es.state.RocksDBStateBackend())
    bids = env.from_parquet(str(tmp_path / "bids.parquet"), batch_size=300)
    out = (
        bids.key_by(["auction", "bidder"])
        .window(es.SlidingProcessingTimeWindows.of(200, 100))
        .aggregate(
            es.agg.count_star("n"),
            es.agg.sum("qty", "total"),
            es.agg.count_star("fresh", filter="new"),
        )
    )
    out.to_rows().map(
        lambda r: [r["auction"], r["bidder"], r["n"], r["total"], r["fresh"]]
    ).sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    env.execute("processing-time-window-aggregate")
    got: dict[Any, list[int]] = {}
    for auction, bidder, count, total, fresh in es.testing.read_committed(tmp_path / "out"):
        sums = got.setdefault((auction, bidder), [0, 0, 0])
        for i, value in enumerate((count, total, fresh)):
            sums[i] += value
    expected: dict[Any, list[int]] = {}
    for row in table.to_pylist():
        sums = expected.setdefault((row["auction"], row["bidder"]), [0, 0, 0])
        for i, value in enumerate((1, row["qty"], int(row["new"]))):
            sums[i] += 2 * value  # in 2 windows: 200 ms every 100 ms
    assert got == expected
