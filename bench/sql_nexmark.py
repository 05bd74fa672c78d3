"""Nexmark SQL: epochstream's ``execute_sql`` against the same queries written by hand
on the columnar path, and against PyFlink SQL running the same statements.

For each query (q0, q1, q2, q21, q22 and q5's inner HOP count, ``q5w``), in one run:

- **sql**: ``env.execute_sql`` of the query's ``INSERT INTO`` a ``blackhole`` table, the
  ``bid`` table a ``filesystem`` Parquet table (a copy of ``write_nexmark_files``'
  ``bid.parquet`` under Flink's column names, ``dateTime`` a ``TIMESTAMP(3)``, written
  once outside the timed runs) with Nexmark's ``WATERMARK ... - INTERVAL '4' SECOND``;
- **hand**: the same computation as a hand-written columnar job over the original
  ``bid.parquet`` (``bench/nexmark/columnar.py``'s q0 and q2, the rest here: q1 with
  the SQL's DECIMAL product, q21's CASE/REGEXP_EXTRACT, q22's SPLIT_INDEX, q5w a
  sliding-window count), sink ``DiscardSink``;
- **pyflink**: ``bench/peers/pyflink_sql_job.py nexmark --select <the same SELECT>`` in
  the PyFlink venv (``bench/peers/install.py``), reading the same rows as CSV parts
  (the PyFlink wheel has no Parquet format), with Flink's Nexmark benchmark settings
  (``bench/peer_profiles.FLINK_NEXMARK``), its job's net runtime.

Parallelism 2, checkpoints every 1 s (exactly-once), one SparkSession for epochstream's
jobs (an untimed warm-up job first), epochstream's time the wall time of the call that
runs the job (planning included). Events/s count every event of the files (person,
auction and bid), as Nexmark rates do, though the queries read the bids only. Prints a
table with the ratios sql/hand and sql/PyFlink; ``--json`` writes the figures.

Example::

    .venv/bin/python bench/sql_nexmark.py --events 2000000 --queries q0,q5w
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
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

_BID_DDL = """CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
  `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet')"""

_Q21_CASE = """CASE
        WHEN lower(channel) = 'apple' THEN '0'
        WHEN lower(channel) = 'google' THEN '1'
        WHEN lower(channel) = 'facebook' THEN '2'
        WHEN lower(channel) = 'baidu' THEN '3'
        ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)
    END"""

#: name -> (the result table's columns, the SELECT): Flink's Nexmark SQL
#: (tests/sql/nexmark/qN.sql), q5w the inner query of q5.
QUERIES: dict[str, tuple[str, str]] = {
    "q0": (
        "auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra STRING",
        "SELECT auction, bidder, price, `dateTime`, extra FROM bid",
    ),
    "q1": (
        "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), `dateTime` TIMESTAMP(3), extra STRING",
        "SELECT auction, bidder, 0.908 * price as price, `dateTime`, extra FROM bid",
    ),
    "q2": (
        "auction BIGINT, price BIGINT",
        "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    ),
    "q21": (
        "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, channel_id STRING",
        f"SELECT auction, bidder, price, channel, {_Q21_CASE} AS channel_id FROM bid "
        "WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) is not null or "
        "lower(channel) in ('apple', 'google', 'facebook', 'baidu')",
    ),
    "q22": (
        "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, dir1 STRING, dir2 STRING, "
        "dir3 STRING",
        "SELECT auction, bidder, price, channel, SPLIT_INDEX(url, '/', 3) as dir1, "
        "SPLIT_INDEX(url, '/', 4) as dir2, SPLIT_INDEX(url, '/', 5) as dir3 FROM bid",
    ),
    "q5w": (
        "auction BIGINT, num BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
        "SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime "
        "FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, "
        "INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end",
    ),
}

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


def _hand_job(name: str, inputs: Any) -> es.DataStream:
    bids = inputs.of("bid")
    if name in ("q0", "q2"):
        job: es.DataStream = columnar.COLUMNAR_QUERIES[name](inputs)
        return job
    if name == "q1":
        return bids.map_batches(_q1_batch).uid("q1-hand")
    if name == "q21":
        return bids.map_batches(_q21_batch).uid("q21-hand")
    if name == "q22":
        return bids.map_batches(_q22_batch).uid("q22-hand")
    if name == "q5w":
        windows = es.SlidingEventTimeWindows.of(10_000, 2_000)
        counted: es.DataStream = bids.key_by("auction").window(windows).count().uid("q5w-hand")
        return counted
    raise ValueError(f"no hand-written job for {name}")


# ------------------------------------------------------------------ runs


def sql_bid_files(files: str) -> str:
    """``bid.parquet`` under Flink's column names (``dateTime`` a timestamp), once."""
    out = os.path.join(files, "sql-bid")
    target = os.path.join(out, "bid.parquet")
    source = os.path.join(files, "bid.parquet")
    if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(source):
        return out
    os.makedirs(out, exist_ok=True)
    reader = pq.ParquetFile(source)
    schema = pa.schema(
        [
            ("auction", pa.int64()),
            ("bidder", pa.int64()),
            ("price", pa.int64()),
            ("channel", pa.string()),
            ("url", pa.string()),
            ("dateTime", pa.timestamp("ms")),
            ("extra", pa.string()),
        ]
    )
    with pq.ParquetWriter(target + ".tmp", schema) as writer:
        for i in range(reader.num_row_groups):
            group = reader.read_row_group(i)
            columns = [group[c] for c in ("auction", "bidder", "price", "channel", "url")]
            columns += [pc.cast(group["date_time"], pa.timestamp("ms")), group["extra"]]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    os.replace(target + ".tmp", target)
    return out


def _environment(spark: Any, parallelism: int, label: str) -> es.Environment:
    env = es.Environment(parallelism=parallelism, runner="spark", spark=spark)
    storage = os.path.join(SCRATCH, f"ck-sql-{label}")
    shutil.rmtree(storage, ignore_errors=True)  # a leftover would be restored
    env.enable_checkpointing(1.0, storage=storage)
    return env


def run_sql(name: str, files: str, spark: Any, parallelism: int) -> float:
    """Seconds of ``execute_sql`` of query ``name``'s INSERT (the job, planning included)."""
    columns, select = QUERIES[name]
    env = _environment(spark, parallelism, f"{name}-sql")
    env.execute_sql(
        _BID_DDL.format(path=sql_bid_files(files))
        + f";\nCREATE TABLE out_{name} ({columns}) WITH ('connector' = 'blackhole')"
    )
    start = time.perf_counter()
    result = env.execute_sql(f"INSERT INTO out_{name} {select}")
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


def run_pyflink(name: str, files: str, parallelism: int) -> dict[str, Any]:
    """PyFlink SQL of the same SELECT, Flink's Nexmark settings; its JSON line."""
    python = PEERS["pyflink"].ensure()
    script = os.path.join(HERE, "peers", "pyflink_sql_job.py")
    argv = [python, script, "nexmark", "--path", files, "--select", QUERIES[name][1]]
    argv += ["--checkpoint", "1", "--parallelism", str(parallelism), *FLINK_NEXMARK.argv()]
    log_path = os.path.join(DATA_DIR, f"sql-nexmark-pyflink-{name}.log")
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
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--no-pyflink", action="store_true")
    parser.add_argument("--json", default="", help="write the figures here")
    args = parser.parse_args()
    names = [q for q in args.queries.split(",") if q]
    unknown = sorted(set(names) - set(QUERIES))
    if unknown:
        raise SystemExit(f"unknown queries {unknown}; choose among {sorted(QUERIES)}")

    from epochstream.deploy.spark import create_session

    files = nexmark_files(args.events, DATA_DIR)
    sql_bid_files(files)
    total = sum(
        pq.ParquetFile(os.path.join(files, f"{k}.parquet")).metadata.num_rows for k in streams.KINDS
    )
    spark = create_session(f"local[{args.parallelism}]", app_name="epochstream-bench-sql-nexmark")
    rows: list[dict[str, Any]] = []
    try:
        run_sql("q0", files, spark, args.parallelism)  # warm-up, untimed
        for name in names:
            row: dict[str, Any] = {"query": name, "events": total}
            row["sql"] = total / run_sql(name, files, spark, args.parallelism)
            row["hand"] = total / run_hand(name, files, spark, args.parallelism)
            if not args.no_pyflink:
                try:
                    flink = run_pyflink(name, files, args.parallelism)
                    row["pyflink"] = flink["events"] / flink["net_seconds"]
                except (PeerUnavailable, RuntimeError, subprocess.TimeoutExpired) as err:
                    row["pyflink_error"] = str(err)
            rows.append(row)
            print(_line(row), flush=True)
    finally:
        spark.stop()
    print(
        f"\nNexmark SQL, {total:,} events, p={args.parallelism}, checkpoints every 1 s (events/s)"
    )
    print(
        "| query | epochstream SQL | hand-written columnar | PyFlink SQL | SQL / hand | SQL / PyFlink |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(_line(row))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"events": total, "parallelism": args.parallelism, "rows": rows}, f, indent=1)


def _line(row: dict[str, Any]) -> str:
    flink = row.get("pyflink")
    cells = [
        row["query"],
        f"{row['sql'] / 1e6:.2f} M",
        f"{row['hand'] / 1e6:.2f} M",
        f"{flink / 1e6:.2f} M" if flink else row.get("pyflink_error", "-")[:60],
        f"{row['sql'] / row['hand']:.2f}",
        f"{row['sql'] / flink:.1f}x" if flink else "-",
    ]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    main()
