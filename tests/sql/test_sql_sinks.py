"""SQL INSERT INTO the transactional sinks' DDL connectors, against the real systems:
PostgreSQL through Flink's JDBC options (upsert by the primary key, or two-phase
commit without one) and Delta; each result equal to DuckDB's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl

import epochstream as es

EVENTS = 10_000
QUERY = (
    "SELECT auction, window_start, COUNT(*) AS bids, MAX(price) AS top "
    "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '5' SECOND)) "
    "GROUP BY auction, window_start, window_end"
)


@pytest.fixture(scope="module")
def expected() -> list[tuple[object, ...]]:
    return run_duckdb(QUERY, nexmark_arrow_tables(events=EVENTS))


def _env(tmp_path: Path) -> es.Environment:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(nexmark_ddl(events=EVENTS))
    return env


def _jdbc(dsn: str) -> tuple[str, str]:
    fields = dict(part.split("=", 1) for part in dsn.split())
    return f"jdbc:postgresql://{fields['host']}:{fields['port']}/{fields['dbname']}", fields["user"]


@pytest.mark.parametrize("keyed", [True, False], ids=["upsert", "two-phase"])
def test_insert_into_postgres(
    postgres_dsn: str, tmp_path: Path, expected: list[tuple[object, ...]], keyed: bool
) -> None:
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE hot (auction BIGINT, window_start TIMESTAMP, bids BIGINT, top BIGINT"
            + (", PRIMARY KEY (auction, window_start))" if keyed else ")")
        )
    url, user = _jdbc(postgres_dsn)
    key = ", PRIMARY KEY (auction, window_start) NOT ENFORCED" if keyed else ""
    env = _env(tmp_path)
    env.execute_sql(
        f"CREATE TABLE hot (auction BIGINT, window_start TIMESTAMP(3), bids BIGINT, top BIGINT"
        f"{key}) WITH ('connector' = 'jdbc', 'url' = '{url}', 'table-name' = 'hot', "
        f"'username' = '{user}')"
    )
    env.execute_sql(f"INSERT INTO hot {QUERY}")
    with psycopg.connect(postgres_dsn) as conn:
        got = sorted(conn.execute("SELECT auction, window_start, bids, top FROM hot").fetchall())
    assert got == sorted(expected)


def test_insert_into_delta(tmp_path: Path, expected: list[tuple[object, ...]]) -> None:
    deltalake = pytest.importorskip("deltalake")
    env = _env(tmp_path)
    path = tmp_path / "delta"
    env.execute_sql(
        "CREATE TABLE hot (auction BIGINT, window_start TIMESTAMP(3), bids BIGINT, top BIGINT) "
        f"WITH ('connector' = 'delta', 'table-path' = '{path}')"
    )
    env.execute_sql(f"INSERT INTO hot {QUERY}")
    table = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    got = sorted(tuple(r.values()) for r in table.to_pylist())
    assert got == sorted(expected)


def test_jdbc_options_are_checked(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env.execute_sql(
        "CREATE TABLE m (a BIGINT) WITH ('connector' = 'jdbc', "
        "'url' = 'jdbc:mysql://h/db', 'table-name' = 'm', 'password' = 'hunter2')"
    )
    with pytest.raises(es.SqlError) as info:
        env.explain_sql("INSERT INTO m SELECT auction FROM bid")
    assert re.match(
        r"line 1, column \d+: table 'm', option 'url': only PostgreSQL", str(info.value)
    )
    assert "hunter2" not in str(info.value)


def test_insert_into_jetstream(nats_url: str, tmp_path: Path, expected: list) -> None:
    import asyncio
    import json
    import uuid

    nats = pytest.importorskip("nats")
    from nats.js.api import StreamConfig

    subject = f"hot.{uuid.uuid4().hex[:8]}"
    stream = f"S{uuid.uuid4().hex[:10]}"

    async def admin(work):  # type: ignore[no-untyped-def]
        nc = await nats.connect(nats_url)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()

    async def create(js):  # type: ignore[no-untyped-def]
        await js.add_stream(StreamConfig(name=stream, subjects=[subject]))

    async def read(js):  # type: ignore[no-untyped-def]
        info = await js.stream_info(stream)
        return [
            json.loads((await js.get_msg(stream, seq)).data)
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]

    asyncio.run(admin(create))
    env = _env(tmp_path)
    env.execute_sql(
        "CREATE TABLE hot (auction BIGINT, bids BIGINT, top BIGINT) WITH ("
        f"'connector' = 'jetstream', 'servers' = '{nats_url}', 'subject' = '{subject}')"
    )
    env.execute_sql(
        "INSERT INTO hot SELECT auction, COUNT(*), MAX(price) FROM TABLE(TUMBLE(TABLE bid, "
        "DESCRIPTOR(`dateTime`), INTERVAL '5' SECOND)) GROUP BY auction, window_start, window_end"
    )
    got = sorted((m["auction"], m["bids"], m["top"]) for m in asyncio.run(admin(read)))
    assert got == sorted((a, n, top) for a, _, n, top in expected)


UPDATING = (
    "SELECT bidder, COUNT(*) AS bids, MAX(price) AS top, COUNT(DISTINCT auction) AS auctions "
    "FROM bid GROUP BY bidder HAVING COUNT(*) > 1"
)


def test_an_updating_query_upserts_into_postgres_by_its_primary_key(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """A GROUP BY without a window into a jdbc table whose PRIMARY KEY is the group key:
    the table ends equal to DuckDB's GROUP BY (its -U rows skipped, +U upserted)."""
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE per_bidder (bidder BIGINT PRIMARY KEY, bids BIGINT, top BIGINT, "
            "auctions BIGINT)"
        )
    url, user = _jdbc(postgres_dsn)
    env = _env(tmp_path)
    env.execute_sql(
        "CREATE TABLE per_bidder (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT, "
        f"PRIMARY KEY (bidder) NOT ENFORCED) WITH ('connector' = 'jdbc', 'url' = '{url}', "
        f"'table-name' = 'per_bidder', 'username' = '{user}')"
    )
    env.execute_sql(f"INSERT INTO per_bidder {UPDATING}")
    with psycopg.connect(postgres_dsn) as conn:
        got = sorted(conn.execute("SELECT * FROM per_bidder").fetchall())
    assert got == sorted(run_duckdb(UPDATING, nexmark_arrow_tables(events=EVENTS)))


def test_an_updating_query_is_refused_by_an_append_only_or_mis_keyed_sink(
    postgres_dsn: str, tmp_path: Path
) -> None:
    url, user = _jdbc(postgres_dsn)
    env = _env(tmp_path)
    env.execute_sql(
        "CREATE TABLE files (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT) WITH "
        f"('connector' = 'filesystem', 'path' = '{tmp_path / 'files'}', 'format' = 'parquet');"
        "CREATE TABLE by_top (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT, "
        f"PRIMARY KEY (top) NOT ENFORCED) WITH ('connector' = 'jdbc', 'url' = '{url}', "
        f"'table-name' = 'by_top', 'username' = '{user}')"
    )
    with pytest.raises(es.SqlError, match=r"line 1, column 26: .* 'filesystem' sink takes"):
        env.explain_sql(f"INSERT INTO files {UPDATING}")
    with pytest.raises(es.SqlError, match=r"PRIMARY KEY \(top\) is not the query's unique key"):
        env.explain_sql(f"INSERT INTO by_top {UPDATING}")


def test_print_shows_each_change_with_its_kind(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(
        "CREATE TABLE words (w STRING) WITH ('connector' = 'filesystem', 'path' = "
        f"'{tmp_path / 'in.csv'}', 'format' = 'csv');"
        "CREATE TABLE shown (w STRING, n BIGINT) WITH ('connector' = 'print')"
    )
    (tmp_path / "in.csv").write_text("w\na\nb\na\n")
    env.execute_sql("INSERT INTO shown SELECT w, COUNT(*) FROM words GROUP BY w")
    lines = capfd.readouterr().out.splitlines()
    assert lines == ["+I{'w': 'a', 'n': 2}", "+I{'w': 'b', 'n': 1}"] or lines == [
        "+I{'w': 'a', 'n': 1}",
        "+I{'w': 'b', 'n': 1}",
        "-U{'w': 'a', 'n': 1}",
        "+U{'w': 'a', 'n': 2}",
    ]


def test_an_updating_query_merges_into_delta_by_its_primary_key(tmp_path: Path) -> None:
    """A GROUP BY without a window into a Delta table with a PRIMARY KEY: each
    checkpoint's changes merged by the key in one commit; the table ends equal to
    DuckDB's GROUP BY, one MERGE per checkpoint after the first commit."""
    deltalake = pytest.importorskip("deltalake")
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.3, storage=str(tmp_path / "ck"))
    # About 2 s of input: several checkpoints, so several merges.
    env.execute_sql(
        nexmark_ddl(events=EVENTS).replace(
            "'first-event.rate'", "'rate' = '5000', 'first-event.rate'"
        )
    )
    path = tmp_path / "delta"
    env.execute_sql(
        "CREATE TABLE per_bidder (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT, "
        f"PRIMARY KEY (bidder) NOT ENFORCED) WITH ('connector' = 'delta', 'table-path' = '{path}')"
    )
    env.execute_sql(f"INSERT INTO per_bidder {UPDATING}")
    table = deltalake.DeltaTable(str(path))
    got = sorted(tuple(r.values()) for r in table.to_pyarrow_table().to_pylist())
    assert got == sorted(run_duckdb(UPDATING, nexmark_arrow_tables(events=EVENTS)))
    operations = [h["operation"] for h in table.history()]
    assert len(operations) > 2 and set(operations[:-1]) == {"MERGE"}, operations
    with pytest.raises(es.SqlError, match=r"PRIMARY KEY \(top\) is not the query's unique key"):
        env.execute_sql(
            "CREATE TABLE by_top (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT, "
            "PRIMARY KEY (top) NOT ENFORCED) WITH ('connector' = 'delta', "
            f"'table-path' = '{tmp_path / 'other'}')"
        )
        env.explain_sql(f"INSERT INTO by_top {UPDATING}")


def test_an_updating_query_upserts_into_kafka_by_its_primary_key(
    kafka_server: Any, tmp_path: Path
) -> None:
    """'upsert-kafka' (Flink's options): a GROUP BY's changes keyed by the PRIMARY KEY's
    JSON, committed in Kafka transactions; the topic read as a compacted view (the last
    value per key, tombstones deleting) equals DuckDB's GROUP BY."""
    topic = kafka_server.new_topic("per-bidder", partitions=2)
    env = _env(tmp_path)
    env.execute_sql(
        "CREATE TABLE per_bidder (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT, "
        "PRIMARY KEY (bidder) NOT ENFORCED) WITH ('connector' = 'upsert-kafka', "
        f"'topic' = '{topic}', 'properties.bootstrap.servers' = '{kafka_server.bootstrap}', "
        "'key.format' = 'json', 'value.format' = 'json', "
        f"'sink.transactional-id-prefix' = 'sql-{topic}')"
    )
    env.execute_sql(f"INSERT INTO per_bidder {UPDATING}")
    view: dict[bytes, tuple[object, ...]] = {}
    for _, _, key, value in kafka_server.read_committed(topic, 2):
        if value is None:
            view.pop(key, None)
        else:
            row = json.loads(value)
            assert json.loads(key) == {"bidder": row["bidder"]}
            view[key] = tuple(row.values())
    assert sorted(view.values()) == sorted(
        run_duckdb(UPDATING, nexmark_arrow_tables(events=EVENTS))
    )


def test_upsert_kafka_options_are_checked(tmp_path: Path) -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=10))
    common = "'topic' = 't', 'properties.bootstrap.servers' = 'h:9092', 'value.format' = 'json'"
    env.execute_sql(
        f"CREATE TABLE no_key (bidder BIGINT, n BIGINT) WITH ('connector' = 'upsert-kafka', "
        f"{common}, 'key.format' = 'json');"
        f"CREATE TABLE csv_key (bidder BIGINT, n BIGINT, PRIMARY KEY (bidder) NOT ENFORCED) "
        f"WITH ('connector' = 'upsert-kafka', {common}, 'key.format' = 'csv');"
        f"CREATE TABLE no_format (bidder BIGINT, n BIGINT, PRIMARY KEY (bidder) NOT ENFORCED) "
        f"WITH ('connector' = 'upsert-kafka', 'topic' = 't', "
        "'properties.bootstrap.servers' = 'h:9092', 'key.format' = 'json')"
    )
    query = "SELECT bidder, COUNT(*) FROM bid GROUP BY bidder"
    with pytest.raises(es.SqlError, match="need a PRIMARY KEY"):
        env.explain_sql(f"INSERT INTO no_key {query}")
    with pytest.raises(es.SqlError, match=r"'key\.format'.*only 'json'"):
        env.explain_sql(f"INSERT INTO csv_key {query}")
    with pytest.raises(es.SqlError, match=r"'value\.format'.*required"):
        env.explain_sql(f"INSERT INTO no_format {query}")
    with pytest.raises(es.SqlError, match="can only be written"):
        env.explain_sql("SELECT * FROM csv_key")


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_an_updating_query_into_a_changelog_filesystem_table(tmp_path: Path, fmt: str) -> None:
    """'changelog-mode' = 'all' (epochstream's option): the files hold every change with
    its kind in an ``op`` column; summing each row's sign (+I/+U add, -U/-D retract)
    leaves exactly DuckDB's GROUP BY, each row once."""
    import collections

    import pyarrow.parquet as pq

    env = _env(tmp_path)
    out = tmp_path / "changes"
    env.execute_sql(
        "CREATE TABLE changes (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT) WITH "
        f"('connector' = 'filesystem', 'path' = '{out}', 'format' = '{fmt}', "
        "'changelog-mode' = 'all')"
    )
    env.execute_sql(f"INSERT INTO changes {UPDATING}")
    rows: list[dict[str, object]] = []
    for part in sorted(p for p in out.glob("part-*") if not p.name.startswith(".")):
        if fmt == "parquet":
            rows += pq.read_table(part).to_pylist()
        else:
            rows += [json.loads(line) for line in part.read_text().splitlines()]
    assert {r["op"] for r in rows} == {"+I", "-U", "+U"}, "a GROUP BY's updates"
    signs = {"+I": 1, "+U": 1, "-U": -1, "-D": -1}
    net: collections.Counter[tuple[object, ...]] = collections.Counter()
    for r in rows:
        net[(r["bidder"], r["bids"], r["top"], r["auctions"])] += signs[str(r["op"])]
    assert sorted(row for row, n in net.items() if n) == sorted(
        run_duckdb(UPDATING, nexmark_arrow_tables(events=EVENTS))
    )
    assert set(net.values()) <= {0, 1}, "no row retracted more than added"


def test_changelog_mode_option_is_checked(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env.execute_sql(
        "CREATE TABLE files (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT) WITH "
        f"('connector' = 'filesystem', 'path' = '{tmp_path / 'a'}', 'format' = 'parquet');"
        "CREATE TABLE bad (bidder BIGINT, bids BIGINT, top BIGINT, auctions BIGINT) WITH "
        f"('connector' = 'filesystem', 'path' = '{tmp_path / 'b'}', 'format' = 'parquet', "
        "'changelog-mode' = 'upsert');"
        "CREATE TABLE has_op (op STRING, bids BIGINT) WITH ('connector' = 'filesystem', "
        f"'path' = '{tmp_path / 'c'}', 'format' = 'parquet', 'changelog-mode' = 'all')"
    )
    with pytest.raises(es.SqlError, match=r"set 'changelog-mode' = 'all' on this filesystem"):
        env.explain_sql(f"INSERT INTO files {UPDATING}")
    with pytest.raises(es.SqlError, match=r"must be 'insert-only' or 'all', got 'upsert'"):
        env.explain_sql(f"INSERT INTO bad {UPDATING}")
    with pytest.raises(es.SqlError, match="which the table declares already"):
        env.explain_sql("INSERT INTO has_op SELECT 'x', COUNT(*) FROM bid GROUP BY bidder")
