"""``PARTITIONED BY`` on a filesystem sink table: rows under ``<col>=<value>/``
directories (Flink's layout) without the partition columns in the files; read back
with the partitions as columns, equal to DuckDB's result. Other uses are refused at
the clause's position."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl

import epochstream as es

EVENTS = 10_000
QUERY = (
    "SELECT channel, auction, window_start, COUNT(*) AS bids, MAX(price) AS top "
    "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '5' SECOND)) "
    "GROUP BY channel, auction, window_start, window_end"
)


def _env(tmp_path: Path) -> es.Environment:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(nexmark_ddl(events=EVENTS))
    return env


def test_insert_into_a_partitioned_filesystem_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = _env(tmp_path)
    env.execute_sql(
        "CREATE TABLE hot (channel STRING, auction BIGINT, window_start TIMESTAMP(3), "
        "bids BIGINT, top BIGINT) PARTITIONED BY (channel) WITH ("
        f"'connector' = 'filesystem', 'path' = '{out}', 'format' = 'parquet')"
    )
    env.execute_sql(f"INSERT INTO hot {QUERY}")
    expected = sorted(run_duckdb(QUERY, nexmark_arrow_tables(events=EVENTS)))
    channels = sorted({row[0] for row in expected})
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        f"channel={c}" for c in channels
    ]
    one = next(next(out.glob("channel=*")).glob("part-*"))
    assert pq.read_schema(one).names == ["auction", "window_start", "bids", "top"]
    table = ds.dataset(
        out,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("channel", pa.string())]), flavor="hive"),
    ).to_table()
    got = sorted(
        zip(
            *(
                table.column(c).to_pylist()
                for c in ("channel", "auction", "window_start", "bids", "top")
            ),
            strict=True,
        )
    )
    assert got == expected


def test_partitioned_by_is_checked_where_it_is_written(tmp_path: Path) -> None:
    env = _env(tmp_path)
    with pytest.raises(
        es.SqlError, match=r"line 1, column \d+: table 'p': PARTITIONED BY c: no column 'c'"
    ):
        env.execute_sql("CREATE TABLE p (a BIGINT) PARTITIONED BY (c) WITH ('connector' = 'print')")
    env.execute_sql(
        "CREATE TABLE j (a BIGINT, b STRING) PARTITIONED BY (b) WITH ('connector' = 'jdbc', "
        "'url' = 'jdbc:postgresql://h/db', 'table-name' = 'j')"
    )
    with pytest.raises(es.SqlError) as info:
        env.explain_sql("INSERT INTO j SELECT auction, channel FROM bid")
    assert re.match(
        r"line 1, column \d+: table 'j': PARTITIONED BY is supported by the filesystem "
        "connector only, not 'jdbc'",
        str(info.value),
    )
    env.execute_sql(
        f"CREATE TABLE f (a BIGINT, b STRING) PARTITIONED BY (b) WITH ('connector' = "
        f"'filesystem', 'path' = '{tmp_path / 'f'}', 'format' = 'parquet')"
    )
    with pytest.raises(es.SqlError, match="a PARTITIONED BY table can only be written"):
        env.sql_query("SELECT a FROM f")
