"""``SELECT DISTINCT`` and ``UNION`` (DISTINCT over ``UNION ALL``): DISTINCT planned as a
GROUP BY
of every output column (Flink's rewrite), an updating result; over an append-only input
and over another GROUP BY's changelog (a row goes away when no input row gives it any
more), each equal to DuckDB."""

from __future__ import annotations

from pathlib import Path

import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import changelog_result, nexmark_arrow_tables, nexmark_ddl

import epochstream as es

EVENTS = 4_000

QUERIES = [
    "SELECT DISTINCT bidder, channel FROM bid WHERE price > 1000",
    "SELECT DISTINCT MOD(auction, 7) AS m, price > 5000 AS big FROM bid",
    # over a changelog: a count moving from n to n + 1 retracts (n) once its last
    # auction moves on
    "SELECT DISTINCT n FROM (SELECT auction, COUNT(*) AS n FROM bid GROUP BY auction)",
    "SELECT DISTINCT * FROM (SELECT seller, category FROM auction)",
    # UNION is DISTINCT over UNION ALL
    "SELECT seller AS p FROM auction UNION SELECT bidder FROM bid WHERE price > 9000",
]


@pytest.fixture(scope="module")
def tables() -> dict:
    return nexmark_arrow_tables(events=EVENTS)


@pytest.mark.parametrize("query", QUERIES)
def test_select_distinct_equals_duckdb(query: str, tables: dict, tmp_path: Path) -> None:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(nexmark_ddl(events=EVENTS))
    changes = env.sql_query(query)
    changes.sink_to(es.sinks.FileSink(str(tmp_path / "out"), "parquet")).uid("changes")
    env.execute("distinct")
    got = sorted(changelog_result(str(tmp_path / "out")), key=repr)
    expected = sorted(run_duckdb(query, tables), key=repr)
    assert len(expected) > 3
    assert got == expected


def test_distinct_is_an_updating_result_keyed_by_its_columns() -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=100))
    plan = env.explain_sql("SELECT DISTINCT bidder, channel FROM bid")
    assert "changelog: +I, -U, +U (unique key: bidder, channel)" in plan
    with pytest.raises(es.SqlError, match="append"):
        env.execute_sql(
            "CREATE TABLE out_ (bidder BIGINT, channel STRING) WITH ("
            "'connector' = 'filesystem', 'path' = '/tmp/unused-distinct', 'format' = 'csv');"
            "INSERT INTO out_ SELECT DISTINCT bidder, channel FROM bid"
        )
