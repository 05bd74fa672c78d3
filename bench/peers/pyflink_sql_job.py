"""PyFlink SQL peer: W1 and the Nexmark queries as Flink SQL over pre-generated files.

Runs inside the PyFlink virtualenv (``/tmp/bench-venvs/pyflink``), started by
``bench/all.py``. No datagen and no Python UDF: the Table API plans the SQL and the
JVM runs it, which is how a Flink SQL user would write these jobs. Streaming mode,
parallelism ``--parallelism``, checkpoints every ``--checkpoint`` seconds (0: off)
into a fresh directory, HashMap state backend, results into the ``blackhole``
connector (its schema derived from the query). Prints one JSON line: ``events`` (W1: inputs; Nexmark: every event of
the files, the way Nexmark rates count), wall ``seconds`` of the INSERT from submit
to finish (planning and job start included, the JVM's start not) and the job's own
``net_seconds``.

- ``W1 --path DIR --n N``: ``DIR`` holds ``0..N-1`` as CSV parts
  (``workloads.ensure_sequence_csv``); ``SELECT k, SUM(v) ... GROUP BY k`` with
  ``k = i * 7919 % 100000``, ``v = i % 1000``: a retracting running sum per key.
- ``nexmark --path DIR --query qN``: DIR is ``write_nexmark_files``' directory; the
  tables come from its CSV parts (``nexmark_files.ensure_csv_parts``; PyFlink has no
  Parquet format), with ``dateTime AS TO_TIMESTAMP_LTZ(date_time, 3)`` (quoted:
  Flink 2's parser reserves the word) and the
  Nexmark watermark ``dateTime - 4 s``. The queries are those of Flink's nexmark
  benchmark (github.com/nexmark/nexmark, ``nexmark-flink/src/main/resources/queries``),
  q1 with the spec's ``CAST(0.908 * price AS BIGINT)``, q11 with the session-window
  TVF (Flink 1.19+) in place of the deprecated ``GROUP BY SESSION(...)``.

Example::

    /tmp/bench-venvs/pyflink/bin/python bench/peers/pyflink_sql_job.py nexmark \\
        --path /tmp/nexmark --query q5 --checkpoint 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nexmark_files import ensure_csv_parts, event_count

_TYPES = {
    "person": "id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, "
    "state STRING, date_time BIGINT, extra STRING",
    "auction": "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, "
    "reserve BIGINT, date_time BIGINT, expires BIGINT, seller BIGINT, category BIGINT, "
    "extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
    "date_time BIGINT, extra STRING",
}

QUERIES: dict[str, str] = {
    "q0": "SELECT auction, bidder, price, `dateTime`, extra FROM bid",
    "q1": "SELECT auction, bidder, CAST(0.908 * price AS BIGINT) AS price, `dateTime`, extra "
    "FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    "q3": """
SELECT P.name, P.city, P.state, A.id
FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q4": """
SELECT Q.category, AVG(Q.final)
FROM (
    SELECT MAX(B.price) AS final, A.category
    FROM auction A, bid B
    WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expiresTime
    GROUP BY A.id, A.category
) Q
GROUP BY Q.category""",
    "q5": """
SELECT AuctionBids.auction, AuctionBids.num
FROM (
    SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
    FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
    GROUP BY auction, window_start, window_end
) AS AuctionBids
JOIN (
    SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
    FROM (
        SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
        FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
        GROUP BY auction, window_start, window_end
    ) AS CountBids
    GROUP BY CountBids.starttime, CountBids.endtime
) AS MaxBids
ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
   AND AuctionBids.num >= MaxBids.maxn""",
    "q7": """
SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra
FROM bid B
JOIN (
    SELECT MAX(price) AS maxprice, window_end AS `dateTime`
    FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
    GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.`dateTime` BETWEEN B1.`dateTime` - INTERVAL '10' SECOND AND B1.`dateTime`""",
    "q8": """
SELECT P.id, P.name, P.starttime
FROM (
    SELECT id, name, window_start AS starttime, window_end AS endtime
    FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
    GROUP BY id, name, window_start, window_end
) P
JOIN (
    SELECT seller, window_start AS starttime, window_end AS endtime
    FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
    GROUP BY seller, window_start, window_end
) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
    "q11": """
SELECT bidder, count(*) AS bid_count, window_start AS starttime, window_end AS endtime
FROM TABLE(SESSION(TABLE bid PARTITION BY bidder, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end""",
    "q12": """
SELECT bidder, count(*) AS bid_count, window_start, window_end
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(p_time), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end""",
}


def _table_env(args: argparse.Namespace) -> tuple[object, str]:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    ckdir = tempfile.mkdtemp(prefix="pyflink-sql-ck-")
    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    conf.set("parallelism.default", str(args.parallelism))
    conf.set("restart-strategy.type", "none")  # a failure ends the run with an error
    conf.set("state.backend.type", "hashmap")
    conf.set("execution.checkpointing.dir", f"file://{ckdir}")
    if args.checkpoint > 0:
        conf.set("execution.checkpointing.interval", f"{int(args.checkpoint * 1000)} ms")
        conf.set("execution.checkpointing.mode", "EXACTLY_ONCE")
    return t_env, ckdir


def _files(path: str) -> str:
    return f"'connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'csv'"


def _w1(t_env: object, args: argparse.Namespace) -> tuple[str, int]:
    t_env.execute_sql(f"CREATE TABLE seq (i BIGINT) WITH ({_files(args.path)})")  # type: ignore[attr-defined]
    select = (
        "SELECT k, SUM(v) AS s FROM "
        "(SELECT i * 7919 % 100000 AS k, i % 1000 AS v FROM seq) GROUP BY k"
    )
    return select, args.n


def _nexmark(t_env: object, args: argparse.Namespace) -> tuple[str, int]:
    if args.query not in QUERIES:
        raise SystemExit(f"unknown query {args.query!r}; choose among {sorted(QUERIES)}")
    parts = ensure_csv_parts(args.path, args.parts)
    for table, directory in parts.items():
        extra = ", `dateTime` AS TO_TIMESTAMP_LTZ(date_time, 3)"
        if table == "auction":
            extra += ", expiresTime AS TO_TIMESTAMP_LTZ(expires, 3)"
        if table == "bid":
            extra += ", p_time AS PROCTIME()"
        t_env.execute_sql(  # type: ignore[attr-defined]
            f"CREATE TABLE {table} ({_TYPES[table]}{extra}, "
            f"WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND) WITH ({_files(directory)})"
        )
    return QUERIES[args.query], event_count(args.path)["total"]


def main() -> None:
    parser = argparse.ArgumentParser(description="PyFlink SQL peer")
    parser.add_argument("workload", choices=["W1", "nexmark"])
    parser.add_argument("--path", required=True)
    parser.add_argument("--n", type=int, default=0, help="W1: events in --path")
    parser.add_argument("--query", default="q0")
    parser.add_argument("--parts", type=int, default=4, help="nexmark: CSV files per table")
    parser.add_argument("--checkpoint", type=float, default=1.0)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()
    t_env, ckdir = _table_env(args)
    try:
        from pyflink.table import TableDescriptor

        select, events = (_w1 if args.workload == "W1" else _nexmark)(t_env, args)
        # A blackhole sink whose schema Flink derives from the query's own row type.
        blackhole = TableDescriptor.for_connector("blackhole").build()
        start = time.perf_counter()
        result = t_env.sql_query(select).execute_insert(blackhole)  # type: ignore[attr-defined]
        result.wait()
        wall = time.perf_counter() - start
        job = result.get_job_client().get_job_execution_result().result()
        net = job.get_net_runtime() / 1000.0
    finally:
        shutil.rmtree(ckdir, ignore_errors=True)
    out = {"events": events, "seconds": wall, "net_seconds": net}
    print(json.dumps(out if args.workload == "W1" else {**out, "query": args.query}))


if __name__ == "__main__":
    main()
