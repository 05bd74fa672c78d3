"""JetStream as a SQL source against a real nats-server (the ``nats_url`` fixture): a
``CREATE TABLE ... WITH ('connector' = 'jetstream', 'format' = 'json')`` filtered into
a Parquet table, a TUMBLE aggregation over a ``WATERMARK``'d one (equal to DuckDB's),
and a malformed message failing the job with its stream and sequence.

A JetStream table is unbounded (JetStreamSource has no bounded mode): each job runs
until its committed output equals the expected rows, then is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import read_sink_rows

import epochstream as es

nats = pytest.importorskip("nats")

BASE = datetime(2026, 11, 28, 12, 0, 0)
WAIT = 60.0  # seconds a job may take to commit its whole result


def _stream(url: str, records: list[dict[str, Any] | bytes]) -> tuple[str, str]:
    """A new stream holding ``records`` (JSON objects, or raw payloads), on one subject."""
    from nats.js.api import StreamConfig

    name = f"S{uuid.uuid4().hex[:10]}"
    subject = f"{name}.events"

    async def work() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"]))
            for r in records:
                await js.publish(subject, r if isinstance(r, bytes) else json.dumps(r).encode())
            # Another subject of the stream, filtered out by the table's 'subject'.
            await js.publish(f"{name}.other", b'{"k": "other", "v": 1}')
        finally:
            await nc.close()

    asyncio.run(work())
    return name, subject


def _env(tmp_path: Path) -> es.Environment:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.3, storage=str(tmp_path / "ck"))
    return env


def _table(url: str, stream: str, subject: str, extra: str = "") -> str:
    return (
        "CREATE TABLE events (k STRING, v BIGINT, ts TIMESTAMP(3), "
        "WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ("
        f"'connector' = 'jetstream', 'servers' = '{url}', 'stream' = '{stream}', "
        f"'subject' = '{subject}', 'format' = 'json'{extra})"
    )


def _out(path: Path, columns: str) -> str:
    return (
        f"CREATE TABLE out ({columns}) WITH "
        f"('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet')"
    )


def _run_until(env: es.Environment, script: str, out: Path, expected: list[Any]) -> None:
    """Run the unbounded ``script``; cancel once ``out`` holds ``expected``."""
    client: Any = env.execute_sql(script, wait=False)
    deadline = time.monotonic() + WAIT
    try:
        while sorted(read_sink_rows(str(out)) if out.is_dir() else []) != expected:
            assert not client.done, f"the job ended: {client.failures}"
            assert time.monotonic() < deadline, f"not all of the result after {WAIT} s"
            time.sleep(0.1)
    finally:
        if not client.done:
            client.cancel()
    assert sorted(read_sink_rows(str(out))) == expected


def _events(n: int) -> list[dict[str, Any]]:
    """``n`` events of 5 keys, 20 ms apart, up to 0.7 s out of order (within the 1 s bound)."""
    return [
        {
            "k": f"k{i % 5}",
            "v": i,
            "ts": (BASE + timedelta(milliseconds=i * 20 - (i * 37) % 700)).isoformat(
                sep=" ", timespec="milliseconds"
            ),
        }
        for i in range(n)
    ]


def test_a_filter_over_a_jetstream_table(nats_url: str, tmp_path: Path) -> None:
    records = _events(500)
    stream, subject = _stream(nats_url, [*records])
    out = tmp_path / "out"
    env = _env(tmp_path)
    script = ";\n".join(
        [
            _table(nats_url, stream, subject),
            _out(out, "k STRING, v BIGINT"),
            "INSERT INTO out SELECT k, v * 10 FROM events WHERE v % 3 = 0 AND k <> 'k4'",
        ]
    )
    expected = sorted((r["k"], r["v"] * 10) for r in records if r["v"] % 3 == 0 and r["k"] != "k4")
    _run_until(env, script, out, expected)


def test_a_tumble_aggregation_over_a_watermarked_jetstream_table(
    nats_url: str, tmp_path: Path
) -> None:
    records = _events(2_000)
    # An event an hour later: the watermark passes every window above.
    late = {"k": "end", "v": 0, "ts": (BASE + timedelta(hours=1)).isoformat(sep=" ")}
    stream, subject = _stream(nats_url, [*records, late])
    out = tmp_path / "out"
    query = (
        "SELECT k, window_start, COUNT(*) AS n, SUM(v) AS total "
        "FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND)) "
        "GROUP BY k, window_start, window_end"
    )
    events = pa.table(
        {
            "k": [r["k"] for r in records],
            "v": pa.array([r["v"] for r in records], pa.int64()),
            "ts": pa.array([datetime.fromisoformat(r["ts"]) for r in records], pa.timestamp("ms")),
        }
    )
    expected = sorted(run_duckdb(query, {"events": events}))
    env = _env(tmp_path)
    script = ";\n".join(
        [
            _table(nats_url, stream, subject, ", 'scan.watermark.idle-timeout' = '1 s'"),
            _out(out, "k STRING, window_start TIMESTAMP(3), n BIGINT, total BIGINT"),
            f"INSERT INTO out {query}",
        ]
    )
    _run_until(env, script, out, expected)
    assert len(expected) > 100  # 5 keys over 40 s of windows


def test_the_start_sequence_skips_what_is_before_it(nats_url: str, tmp_path: Path) -> None:
    stream, subject = _stream(nats_url, [*_events(10)])
    out = tmp_path / "out"
    script = ";\n".join(
        [
            _table(nats_url, stream, subject, ", 'scan.startup.sequence' = '8'"),
            _out(out, "v BIGINT"),
            "INSERT INTO out SELECT v FROM events",
        ]
    )
    _run_until(_env(tmp_path), script, out, [(7,), (8,), (9,)])


def test_a_malformed_message_fails_the_job_naming_stream_and_sequence(
    nats_url: str, tmp_path: Path
) -> None:
    records: list[dict[str, Any] | bytes] = [*_events(3), b'{"k": "k3", "v": "not a number"}']
    stream, subject = _stream(nats_url, records)
    env = _env(tmp_path)
    script = ";\n".join(
        [
            _table(nats_url, stream, subject),
            _out(tmp_path / "out", "k STRING, v BIGINT"),
            "INSERT INTO out SELECT k, v FROM events",
        ]
    )
    with pytest.raises(es.JobExecutionError) as info:
        env.execute_sql(script)
    assert f"cannot decode JetStream message {stream} at sequence 4 as json" in str(info.value)


def test_jetstream_source_options_are_checked(nats_url: str) -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(
        "CREATE TABLE bad (k STRING) WITH ('connector' = 'jetstream', "
        f"'servers' = '{nats_url}', 'stream' = 'S', 'scan.bounded.mode' = 'latest')"
    )
    with pytest.raises(es.SqlError) as info:
        env.sql_query("SELECT k FROM bad")
    assert re.match(
        r"line 1, column \d+: table 'bad', option 'scan.bounded.mode': is not an option of "
        "the jetstream connector as a source",
        str(info.value),
    )
    env.execute_sql(
        "CREATE TABLE nostream (k STRING) WITH ('connector' = 'jetstream', "
        f"'servers' = '{nats_url}')"
    )
    with pytest.raises(es.SqlError, match="option 'stream': is required"):
        env.sql_query("SELECT k FROM nostream")
