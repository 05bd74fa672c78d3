"""SUM and AVG of a DECIMAL column are exact, in Flink's types: SUM is DECIMAL(38, s),
AVG DECIMAL(38, max(6, s)) rounded half up; in a GROUP BY without a window (also over
another GROUP BY's changelog, retractions included), a window aggregation, and a
restore of their partials. An OVER window refuses them with the reason."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from nexmark_tables import changelog_result

import epochstream as es
from epochstream.graph.specs import AggCall
from epochstream.runtime.operators.columnar_window_aggregates import AggregateCalls

MS = dt.timedelta(milliseconds=1)
T0 = dt.datetime(2026, 1, 1)


def _env(tmp_path: Path) -> es.Environment:
    (tmp_path / "in").mkdir()
    amounts = ["1.25", "2.50", None, "-0.01", "0.02"]
    table = pa.table(
        {
            "k": ["a", "a", "b", None, "c"],
            "m": pa.array([Decimal(a) if a else None for a in amounts], pa.decimal128(10, 2)),
            "ts": pa.array([T0, T0 + 500 * MS, T0 + 1000 * MS, T0 + 1000 * MS, T0 + 1500 * MS]),
        }
    )
    pq.write_table(
        table.cast(table.schema.set(2, pa.field("ts", pa.timestamp("ms")))),
        tmp_path / "in" / "p.parquet",
    )
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(
        "CREATE TABLE t (k STRING, m DECIMAL(10, 2), ts TIMESTAMP(3), WATERMARK FOR ts AS ts) "
        f"WITH ('connector' = 'filesystem', 'path' = '{tmp_path / 'in'}', 'format' = 'parquet')"
    )
    return env


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            "SELECT k, SUM(m) AS s, AVG(m) AS a FROM t GROUP BY k",
            {
                ("a", Decimal("3.75"), Decimal("1.875000")),
                ("b", None, None),
                (None, Decimal("-0.01"), Decimal("-0.010000")),
                ("c", Decimal("0.02"), Decimal("0.020000")),
            },
        ),
        ("SELECT SUM(m) AS s, AVG(m) AS a FROM t", {(Decimal("3.76"), Decimal("0.940000"))}),
        (
            # over a changelog: the groups with n = 1 lose b, c and NULL's sums and gain them
            "SELECT n, SUM(s) AS s2, AVG(s) AS a2 FROM "
            "(SELECT k, COUNT(*) AS n, SUM(m) AS s FROM t GROUP BY k) GROUP BY n",
            {(2, Decimal("3.75"), Decimal("3.750000")), (1, Decimal("0.01"), Decimal("0.005000"))},
        ),
        (
            "SELECT window_start, SUM(m) AS s, AVG(m) AS a FROM TABLE(TUMBLE(TABLE t, "
            "DESCRIPTOR(ts), INTERVAL '1' SECOND)) GROUP BY window_start, window_end",
            {
                (T0, Decimal("3.75"), Decimal("1.875000")),
                (T0 + 1000 * MS, Decimal("0.01"), Decimal("0.005000")),
            },
        ),
    ],
)
def test_decimal_sums_and_averages_are_exact(
    query: str, expected: set[tuple[object, ...]], tmp_path: Path
) -> None:
    env = _env(tmp_path)
    env.sql_query(query).sink_to(es.sinks.FileSink(str(tmp_path / "out"), "parquet")).uid("out")
    env.execute("decimal")
    assert set(changelog_result(str(tmp_path / "out"))) == expected


def test_restored_partials_keep_a_decimal_sum_decimal() -> None:
    aggs = (AggCall("sum", "m", "s"), AggCall("avg", "x", "a"))
    calls = AggregateCalls(aggs, {"x"}, decimal_scales={"m": 2})
    names = [p.name for p in calls.partials]
    schema = pa.schema(
        [(n, pa.decimal128(38, 2) if n == "_wa0_s" else pa.float64()) for n in names]
    )
    restored = AggregateCalls.restored(aggs, schema, {})
    assert restored.decimals == {"m": 2} and restored.floats == {"x"}


def test_an_over_window_refuses_a_decimal_sum(tmp_path: Path) -> None:
    env = _env(tmp_path)
    with pytest.raises(es.SqlError, match="SUM of a DECIMAL over an OVER window"):
        env.explain_sql(
            "SELECT k, SUM(m) OVER (PARTITION BY k ORDER BY ts ROWS BETWEEN 1 PRECEDING "
            "AND CURRENT ROW) FROM t"
        )
