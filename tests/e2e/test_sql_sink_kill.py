"""One SQL statement set into the batch-form transactional sinks, through a SIGKILL of
a slot, on Spark: ``EXECUTE STATEMENT SET`` writes a TUMBLE aggregation over a bounded
(rate-limited) Nexmark table into a ``jdbc`` table with a PRIMARY KEY (upserted, real
PostgreSQL), a ``delta`` table, a ``jetstream`` sink and a ``filesystem`` table
``PARTITIONED BY (channel)``, checkpointing every 0.3 s. A slot process is killed
after the first results are committed; the restart strategy recovers the job, which
runs to the end of its input. Each sink then holds exactly DuckDB's result: nothing
lost, nothing twice (the Delta table, the JetStream stream and the partitioned files
compared as multisets, so a duplicate shows).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from e2e_support import is_python_process

import epochstream as es

sys.path.insert(0, str(Path(__file__).parents[1] / "sql"))

from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl

nats = pytest.importorskip("nats")
deltalake = pytest.importorskip("deltalake")
psycopg = pytest.importorskip("psycopg")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

EVENTS = 60_000
FIRST_EVENT_RATE = 1_000  # 60 s of event time: windows close all along the run
RATE = 6_000  # positions/s of the source: about 10 s of input, so the kill lands mid-run
WAIT = 120.0

QUERY = (
    "SELECT channel, window_start, COUNT(*) AS bids, MAX(price) AS top "
    "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '1' SECOND)) "
    "GROUP BY channel, window_start, window_end"
)
COLUMNS = "channel STRING, window_start TIMESTAMP(3), bids BIGINT, top BIGINT"

Row = tuple[str, datetime, int, int]


def _script(dsn: str, delta: Path, nats_url: str, subject: str, files: Path) -> str:
    fields = dict(part.split("=", 1) for part in dsn.split())
    url = f"jdbc:postgresql://{fields['host']}:{fields['port']}/{fields['dbname']}"
    ddl = nexmark_ddl(events=EVENTS, rate=FIRST_EVENT_RATE).replace(
        "'first-event.rate'", f"'rate' = '{RATE}', 'first-event.rate'"
    )
    return f"""{ddl}
CREATE TABLE pg ({COLUMNS}, PRIMARY KEY (channel, window_start) NOT ENFORCED) WITH (
  'connector' = 'jdbc', 'url' = '{url}', 'table-name' = 'hot', 'username' = '{fields["user"]}');
CREATE TABLE dl ({COLUMNS}) WITH ('connector' = 'delta', 'table-path' = '{delta}');
CREATE TABLE js ({COLUMNS}) WITH (
  'connector' = 'jetstream', 'servers' = '{nats_url}', 'subject' = '{subject}');
CREATE TABLE fs ({COLUMNS}) PARTITIONED BY (channel) WITH (
  'connector' = 'filesystem', 'path' = '{files}', 'format' = 'parquet');
EXECUTE STATEMENT SET BEGIN
INSERT INTO pg {QUERY};
INSERT INTO dl {QUERY};
INSERT INTO js {QUERY};
INSERT INTO fs {QUERY};
END;
"""


async def _with_js(url: str, work: Any) -> Any:
    nc = await nats.connect(url)
    try:
        return await work(nc.jetstream())
    finally:
        await nc.close()


def _jetstream_rows(url: str, stream: str) -> list[Row]:
    """Every message of ``stream`` as a row (its JSON: timestamps as ISO-8601)."""

    async def work(js: Any) -> list[dict[str, Any]]:
        info = await js.stream_info(stream)
        if info.state.messages == 0:
            return []
        return [
            json.loads((await js.get_msg(stream, seq)).data)
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]

    return [
        (m["channel"], datetime.fromisoformat(m["window_start"]), m["bids"], m["top"])
        for m in asyncio.run(_with_js(url, work))
    ]


def _partitioned_rows(files: Path) -> list[Row]:
    """The committed part files (hidden ones ignored), ``channel`` from the directories."""
    table = ds.dataset(
        files,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("channel", pa.string())]), flavor="hive"),
    ).to_table()
    names = ("channel", "window_start", "bids", "top")
    return list(zip(*(table.column(n).to_pylist() for n in names), strict=True))


def _postgres_rows(dsn: str) -> list[Row]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT channel, window_start, bids, top FROM hot").fetchall()


def test_a_statement_set_into_jdbc_delta_jetstream_and_files_is_exact_through_a_slot_sigkill(
    spark: Any, tmp_path: Path, postgres_dsn: str, nats_url: str
) -> None:
    from nats.js.api import StreamConfig

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE hot (channel TEXT, window_start TIMESTAMP, bids BIGINT, top BIGINT, "
            "PRIMARY KEY (channel, window_start))"
        )
    stream = f"S{uuid.uuid4().hex[:10]}"
    subject = f"{stream}.out"

    async def create(js: Any) -> None:
        # The default 2-minute duplicate window covers a re-publish after the restart.
        await js.add_stream(StreamConfig(name=stream, subjects=[subject]))

    asyncio.run(_with_js(nats_url, create))
    delta = tmp_path / "delta"
    files = tmp_path / "files"

    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ck"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    client: Any = env.execute_sql(
        _script(postgres_dsn, delta, nats_url, subject, files), wait=False
    )
    try:
        # Results are committed before the kill: the restarted job must neither repeat
        # nor lose them.
        deadline = time.monotonic() + WAIT
        while not _postgres_rows(postgres_dsn):
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

    expected = collections.Counter(
        run_duckdb(QUERY, nexmark_arrow_tables(events=EVENTS, rate=FIRST_EVENT_RATE))
    )
    assert len(expected) > 100  # every channel over 60 s of windows

    assert collections.Counter(_postgres_rows(postgres_dsn)) == expected
    table = deltalake.DeltaTable(str(delta)).to_pyarrow_table()
    assert collections.Counter(tuple(r.values()) for r in table.to_pylist()) == expected
    assert collections.Counter(_jetstream_rows(nats_url, stream)) == expected
    assert collections.Counter(_partitioned_rows(files)) == expected
