"""Deduplication by processing time keeping the first row (``ROW_NUMBER() OVER
(PARTITION BY k ORDER BY proctime ASC) = 1``): the first row of each key to arrive,
insert-only (Flink's ``ProcTimeDeduplicateKeepFirstRowFunction``), so it goes to an
append-only sink; keeping the last row by processing time stays an updating result."""

from __future__ import annotations

from pathlib import Path

from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl, read_sink_rows

import epochstream as es

EVENTS = 4_000
FIRST = (
    "SELECT auction, bidder, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction "
    "ORDER BY pt {direction}) AS rn FROM (SELECT *, PROCTIME() AS pt FROM bid)) WHERE rn = 1"
)


def test_keep_first_by_processing_time_is_insert_only_one_row_per_key(tmp_path: Path) -> None:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(nexmark_ddl(events=EVENTS))
    query = FIRST.format(direction="ASC")
    plan = env.explain_sql(query)
    assert "changelog" not in plan and "order: arrival" in plan
    env.execute_sql(
        "CREATE TABLE firsts (auction BIGINT, bidder BIGINT, price BIGINT) WITH ("
        f"'connector' = 'filesystem', 'path' = '{tmp_path / 'out'}', 'format' = 'parquet');"
        f"INSERT INTO firsts {query}"
    )
    got = read_sink_rows(str(tmp_path / "out"))
    bids = set(
        run_duckdb("SELECT auction, bidder, price FROM bid", nexmark_arrow_tables(events=EVENTS))
    )
    auctions = {row[0] for row in bids}
    assert sorted(row[0] for row in got) == sorted(auctions)  # each key exactly once
    assert set(got) <= bids  # and the row is one of its bids


def test_keep_last_by_processing_time_stays_updating() -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=100))
    plan = env.explain_sql(FIRST.format(direction="DESC"))
    assert "changelog: +I, -U, +U (unique key: auction)" in plan
