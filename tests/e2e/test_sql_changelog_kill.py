"""Updating SQL results into PostgreSQL upserts through a SIGKILL of a slot, on Spark:
one statement set writes a GROUP BY without a window (a changelog of +I/-U/+U) and a
deduplication (ROW_NUMBER() ... = 1) over a bounded, rate-limited Nexmark table into
two ``jdbc`` tables keyed by their PRIMARY KEYs, checkpointing every 0.3 s. A slot is
killed after the first upserts are committed; the restarted job replays from the last
checkpoint and its upserts converge: at the end each table equals DuckDB's answer.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import is_python_process

import epochstream as es

sys.path.insert(0, str(Path(__file__).parents[1] / "sql"))

from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl

psycopg = pytest.importorskip("psycopg")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

EVENTS = 60_000
RATE = 6_000  # positions/s of the source: about 10 s of input, so the kill lands mid-run
WAIT = 120.0

PER_BIDDER = (
    "SELECT bidder, COUNT(*) AS bids, SUM(price) AS total, AVG(price) AS mean "
    "FROM bid GROUP BY bidder"
)
# The latest bid per auction (Nexmark q18's shape), ties on time broken by price.
LATEST = (
    "SELECT auction, price FROM (SELECT auction, price, `dateTime`, ROW_NUMBER() OVER "
    "(PARTITION BY auction ORDER BY `dateTime` DESC, price DESC) AS rn FROM bid) WHERE rn = 1"
)


def _script(dsn: str) -> str:
    fields = dict(part.split("=", 1) for part in dsn.split())
    url = f"jdbc:postgresql://{fields['host']}:{fields['port']}/{fields['dbname']}"
    ddl = nexmark_ddl(events=EVENTS).replace(
        "'first-event.rate'", f"'rate' = '{RATE}', 'first-event.rate'"
    )
    jdbc = f"'connector' = 'jdbc', 'url' = '{url}', 'username' = '{fields['user']}'"
    return f"""{ddl}
CREATE TABLE per_bidder (bidder BIGINT, bids BIGINT, total BIGINT, mean BIGINT,
  PRIMARY KEY (bidder) NOT ENFORCED) WITH ({jdbc}, 'table-name' = 'per_bidder');
CREATE TABLE latest (auction BIGINT, price BIGINT, PRIMARY KEY (auction) NOT ENFORCED)
  WITH ({jdbc}, 'table-name' = 'latest');
EXECUTE STATEMENT SET BEGIN
INSERT INTO per_bidder {PER_BIDDER};
INSERT INTO latest {LATEST};
END;
"""


def _rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT * FROM {table}").fetchall()


def test_updating_results_upsert_into_postgres_exactly_through_a_slot_sigkill(
    spark: Any, tmp_path: Path, postgres_dsn: str
) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE per_bidder (bidder BIGINT PRIMARY KEY, bids BIGINT, total BIGINT, "
            "mean BIGINT)"
        )
        conn.execute("CREATE TABLE latest (auction BIGINT PRIMARY KEY, price BIGINT)")
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ck"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    client: Any = env.execute_sql(_script(postgres_dsn), wait=False)
    try:
        deadline = time.monotonic() + WAIT
        while not _rows(postgres_dsn, "per_bidder"):
            assert not client.done, f"the job ended before any result: {client.failures}"
            assert time.monotonic() < deadline, f"no committed result after {WAIT} s"
            time.sleep(0.05)
        client.wait_for_checkpoint(len(client.completed_checkpoints()) + 1, timeout=WAIT)
        assert not client.done, "the input ended before the kill: raise EVENTS or lower RATE"
        pid = client.slot_pids()[1]
        assert is_python_process(pid)
        os.kill(pid, signal.SIGKILL)
        client.result(timeout=WAIT)
    finally:
        if not client.done:
            client.cancel()
    assert client.attempt >= 2, "the kill did not restart the job"

    tables = nexmark_arrow_tables(events=EVENTS)
    for table, query in (("per_bidder", PER_BIDDER), ("latest", LATEST)):
        expected = collections.Counter(run_duckdb(query, tables))
        assert len(expected) > 100
        assert collections.Counter(_rows(postgres_dsn, table)) == expected, table
