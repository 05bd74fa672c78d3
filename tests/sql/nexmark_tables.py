"""The Nexmark tables for the SQL tests: the DDL that replaces Flink's ``datagen`` table
and views (three flat tables with Flink's column names and the benchmark's 4 s
watermark), and the same events as Arrow tables for DuckDB.

Example::

    env.execute_sql(nexmark_ddl(events=20_000))
    tables = nexmark_arrow_tables(events=20_000)
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from epochstream.connectors.nexmark import NexmarkConfig, nexmark_columns
from epochstream.core.changelog import OP

QUERIES = Path(__file__).parent / "nexmark"

_COLUMNS = {
    "bid": [
        ("auction", "BIGINT"),
        ("bidder", "BIGINT"),
        ("price", "BIGINT"),
        ("channel", "STRING"),
        ("url", "STRING"),
        ("dateTime", "TIMESTAMP(3)"),
        ("extra", "STRING"),
    ],
    "auction": [
        ("id", "BIGINT"),
        ("itemName", "STRING"),
        ("description", "STRING"),
        ("initialBid", "BIGINT"),
        ("reserve", "BIGINT"),
        ("dateTime", "TIMESTAMP(3)"),
        ("expires", "TIMESTAMP(3)"),
        ("seller", "BIGINT"),
        ("category", "BIGINT"),
        ("extra", "STRING"),
    ],
    "person": [
        ("id", "BIGINT"),
        ("name", "STRING"),
        ("emailAddress", "STRING"),
        ("creditCard", "STRING"),
        ("city", "STRING"),
        ("state", "STRING"),
        ("dateTime", "TIMESTAMP(3)"),
        ("extra", "STRING"),
    ],
}
_SNAKE = {
    "dateTime": "date_time",
    "itemName": "item_name",
    "initialBid": "initial_bid",
    "emailAddress": "email_address",
    "creditCard": "credit_card",
}


def nexmark_ddl(*, events: int, seed: int = 7, rate: int = 10_000) -> str:
    """``CREATE TABLE bid/auction/person`` over the Nexmark connector."""
    out = []
    for kind, columns in _COLUMNS.items():
        body = ",\n  ".join(f"`{n}` {t}" for n, t in columns)
        out.append(
            f"CREATE TABLE {kind} (\n  {body},\n"
            f"  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND\n"
            f") WITH ('connector' = 'nexmark', 'kind' = '{kind}', 'events.num' = '{events}', "
            f"'seed' = '{seed}', 'first-event.rate' = '{rate}');"
        )
    return "\n".join(out)


def nexmark_arrow_tables(*, events: int, seed: int = 7, rate: int = 10_000) -> dict[str, pa.Table]:
    """The events the DDL's tables hold, as Arrow tables under the same column names."""
    config = NexmarkConfig(events=events, seed=seed, events_per_second=float(rate))
    batches, _ = nexmark_columns(config, 0, events)
    out = {}
    for kind, columns in _COLUMNS.items():
        batch = batches[kind]
        arrays = []
        for name, sql_type in columns:
            column = batch.column(_SNAKE.get(name, name))
            if sql_type.startswith("TIMESTAMP"):
                column = pc.cast(column, pa.timestamp("ms"))
            arrays.append(column)
        out[kind] = pa.Table.from_arrays(arrays, names=[n for n, _ in columns])
    return out


def query_statements(name: str, sink_path: str) -> tuple[str, str]:
    """Flink's ``qN.sql`` as its DDL (the result table's ``blackhole`` connector
    replaced by a Parquet directory; views kept; ``CREATE FUNCTION`` of the benchmark's
    Java UDFs left out: a test registers the Python function) and its INSERT, unchanged."""
    text = (QUERIES / f"{name}.sql").read_text()
    text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("--"))
    *ddl, insert = (s.strip() for s in text.split(";") if s.strip())
    kept = []
    for statement in ddl:
        if re.match(r"CREATE\s+FUNCTION", statement, flags=re.I):
            continue
        if re.match(r"CREATE\s+TABLE", statement, flags=re.I):
            statement = re.sub(
                r"WITH\s*\(.*\)\s*$",
                f"WITH ('connector' = 'filesystem', 'path' = '{sink_path}', 'format' = 'parquet')",
                statement,
                flags=re.S,
            )
        kept.append(statement)
    return ";\n".join(kept), insert


def count_char(text: pa.Array, char: pa.Array) -> pa.Array:
    """Nexmark q14's ``count_char(s, c)``: how often ``c`` occurs in ``s`` (vectorized)."""
    return pc.count_substring(text, char[0].as_py())


def read_sink_rows(path: str) -> list[tuple[object, ...]]:
    """The committed rows of a FileSink directory (part files not starting with ``.``)."""
    files = sorted(p for p in Path(path).glob("part-*") if not p.name.startswith("."))
    rows: list[tuple[object, ...]] = []
    for f in files:
        table = pq.read_table(f)
        rows.extend(tuple(r.values()) for r in table.to_pylist())
    return rows


def run_select(
    select: str, columns: list[tuple[str, str]], directory: str, *, events: int, setup: str = ""
) -> list[tuple[object, ...]]:
    """Run ``INSERT INTO result <select>`` over the Nexmark tables (local runner,
    parallelism 2, checkpoints every 0.5 s) into a Parquet directory; its rows."""
    import epochstream as es

    out = f"{directory}/out"
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=f"{directory}/ck")
    env.execute_sql(nexmark_ddl(events=events))
    if setup:
        env.execute_sql(setup)
    body = ", ".join(f"`{n}` {t}" for n, t in columns)
    env.execute_sql(
        f"CREATE TABLE result ({body}) WITH ('connector' = 'filesystem', 'path' = '{out}', "
        "'format' = 'parquet')"
    )
    env.execute_sql(f"INSERT INTO result {select}")
    return read_sink_rows(out)


def changelog_result(path: str) -> list[tuple[object, ...]]:
    """The rows a changelog written by a FileSink (an ``_op`` column) leaves: every
    ``+I``/``+U`` row added, every ``-U``/``-D`` row taken away (a multiset, so the
    order of the files does not matter; files without ``_op`` hold inserts, as an
    append-only result writes them); a retraction of a row not there fails."""
    held: collections.Counter[tuple[object, ...]] = collections.Counter()
    for f in sorted(Path(path).glob("part-*")):
        if f.name.startswith("."):
            continue
        for row in pq.read_table(f).to_pylist():
            kind = row.pop(OP, 0)
            held[tuple(row.values())] += 1 if kind in (0, 2) else -1
    assert all(count >= 0 for count in held.values()), "a retraction of a row never added"
    return [row for row, count in held.items() for _ in range(count)]
