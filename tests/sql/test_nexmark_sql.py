"""Flink's Nexmark SQL, run unchanged apart from the DDL, equal to DuckDB over the same
events (local runner, parallelism 2, checkpoints on, exactly-once FileSink)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import (
    count_char,
    nexmark_arrow_tables,
    nexmark_ddl,
    query_statements,
    read_sink_rows,
)

import epochstream as es

EVENTS = 30_000


@pytest.fixture(scope="module")
def tables() -> dict:
    return nexmark_arrow_tables(events=EVENTS)


def _sorted(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r))


@pytest.mark.parametrize(
    "query", ["q0", "q1", "q2", "q3", "q5", "q7", "q8", "q11", "q14", "q20", "q21", "q22"]
)
def test_nexmark_query_equals_duckdb(query: str, tables: dict, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    create, insert = query_statements(query, out)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(nexmark_ddl(events=EVENTS))
    env.create_temporary_function("count_char", es.sql.udf(result_type="BIGINT")(count_char))
    env.execute_sql(create)
    env.execute_sql(insert)
    got = _sorted(read_sink_rows(out))
    expected = _sorted(run_duckdb(insert, tables))
    assert len(got) == len(expected)
    assert got == expected


def test_nexmark_q12_processing_time_windows_count_every_bid(tables: dict, tmp_path: Path) -> None:
    """q12 windows by the slots' clocks, so its windows differ run to run; the bids per
    bidder summed over the windows equal DuckDB's count (the last windows fire at the
    end of the bounded input)."""
    out = str(tmp_path / "out")
    ddl, insert = query_statements("q12", out)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(nexmark_ddl(events=EVENTS))
    env.execute_sql(ddl)
    env.execute_sql(insert)
    totals: dict[object, int] = {}
    for bidder, count, start, end in read_sink_rows(out):
        assert end - start == dt.timedelta(seconds=10)
        totals[bidder] = totals.get(bidder, 0) + count
    expected = dict(run_duckdb("SELECT bidder, COUNT(*) FROM bid GROUP BY bidder", tables))
    assert totals == expected
