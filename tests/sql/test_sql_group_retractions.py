"""A GROUP BY over another GROUP BY's changelog with MIN, MAX and COUNT(DISTINCT) (their
values kept with counts, so a retraction of the extreme falls back to the next), and
the mini-batch options (``table.exec.mini-batch.*``): the changelog applied equals
DuckDB's table; a mini-batch without its latency or size is refused at planning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl
from test_nexmark_sql import changelog_result

import epochstream as es

EVENTS = 6_000

#: Per bid count of an auction, the auctions' id range, the distinct bidders' count of
#: their top bids, and the group's size: every value may be retracted when an auction's
#: count moves on.
QUERY = """
SELECT n, MAX(auction) AS top, MIN(auction) AS low, COUNT(DISTINCT top_bidder) AS bidders,
       COUNT(*) AS auctions, MAX(price) AS best
FROM (SELECT auction, COUNT(*) AS n, MAX(bidder) AS top_bidder, MAX(price) AS price
      FROM bid GROUP BY auction)
GROUP BY n
"""


@pytest.fixture(scope="module")
def tables() -> dict:
    return nexmark_arrow_tables(events=EVENTS)


def _sorted(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r))


def _run(tmp_path: Path, settings: list[str]) -> list[tuple[object, ...]]:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(nexmark_ddl(events=EVENTS))
    for statement in settings:
        env.execute_sql(statement)
    changes = env.sql_query(QUERY)
    changes.sink_to(es.sinks.FileSink(str(tmp_path / "out"), "parquet")).uid("changes")
    env.execute("retractions")
    return _sorted(changelog_result(str(tmp_path / "out")))


def test_min_max_count_distinct_over_a_changelog_equal_duckdb(tables: dict, tmp_path: Path) -> None:
    got = _run(tmp_path, [])
    expected = _sorted(run_duckdb(QUERY, tables))
    assert len(expected) > 5  # several groups, so retractions move values between them
    assert len(got) == len(expected)
    assert got == expected


def test_mini_batch_leaves_the_same_table(tables: dict, tmp_path: Path) -> None:
    got = _run(
        tmp_path,
        [
            "SET 'table.exec.mini-batch.enabled' = 'true'",
            "SET 'table.exec.mini-batch.allow-latency' = '200 ms'",
            "SET 'table.exec.mini-batch.size' = '500'",
        ],
    )
    assert got == _sorted(run_duckdb(QUERY, tables))


@pytest.mark.parametrize(
    ("settings", "missing"),
    [
        (["SET 'table.exec.mini-batch.size' = '5000'"], "allow-latency"),
        (["SET 'table.exec.mini-batch.allow-latency' = '2 s'"], "size"),
        (
            [
                "SET 'table.exec.mini-batch.allow-latency' = '0 s'",
                "SET 'table.exec.mini-batch.size' = '5000'",
            ],
            "allow-latency",
        ),
    ],
)
def test_mini_batch_without_latency_or_size_is_refused_at_the_group_by(
    settings: list[str], missing: str
) -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=10))
    env.execute_sql("SET 'table.exec.mini-batch.enabled' = 'true'")
    for statement in settings:
        env.execute_sql(statement)
    words = rf"line 1.*table.exec.mini-batch.{re.escape(missing)} is not set above 0"
    with pytest.raises(es.SqlError, match=words):
        env.explain_sql("SELECT auction, COUNT(*) FROM bid GROUP BY auction")


def test_mini_batch_reaches_the_group_aggregate_plan() -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=10))
    env.execute_sql("SET 'table.exec.mini-batch.enabled' = 'true'")
    env.execute_sql("SET 'table.exec.mini-batch.allow-latency' = '2 s'")
    env.execute_sql("SET 'table.exec.mini-batch.size' = '5000'")
    plan = env.explain_sql("SELECT auction, COUNT(*) FROM bid GROUP BY auction")
    assert "mini-batch" in plan
