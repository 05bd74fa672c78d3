"""The window Top-N and window assignment API: ``key_by([...]).window_top_n(...)`` and
``window_assign(...)``, their misuse errors, and local jobs against DuckDB: a window
aggregation into a Top-N with checkpoints at parallelism 2 (both backends), and a
window assignment into a Top-N."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import WindowTopNSpec, WindowTvf


def _batches(env: es.Environment) -> es.DataStream:
    def columns(b: pa.RecordBatch) -> pa.RecordBatch:
        v = b["value"]
        return pa.record_batch([v, v, v], names=["a", "b", "_ts"])

    return env.from_sequence(0, 9, batch_size=4).map_batches(columns)


def test_window_top_n_and_window_assign_build_their_operators() -> None:
    env = es.Environment(parallelism=1, runner="local")
    out = _batches(env).key_by(["a", "b"]).window_top_n(3, order_by=[("b", "DESC"), "a"])
    assert out.columnar and out._t.kind == "columnar_window_top_n"
    assert out._t.payload == WindowTopNSpec(("a", "b"), (("b", "desc"), ("a", "asc")), 3)
    ranked = _batches(env).key_by([]).window_top_n(1, order_by=[("a", "asc")], rank_column="rn")
    assert ranked._t.payload.partition_by == () and ranked._t.payload.rank_column == "rn"
    hop = _batches(env).window_assign(es.SlidingEventTimeWindows.of(10, 5))
    assert hop.columnar and hop._t.kind == "columnar_window_assign"
    assert hop._t.payload.window == WindowTvf.hop(10, 5)
    cumulate = _batches(env).window_assign(WindowTvf.cumulate(6, 2, offset=1))
    assert cumulate._t.payload.window == WindowTvf.cumulate(6, 2, offset=1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: s.key_by("a").window_top_n(0, order_by=[("a", "asc")]), "n >= 1"),
        (lambda s: s.key_by("a").window_top_n(1, order_by="a"), "give a list"),
        (lambda s: s.key_by("a").window_top_n(1, order_by=[("a", "up")]), "direction"),
        (lambda s: s.to_rows().window_assign(WindowTvf.tumble(5)), "columnar"),
        (
            lambda s: s.window_assign(es.EventTimeSessionWindows.with_gap(5)),
            "tumbling, sliding or cumulative",
        ),
    ],
)
def test_misuse_is_refused_when_the_job_is_built(build: Any, message: str) -> None:
    env = es.Environment(parallelism=1, runner="local")
    with pytest.raises(ConfigurationError, match=message):
        build(_batches(env))


def _bids(tmp_path: Path, n: int) -> pa.Table:
    rng = random.Random(7)
    auctions = [rng.randint(0, 29) for _ in range(n)]
    table = pa.table(
        {
            "auction": auctions,
            "cat": [a % 3 for a in auctions],
            "price": [rng.randint(1, 100) for _ in range(n)],
            "ts": sorted(rng.randint(0, 60_000) for _ in range(n)),
        }
    )
    pq.write_table(table, tmp_path / "bids.parquet", row_group_size=500)
    return table


def _millis(value: Any) -> int:
    return int(value.timestamp() * 1000)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_window_aggregate_into_a_top_n_with_checkpoints_equals_duckdb(
    tmp_path: Path, backend: str
) -> None:
    table = _bids(tmp_path, 6_000)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "checkpoints"))
    if backend == "rocksdb":
        env.set_state_backend(es.state.RocksDBStateBackend())
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("ts")
    bids = env.from_parquet(
        str(tmp_path / "bids.parquet"), batch_size=500, watermark_strategy=strategy
    )
    (
        bids.key_by(["cat", "auction"])
        .window(es.TumblingEventTimeWindows.of(10_000))
        .aggregate(es.agg.sum("price", "volume"), es.agg.count_star("bids"))
        .key_by(["cat"])
        .window_top_n(2, order_by=[("volume", "desc"), ("auction", "asc")], rank_column="rownum")
        .to_rows()
        .map(
            lambda r: [
                r["cat"],
                r["auction"],
                _millis(r["window_start"]),
                r["volume"],
                r["bids"],
                r["rownum"],
            ]
        )
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    result = env.execute("window-top-n")
    assert result.checkpoints, "no checkpoint completed while the job ran"
    got = sorted(map(tuple, es.testing.read_committed(tmp_path / "out")))
    db = duckdb.connect()
    db.register("t", table)
    expected = db.execute(
        """
        SELECT cat, auction, ws, volume, bids, rownum FROM (
            SELECT *, ROW_NUMBER() OVER (
                PARTITION BY ws, cat ORDER BY volume DESC, auction ASC) AS rownum
            FROM (SELECT cat, auction, ts - ts % 10000 AS ws, sum(price) AS volume,
                         count(*) AS bids
                  FROM t GROUP BY cat, auction, ws))
        WHERE rownum <= 2
        """
    ).fetchall()
    assert got == sorted(expected)


def test_a_window_assignment_into_a_top_n_equals_duckdb(tmp_path: Path) -> None:
    table = _bids(tmp_path, 3_000)
    env = es.Environment(parallelism=2, runner="local")
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("ts")
    bids = env.from_parquet(
        str(tmp_path / "bids.parquet"), batch_size=500, watermark_strategy=strategy
    )
    (
        bids.window_assign(WindowTvf.hop(20_000, 10_000))
        .key_by(["cat"])
        .window_top_n(1, order_by=[("price", "desc"), ("ts", "asc"), ("auction", "asc")])
        .to_rows()
        .map(lambda r: [r["cat"], _millis(r["window_end"]), r["price"], r["ts"], r["auction"]])
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("window-assign-top-n")
    got = sorted(map(tuple, es.testing.read_committed(tmp_path / "out")))
    db = duckdb.connect()
    db.register("t", table)
    expected = db.execute(
        """
        SELECT cat, we, price, ts, auction FROM (
            SELECT *, ROW_NUMBER() OVER (
                PARTITION BY we, cat ORDER BY price DESC, ts, auction) AS rownum
            FROM (SELECT t.*, ts - ts % 10000 - 10000 * j + 20000 AS we
                  FROM t, range(0, 2) r(j)))
        WHERE rownum = 1
        """
    ).fetchall()
    assert got == sorted(expected)
