"""The OVER aggregation API: ``key_by(...).over_aggregate(...)`` builds its operator,
misuse is refused when the job is built, and a local job with checkpoints (both
backends, parallelism 2) equals DuckDB's window functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import AggCall, OverAggregateSpec


def _batches(env: es.Environment) -> es.DataStream:
    def columns(b: pa.RecordBatch) -> pa.RecordBatch:
        v = b["value"]
        return pa.record_batch([v, v, v], names=["k", "v", "_ts"])

    return env.from_sequence(0, 199, batch_size=16).map_batches(columns)


def test_over_aggregate_builds_its_operator() -> None:
    env = es.Environment(parallelism=1, runner="local")
    out = _batches(env).key_by("k").over_aggregate(es.agg.sum("v", "s"), frame="range", preceding=9)
    assert out.columnar and out._t.kind == "columnar_over_aggregate"
    assert out._t.payload == OverAggregateSpec(("k",), (AggCall("sum", "v", "s"),), "range", 9)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: s.key_by("k").over_aggregate(), "es.agg calls"),
        (lambda s: s.key_by("k").over_aggregate(es.agg.sum("v", "s"), frame="groups"), "'rows'"),
        (lambda s: s.key_by("k").over_aggregate(es.agg.sum("v", "s"), preceding=-1), ">= 0"),
    ],
)
def test_misuse_is_refused_when_the_job_is_built(build: Any, message: str) -> None:
    env = es.Environment(parallelism=1, runner="local")
    with pytest.raises(ConfigurationError, match=message):
        build(_batches(env))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_local_job_with_checkpoints_equals_duckdb(backend: str, tmp_path: Path) -> None:
    table = pa.table({"k": [v % 5 for v in range(3_000)], "v": list(range(3_000))})
    table = table.append_column("ts", pa.array([v * 7 for v in range(3_000)], pa.int64()))
    pq.write_table(table, tmp_path / "rows.parquet")
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "checkpoints"))
    if backend == "rocksdb":
        env.set_state_backend(es.state.RocksDBStateBackend())
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("ts")
    rows = env.from_parquet(
        str(tmp_path / "rows.parquet"), batch_size=100, watermark_strategy=strategy
    )
    (
        rows.key_by("k")
        .over_aggregate(es.agg.sum("v", "s"), es.agg.count_star("n"), frame="range", preceding=70)
        .to_rows()
        .map(lambda r: [r["k"], r["v"], r["s"], r["n"]])
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("over")
    got = sorted(map(tuple, es.testing.read_committed(tmp_path / "out")))
    with duckdb.connect() as db:
        db.register("t", table)
        expected = db.execute(
            "SELECT k, v, SUM(v) OVER w, COUNT(*) OVER w FROM t WINDOW w AS (PARTITION BY k "
            "ORDER BY ts RANGE BETWEEN 70 PRECEDING AND CURRENT ROW)"
        ).fetchall()
    assert got == sorted(tuple(int(x) for x in r) for r in expected)
