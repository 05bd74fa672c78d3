"""Nexmark SQL: epochstream's ``execute_sql`` against the same queries written by hand
on the columnar path, and against PyFlink SQL running the same statements.

The queries are Flink's Nexmark SQL (``tests/sql/nexmark/qN.sql``, unchanged: their
``blackhole`` result table, views and INSERT) that epochstream's SQL layer plans: q0, q1,
q2, q3, q5, q7, q8, q11 (session windows), q12 (processing-time windows), q14, q20, q21,
q22, q23, ``q5w``, q5's inner HOP count, and the updating queries q4, q9, q15, q16,
q17, q18, q19 (their ``blackhole`` tables take the changelog). For each, in one run:

- **sql**: ``env.execute_sql`` of the query's INSERT, the ``person``, ``auction`` and
  ``bid`` tables ``filesystem`` Parquet tables (copies of ``write_nexmark_files``'
  files under Flink's column names, timestamps ``TIMESTAMP(3)``, written once outside
  the timed runs) with Nexmark's ``WATERMARK ... - INTERVAL '4' SECOND``; q14's
  ``count_char`` (a Java UDF in Flink's benchmark) a vectorized Python UDF;
- **hand**: the same computation as a hand-written columnar job over the original
  files (``bench/nexmark/columnar.py``'s q0, q2, q3, q5, q8, q11, q12; here q1 with the
  SQL's DECIMAL product, q14's filter/CASE/substring count, q20's join of the bids
  with category-10 auctions, q21's CASE/REGEXP_EXTRACT, q22's SPLIT_INDEX, q5w a
  sliding-window count), sink ``DiscardSink``; q7 and q23 have none;
- **pyflink**: ``bench/peers/pyflink_sql_job.py nexmark --select <the same SELECT>``
  (``--ddl`` the query's views) in the PyFlink venv (``bench/peers/install.py``),
  reading the same rows as CSV parts (the PyFlink wheel has no Parquet format), with
  Flink's Nexmark benchmark settings (``bench/peer_profiles.FLINK_NEXMARK``), its job's
  net runtime. q14's ``count_char(extra, 'c')`` is the built-in
  ``CHAR_LENGTH(extra) - CHAR_LENGTH(REPLACE(extra, 'c', ''))`` there (the same count,
  run in the JVM as Flink's Java UDF is; the wheel has no Nexmark UDF jar), and q23's
  ``A.dateTime`` is quoted (Flink 2's parser reserves the word).
  The updating queries run twice more there: those settings (mini-batch, the
  distinct-aggregate split) act on their operators, so PyFlink also runs with Flink's
  defaults, and the ratio takes the faster (peers at their best); no hand-written job.
  epochstream runs them twice as well: with the same mini-batch settings (``SET`` in
  its SQL; it has no distinct-aggregate split) and with its defaults, the better counting.

Parallelism 2, checkpoints every 1 s (exactly-once), one SparkSession for epochstream's
jobs (an untimed warm-up job first), epochstream's time the wall time of the call that
runs the job (planning included); ``--repeat N`` runs each epochstream job N times
(sql and hand alternated) and keeps the best. Events/s count every event of the files (person,
auction and bid), as Nexmark rates do, whichever tables a query reads. Prints a table
with the ratios sql/hand and sql/PyFlink; ``--json`` writes the figures.

Example::

    .venv/bin/python bench/sql_nexmark.py --events 2000000 --queries q0,q5w,q11
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "peers"))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from install import PEERS, PeerUnavailable  # noqa: E402
from nexmark_jobs import SCRATCH, columnar, nexmark_files, streams  # noqa: E402
from peer_profiles import FLINK_NEXMARK  # noqa: E402

import epochstream as es  # noqa: E402

DATA_DIR = "/tmp/epochstream-bench"
PYFLINK_TIMEOUT_S = 900

FLINK_QUERIES = os.path.join(os.path.dirname(HERE), "tests", "sql", "nexmark")

#: The tables' columns under Flink's names: (name, SQL type, the column of
#: ``write_nexmark_files``' Parquet file it copies).
TABLES: dict[str, list[tuple[str, str, str]]] = {
    "person": [
        ("id", "BIGINT", "id"),
        ("name", "STRING", "name"),
        ("emailAddress", "STRING", "email_address"),
        ("creditCard", "STRING", "credit_card"),
        ("city", "STRING", "city"),
        ("state", "STRING", "state"),
        ("dateTime", "TIMESTAMP(3)", "date_time"),
        ("extra", "STRING", "extra"),
    ],
    "auction": [
        ("id", "BIGINT", "id"),
        ("itemName", "STRING", "item_name"),
        ("description", "STRING", "description"),
        ("initialBid", "BIGINT", "initial_bid"),
        ("reserve", "BIGINT", "reserve"),
        ("dateTime", "TIMESTAMP(3)", "date_time"),
        ("expires", "TIMESTAMP(3)", "expires"),
        ("seller", "BIGINT", "seller"),
        ("category", "BIGINT", "category"),
        ("extra", "STRING", "extra"),
    ],
    "bid": [
        ("auction", "BIGINT", "auction"),
        ("bidder", "BIGINT", "bidder"),
        ("price", "BIGINT", "price"),
        ("channel", "STRING", "channel"),
        ("url", "STRING", "url"),
        ("dateTime", "TIMESTAMP(3)", "date_time"),
        ("extra", "STRING", "extra"),
    ],
}


def _table_ddl(kind: str, path: str) -> str:
    columns = ", ".join(f"`{name}` {sql_type}" for name, sql_type, _ in TABLES[kind])
    return (
        f"CREATE TABLE {kind} ({columns}, "
        "WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND) "
        f"WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet')"
    )


@dataclass(frozen=True)
class Query:
    """One query as both engines run it: the result table's DDL (epochstream), views
    (both), the SELECT (both) and, where it differs, PyFlink's SELECT."""

    sink_ddl: str
    views: tuple[str, ...]
    select: str
    pyflink_select: str | None = None


def flink_query(name: str) -> Query:
    """Flink's ``qN.sql``: its CREATE TABLE, CREATE VIEWs and the SELECT of its INSERT
    (``CREATE FUNCTION`` of the benchmark's Java UDF left out: q14 registers its own).

    Example: ``flink_query("q12").views == ("CREATE VIEW B AS ...",)``
    """
    with open(os.path.join(FLINK_QUERIES, f"{name}.sql"), encoding="utf-8") as f:
        text = "\n".join(ln for ln in f.read().splitlines() if not ln.strip().startswith("--"))
    sink, views, select = "", [], ""
    for statement in (st.strip() for st in text.split(";") if st.strip()):
        head = " ".join(statement.split()[:2]).upper()
        if head == "CREATE TABLE":
            sink = statement
        elif head == "CREATE VIEW":
            views.append(statement)
        elif head.startswith("INSERT INTO"):
            select = re.sub(r"^INSERT\s+INTO\s+\S+\s+", "", statement, flags=re.I)
    # Flink 2's parser reserves dateTime: q23's unquoted A.dateTime needs quotes there.
    pyflink = re.sub(r"(?<=\.)dateTime\b", "`dateTime`", select)
    if name == "q14":
        # Flink's count_char is a Java UDF the PyFlink wheel does not ship; the built-in
        # expression counts the same and runs in the JVM as the UDF does.
        pyflink = pyflink.replace(
            "count_char(extra, 'c')", "CHAR_LENGTH(extra) - CHAR_LENGTH(REPLACE(extra, 'c', ''))"
        )
    return Query(sink, tuple(views), select, None if pyflink == select else pyflink)


_Q5W_SELECT = (
    "SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime "
    "FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, "
    "INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end"
)

#: Flink's updating queries: their results change (a regular join's or an unwindowed
#: GROUP BY's or ROW_NUMBER's changelog into the blackhole sink). Flink's Nexmark
#: mini-batch and distinct-split settings act on exactly these operators, so PyFlink
#: runs them twice, with those settings and without.
UPDATING = ("q4", "q9", "q15", "q16", "q17", "q18", "q19")

#: The queries, in the order a run takes them.
QUERY_NAMES = (
    "q0", "q1", "q2", "q21", "q22", "q5w",
    "q3", "q5", "q7", "q8", "q20", "q23", "q14", "q11", "q12", *UPDATING,
)  # fmt: skip


def query(name: str) -> Query:
    """Query ``name`` (one of ``QUERY_NAMES``). Example: ``query("q5w").select``"""
    if name == "q5w":
        sink = (
            "CREATE TABLE nexmark_q5w (auction BIGINT, num BIGINT, starttime TIMESTAMP(3), "
            "endtime TIMESTAMP(3)) WITH ('connector' = 'blackhole')"
        )
        return Query(sink, (), _Q5W_SELECT)
    return flink_query(name)


def count_char(text: pa.Array, char: pa.Array) -> pa.Array:
    """Nexmark q14's ``count_char(s, c)``: how often ``c`` occurs in ``s``, vectorized.

    Example: ``count_char(pa.array(["acc"]), pa.array(["c"])).to_pylist() == [2]``
    """
    return pc.count_substring(text, char[0].as_py())


# ------------------------------------------------------------------ hand-written jobs
# (defined here, in __main__, so that they travel to the slots by value)

_PRICE = pa.decimal128(19, 0)
_FACTOR = pa.scalar(Decimal("0.908"), pa.decimal128(4, 3))


def _q1_batch(b: pa.RecordBatch) -> pa.RecordBatch:
    euros = pc.multiply(_FACTOR, pc.cast(b["price"], _PRICE))
    return pa.record_batch(
        [b["auction"], b["bidder"], euros, b["date_time"], b["extra"], b["_ts"]],
        names=["auction", "bidder", "price", "date_time", "extra", "_ts"],
    )


_CHANNELS = ["apple", "google", "facebook", "baidu"]
_CHANNEL_ID = "(?P<g0>(?P<g1>&|^)channel_id=(?P<g2>[^&]*))"


def _q21_batch(b: pa.RecordBatch) -> pa.RecordBatch:
    lower = pc.utf8_lower(b["channel"])
    extracted = pc.struct_field(pc.extract_regex(b["url"], pattern=_CHANNEL_ID), [2])
    keep = pc.or_kleene(pc.is_valid(extracted), pc.is_in(lower, value_set=pa.array(_CHANNELS)))
    b, lower, extracted = b.filter(keep), lower.filter(keep), extracted.filter(keep)
    conditions = pc.make_struct(
        *(pc.equal(lower, name) for name in _CHANNELS), field_names=["0", "1", "2", "3"]
    )
    ids = pc.case_when(
        conditions, *(pa.repeat(pa.scalar(v), b.num_rows) for v in "0123"), extracted
    )
    return pa.record_batch(
        [b["auction"], b["bidder"], b["price"], b["channel"], ids, b["_ts"]],
        names=["auction", "bidder", "price", "channel", "channel_id", "_ts"],
    )


def _q22_batch(b: pa.RecordBatch) -> pa.RecordBatch:
    parts = pc.split_pattern(b["url"], "/")
    # SPLIT_INDEX is NULL past the last part: a one-wide slice pads with null.
    dirs = [
        pc.list_element(pc.list_slice(parts, i, i + 1, return_fixed_size_list=True), 0)
        for i in (3, 4, 5)
    ]
    return pa.record_batch(
        [b["auction"], b["bidder"], b["price"], b["channel"], *dirs, b["_ts"]],
        names=["auction", "bidder", "price", "channel", "dir1", "dir2", "dir3", "_ts"],
    )


_Q14_LOW = pa.scalar(Decimal(1_000_000), pa.decimal128(23, 3))
_Q14_HIGH = pa.scalar(Decimal(50_000_000), pa.decimal128(23, 3))


def _q14_batch(b: pa.RecordBatch) -> pa.RecordBatch:
    euros = pc.multiply(_FACTOR, pc.cast(b["price"], _PRICE))
    keep = pc.and_(pc.greater(euros, _Q14_LOW), pc.less(euros, _Q14_HIGH))
    b, euros = b.filter(keep), euros.filter(keep)
    hour = pc.hour(pc.cast(b["date_time"], pa.timestamp("ms")))
    day = pc.and_(pc.greater_equal(hour, 8), pc.less_equal(hour, 18))
    night = pc.or_(pc.less_equal(hour, 6), pc.greater_equal(hour, 20))
    kinds = [pa.scalar(k) for k in ("dayTime", "nightTime", "otherTime")]
    kind = pc.case_when(pc.make_struct(day, night, field_names=["d", "n"]), *kinds)
    counts = pc.count_substring(b["extra"], "c")
    return pa.record_batch(
        [b["auction"], b["bidder"], euros, kind, b["date_time"], b["extra"], counts, b["_ts"]],
        names=[
            "auction",
            "bidder",
            "price",
            "bidTimeType",
            "date_time",
            "extra",
            "c_counts",
            "_ts",
        ],
    )


def _q20_auction(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.filter(pc.equal(b["category"], 10))


def _q20_result(b: pa.RecordBatch) -> pa.RecordBatch:
    # Joined columns: the bid's, then the auction's (clashing names suffixed _right).
    columns = ["auction", "bidder", "price", "channel", "url", "date_time", "extra"]
    columns += ["item_name", "description", "initial_bid", "reserve", "date_time_right"]
    columns += ["expires", "seller", "category", "extra_right", "_ts"]
    return b.select(columns)


def _q20(inputs: Any) -> es.DataStream:
    auctions = inputs.of("auction").map_batches(_q20_auction).uid("q20-auctions")
    joined = inputs.of("bid").join(auctions).where("auction").equal_to("id")
    result: es.DataStream = joined.apply(_q20_result).uid("q20-hand")
    return result


#: The queries with a hand-written job: columnar.py's, and those written here.
HAND_WRITTEN = ("q0", "q1", "q2", "q3", "q5", "q8", "q11", "q12", "q14", "q20", "q21", "q22", "q5w")


def _hand_job(name: str, inputs: Any) -> es.DataStream:
    bids = inputs.of("bid")
    if name in ("q0", "q2", "q3", "q5", "q8", "q11", "q12"):
        job: es.DataStream = columnar.COLUMNAR_QUERIES[name](inputs)
        return job
    if name == "q1":
        return bids.map_batches(_q1_batch).uid("q1-hand")
    if name == "q21":
        return bids.map_batches(_q21_batch).uid("q21-hand")
    if name == "q22":
        return bids.map_batches(_q22_batch).uid("q22-hand")
    if name == "q14":
        return bids.map_batches(_q14_batch).uid("q14-hand")
    if name == "q20":
        return _q20(inputs)
    if name == "q5w":
        windows = es.SlidingEventTimeWindows.of(10_000, 2_000)
        counted: es.DataStream = bids.key_by("auction").window(windows).count().uid("q5w-hand")
        return counted
    raise ValueError(f"no hand-written job for {name}")


# ------------------------------------------------------------------ runs


def sql_table_files(files: str) -> dict[str, str]:
    """Each table's Parquet file under Flink's column names (timestamps ``TIMESTAMP(3)``)
    in its own directory, written once; kind -> directory.

    Example: ``sql_table_files("/tmp/epochstream-bench/nexmark-2000000")["bid"]``
    """
    out = {}
    for kind, columns in TABLES.items():
        directory = os.path.join(files, f"sql-{kind}")
        target = os.path.join(directory, f"{kind}.parquet")
        source = os.path.join(files, f"{kind}.parquet")
        out[kind] = directory
        if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(source):
            continue
        os.makedirs(directory, exist_ok=True)
        schema = pa.schema([(name, _arrow_type(sql_type)) for name, sql_type, _ in columns])
        reader = pq.ParquetFile(source)
        with pq.ParquetWriter(target + ".tmp", schema) as writer:
            for i in range(reader.num_row_groups):
                group = reader.read_row_group(i)
                arrays = [
                    pc.cast(group[c], f.type) for (_, _, c), f in zip(columns, schema, strict=True)
                ]
                writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
        os.replace(target + ".tmp", target)
    return out


def _arrow_type(sql_type: str) -> pa.DataType:
    return {"BIGINT": pa.int64(), "STRING": pa.string(), "TIMESTAMP(3)": pa.timestamp("ms")}[
        sql_type
    ]


def _environment(spark: Any, parallelism: int, label: str) -> es.Environment:
    env = es.Environment(parallelism=parallelism, runner="spark", spark=spark)
    storage = os.path.join(SCRATCH, f"ck-sql-{label}")
    shutil.rmtree(storage, ignore_errors=True)  # a leftover would be restored
    env.enable_checkpointing(1.0, storage=storage)
    return env


#: The mini-batch settings of Flink's Nexmark benchmark (FLINK_NEXMARK), which
#: epochstream's SQL takes too (its distinct-aggregate split is a Flink planner rewrite
#: epochstream does not have, so it is left out).
MINI_BATCH = tuple((k, v) for k, v in FLINK_NEXMARK.settings if "mini-batch" in k)


def run_sql(
    name: str, files: str, spark: Any, parallelism: int, *, mini_batch: bool = False
) -> float:
    """Seconds of ``execute_sql`` of query ``name``'s INSERT (the job, planning included),
    with Flink's Nexmark mini-batch settings when ``mini_batch``."""
    q = query(name)
    env = _environment(spark, parallelism, f"{name}-sql")
    for key, value in MINI_BATCH if mini_batch else ():
        env.execute_sql(f"SET '{key}' = '{value}'")
    env.execute_sql(
        ";\n".join(
            [_table_ddl(k, d) for k, d in sql_table_files(files).items()] + [q.sink_ddl, *q.views]
        )
    )
    if name == "q14":
        env.create_temporary_function("count_char", es.sql.udf(result_type="BIGINT")(count_char))
    sink = re.match(r"CREATE\s+TABLE\s+(\S+)", q.sink_ddl, flags=re.I)
    assert sink is not None
    start = time.perf_counter()
    result = env.execute_sql(f"INSERT INTO {sink.group(1)} {q.select}")
    seconds = time.perf_counter() - start
    _check(name, "sql", result)
    return seconds


def run_hand(name: str, files: str, spark: Any, parallelism: int) -> float:
    """Seconds of ``env.execute`` of query ``name``'s hand-written columnar job."""
    env = _environment(spark, parallelism, f"{name}-hand")
    inputs = streams.NexmarkStreams.from_files(env, files, columnar=True)
    _hand_job(name, inputs).sink_to(es.sinks.DiscardSink())
    start = time.perf_counter()
    result = env.execute(f"nexmark-{name}-hand")
    seconds = time.perf_counter() - start
    _check(name, "hand", result)
    return seconds


def _check(name: str, path: str, result: Any) -> None:
    if result.restarts:
        raise RuntimeError(f"{name} ({path}) restarted {result.restarts} times: {result.failures}")


def run_pyflink(name: str, files: str, parallelism: int, tuned: bool = True) -> dict[str, Any]:
    """PyFlink SQL of the same SELECT, with Flink's Nexmark settings (``tuned``) or
    Flink's defaults; its JSON line."""
    python = PEERS["pyflink"].ensure()
    script = os.path.join(HERE, "peers", "pyflink_sql_job.py")
    q = query(name)
    argv = [python, script, "nexmark", "--path", files, "--select", q.pyflink_select or q.select]
    argv += [f"--ddl={view}" for view in q.views]
    argv += ["--checkpoint", "1", "--parallelism", str(parallelism)]
    argv += FLINK_NEXMARK.argv() if tuned else []
    suffix = "" if tuned else "-untuned"
    log_path = os.path.join(DATA_DIR, f"sql-nexmark-pyflink-{name}{suffix}.log")
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=PEERS["pyflink"].environment(),
            timeout=PYFLINK_TIMEOUT_S,
            check=False,
        )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"pyflink {name} exited {done.returncode}; see {log_path}")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--queries", default=",".join(QUERY_NAMES))
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--no-pyflink", action="store_true")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="epochstream runs per query (sql, hand alternated); the best",
    )
    parser.add_argument("--json", default="", help="write the figures here")
    args = parser.parse_args()
    names = [q for q in args.queries.split(",") if q]
    unknown = sorted(set(names) - set(QUERY_NAMES))
    if unknown:
        raise SystemExit(f"unknown queries {unknown}; choose among {', '.join(QUERY_NAMES)}")

    from epochstream.deploy.spark import create_session

    files = nexmark_files(args.events, DATA_DIR)
    sql_table_files(files)
    total = sum(
        pq.ParquetFile(os.path.join(files, f"{k}.parquet")).metadata.num_rows for k in streams.KINDS
    )
    spark = create_session(f"local[{args.parallelism}]", app_name="epochstream-bench-sql-nexmark")
    rows: list[dict[str, Any]] = []
    try:
        run_sql("q0", files, spark, args.parallelism)  # warm-up, untimed
        for name in names:
            row: dict[str, Any] = {"query": name, "events": total}
            # Alternated, best of --repeat: other load on the machine slows single runs,
            # and it slows a run, never speeds it up.
            for _ in range(args.repeat):
                rate = total / run_sql(name, files, spark, args.parallelism)
                row["sql"] = max(rate, row.get("sql", 0.0))
                row["sql_plain"] = max(rate, row.get("sql_plain", 0.0))
                if name in UPDATING:
                    # The same settings PyFlink's tuned run gets; the better one counts.
                    mini = total / run_sql(name, files, spark, args.parallelism, mini_batch=True)
                    row["sql"] = max(mini, row["sql"])
                    row["sql_mini_batch"] = max(mini, row.get("sql_mini_batch", 0.0))
                if name in HAND_WRITTEN:
                    rate = total / run_hand(name, files, spark, args.parallelism)
                    row["hand"] = max(rate, row.get("hand", 0.0))
            if not args.no_pyflink:
                _pyflink_runs(row, name, files, args.parallelism)
            rows.append(row)
            print(_line(row), flush=True)
    finally:
        spark.stop()
    print(
        f"\nNexmark SQL, {total:,} events, p={args.parallelism}, checkpoints every 1 s "
        f"(events/s; epochstream best of {args.repeat})"
    )
    print(
        "| query | epochstream SQL (updating: mini-batch / defaults) | hand-written columnar | "
        "PyFlink SQL (Nexmark settings / defaults) | SQL / hand | SQL's best / PyFlink's best |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(_line(row))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "events": total,
                    "parallelism": args.parallelism,
                    "repeat": args.repeat,
                    "rows": rows,
                },
                f,
                indent=1,
            )


def _pyflink_runs(row: dict[str, Any], name: str, files: str, parallelism: int) -> None:
    """PyFlink's rate(s) into ``row``: ``pyflink`` the better of Flink's Nexmark
    settings and (updating queries only, where they act) Flink's defaults, each run's
    own under ``pyflink_tuned`` / ``pyflink_untuned``, a failure's message under
    ``..._error``."""
    for tuned in (True, False) if name in UPDATING else (True,):
        key = "pyflink_tuned" if tuned else "pyflink_untuned"
        try:
            flink = run_pyflink(name, files, parallelism, tuned=tuned)
            row[key] = flink["events"] / flink["net_seconds"]
        except (PeerUnavailable, RuntimeError, subprocess.TimeoutExpired) as err:
            row[f"{key}_error"] = str(err)
    rates = [row[k] for k in ("pyflink_tuned", "pyflink_untuned") if k in row]
    if rates:
        row["pyflink"] = max(rates)  # peers at their best
    else:
        row["pyflink_error"] = row["pyflink_tuned_error"]


def _line(row: dict[str, Any]) -> str:
    flink = row.get("pyflink")
    sql = f"{row['sql'] / 1e6:.2f} M ({row['events'] / row['sql']:.1f} s)"
    if "sql_mini_batch" in row:
        sql = " / ".join(
            f"{row[k] / 1e6:.2f} M ({row['events'] / row[k]:.1f} s)"
            for k in ("sql_mini_batch", "sql_plain")
        )
    cells = [
        row["query"],
        sql,
        f"{row['hand'] / 1e6:.2f} M" if "hand" in row else "no hand-written job",
        " / ".join(
            _pyflink_cell(row, k)
            for k in ("pyflink_tuned", "pyflink_untuned")
            if k in row or f"{k}_error" in row
        ),
        f"{row['sql'] / row['hand']:.2f}" if "hand" in row else "-",
        f"{row['sql'] / flink:.1f}x" if flink else "-",
    ]
    return "| " + " | ".join(cells) + " |"


def _pyflink_cell(row: dict[str, Any], key: str) -> str:
    if key not in row:
        return str(row.get(f"{key}_error", "-"))[:60]
    return f"{row[key] / 1e6:.2f} M ({row['events'] / row[key]:.1f} s)"


if __name__ == "__main__":
    main()
