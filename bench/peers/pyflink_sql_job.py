"""PyFlink SQL peer: W1 and the Nexmark queries as Flink SQL over pre-generated files.

Runs inside the PyFlink virtualenv (``/tmp/bench-venvs/pyflink``), started by
``bench/all.py``. No datagen and no Python UDF: the Table API plans the SQL and the
JVM runs it, which is how a Flink SQL user would write these jobs. Streaming mode,
parallelism ``--parallelism``, checkpoints every ``--checkpoint`` seconds (0: off)
into a fresh directory, HashMap state backend, results into the ``blackhole``
connector (its schema derived from the query). Prints one JSON line: ``events`` (W1: inputs; Nexmark: every event of
the files, the way Nexmark rates count), wall ``seconds`` of the INSERT from submit
to finish (planning and job start included, the JVM's start not) and the job's own
``net_seconds``, and the ``--set`` settings it ran with.

``--set KEY=VALUE`` (repeatable) applies a table or job setting after this script's
own: how ``bench/all.py`` runs Flink's Nexmark tuning (``bench/peer_profiles.py``).

- ``W1 --path DIR --n N``: ``DIR`` holds ``0..N-1`` as CSV parts
  (``workloads.ensure_sequence_csv``); ``SELECT k, SUM(v) ... GROUP BY k`` with
  ``k = i * 7919 % 100000``, ``v = i % 1000``: a retracting running sum per key.
- ``nexmark --path DIR --query qN`` (or ``--select SQL``: any query over the tables,
  as ``bench/sql_nexmark.py`` runs epochstream's statements unchanged, after the
  ``--ddl`` statements, e.g. q12's ``CREATE VIEW``): DIR is
  ``write_nexmark_files``' directory; the tables come from its CSV parts
  (``nexmark_files.ensure_csv_parts``; PyFlink has no Parquet format), with
  ``dateTime AS TO_TIMESTAMP_LTZ(date_time, 3)`` (quoted: Flink 2's parser reserves
  the word), the auction's ``expires`` likewise, the other columns under the names of
  Flink's Nexmark DDL (``itemName``, ``emailAddress`` ...), and the Nexmark watermark
  ``dateTime - 4 s``. The queries are those of Flink's nexmark
  benchmark (github.com/nexmark/nexmark, ``nexmark-flink/src/main/resources/queries``),
  q1 with the spec's ``CAST(0.908 * price AS BIGINT)``, q11 with the session-window
  TVF (Flink 1.19+) in place of the deprecated ``GROUP BY SESSION(...)``.

Recovery (either workload, ``--probe DIR --checkpoint-dir CK``, driven by
``bench/peer_recovery.py``'s ``kill_and_restart``): checkpoints are kept in ``CK``;
the MiniCluster's REST API listens on a free loopback port and the events the sources
have read are written to the probe every poll until the process is killed. A restarted
process (``--attempt 1``) resumes from the newest completed ``chk-N`` and records it
(``restore-1.json``).

Example::

    /tmp/bench-venvs/pyflink/bin/python bench/peers/pyflink_sql_job.py nexmark \\
        --path /tmp/nexmark --query q5 --checkpoint 1
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nexmark_files import ensure_csv_parts, event_count
from rate_probe import RateProbe, write_restore

# How often the MiniCluster refreshes the metrics its REST API serves (recovery runs).
METRICS_INTERVAL_MS = 200

# The CSV columns in file order, under the names of Flink's Nexmark DDL (the CSV format
# maps them by position); the epoch-ms columns get other names, their timestamps are
# computed columns under Flink's (``dateTime``, ``expires``).
_TYPES = {
    "person": "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, "
    "state STRING, date_time BIGINT, extra STRING",
    "auction": "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, "
    "reserve BIGINT, date_time BIGINT, expires_ms BIGINT, seller BIGINT, category BIGINT, "
    "extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
    "date_time BIGINT, extra STRING",
}

# q15-q17's price bands, as in Flink's nexmark SQL: counts of bids, and (q15, q16) of
# distinct bidders and auctions, per band.
_BANDS = (
    ("rank1", "price < 10000"),
    ("rank2", "price >= 10000 AND price < 1000000"),
    ("rank3", "price >= 1000000"),
)
_RANKED_COUNTS = ",\n    ".join(
    ["COUNT(*) AS total_bids"]
    + [f"COUNT(*) FILTER (WHERE {cond}) AS {rank}_bids" for rank, cond in _BANDS]
)


def _ranked_distinct(column: str) -> str:
    return ",\n    ".join(
        [f"COUNT(DISTINCT {column}) AS total_{column}s"]
        + [
            f"COUNT(DISTINCT {column}) FILTER (WHERE {cond}) AS {rank}_{column}s"
            for rank, cond in _BANDS
        ]
    )


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
    "q15": f"""
SELECT
    DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') AS `day`,
    {_RANKED_COUNTS},
    {_ranked_distinct("bidder")},
    {_ranked_distinct("auction")}
FROM bid
GROUP BY DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')""",
    "q16": f"""
SELECT
    channel,
    DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') AS `day`,
    MAX(DATE_FORMAT(`dateTime`, 'HH:mm')) AS `minute`,
    {_RANKED_COUNTS},
    {_ranked_distinct("bidder")},
    {_ranked_distinct("auction")}
FROM bid
GROUP BY channel, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')""",
    "q17": f"""
SELECT
    auction,
    DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') AS `day`,
    {_RANKED_COUNTS},
    MIN(price) AS min_price,
    MAX(price) AS max_price,
    AVG(price) AS avg_price,
    SUM(price) AS sum_price
FROM bid
GROUP BY auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')""",
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def latest_checkpoint(ckdir: str) -> str | None:
    """The newest completed checkpoint under ``ckdir`` (``<job id>/chk-<n>`` holding its
    ``_metadata``; one being written when the process died has none), or None."""
    done = glob.glob(os.path.join(ckdir, "*", "chk-*", "_metadata"))
    if not done:
        return None
    return os.path.dirname(max(done, key=os.path.getmtime))


def _table_env(args: argparse.Namespace, rest_port: int | None) -> tuple[Any, str]:
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    ckdir = args.checkpoint_dir or tempfile.mkdtemp(prefix="pyflink-sql-ck-")
    settings = EnvironmentSettings.new_instance().in_streaming_mode()
    if rest_port is not None:
        # The MiniCluster takes these when it starts: they must be there at creation.
        cluster = Configuration()
        cluster.set_string("rest.bind-address", "127.0.0.1")
        cluster.set_string("rest.address", "127.0.0.1")
        cluster.set_string("rest.bind-port", str(rest_port))
        cluster.set_string("rest.port", str(rest_port))
        cluster.set_string("metrics.fetcher.update-interval", str(METRICS_INTERVAL_MS))
        settings = settings.with_configuration(cluster)
    t_env = TableEnvironment.create(settings.build())
    conf = t_env.get_config()
    conf.set("parallelism.default", str(args.parallelism))
    conf.set("restart-strategy.type", "none")  # a failure ends the run with an error
    conf.set("state.backend.type", "hashmap")
    conf.set("execution.checkpointing.dir", f"file://{ckdir}")
    if args.checkpoint > 0:
        conf.set("execution.checkpointing.interval", f"{int(args.checkpoint * 1000)} ms")
        conf.set("execution.checkpointing.mode", "EXACTLY_ONCE")
    for key, value in args.set:
        conf.set(key, value)
    if args.attempt:
        restore = latest_checkpoint(ckdir)
        if restore is None:
            raise SystemExit(f"attempt {args.attempt}: no completed checkpoint in {ckdir}")
        conf.set("execution.state-recovery.path", f"file://{restore}")
        write_restore(args.probe, args.attempt, {"checkpoint": restore})
    return t_env, ckdir


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.load(r)


def _probe_until_done(result: Any, port: int, probe: RateProbe) -> None:
    """Write the events the job's sources have read to the probe, as increments,
    every poll, until the job ends: the task-level ``numRecordsIn`` of every source
    vertex (a FLIP-27 source counts what it reads there), summed, as epochstream's
    recovery runs count the events their sources hand on."""
    job = str(result.get_job_client().get_job_id())
    vertices = [
        v["id"] for v in _get(port, f"/jobs/{job}")["vertices"] if v["name"].startswith("Source:")
    ]
    seen = 0.0
    while True:
        state = _get(port, f"/jobs/{job}")["state"]
        if state in ("FINISHED", "FAILED", "CANCELED"):
            if state == "FAILED":
                raise SystemExit(f"flink job {job} failed (see the log)")
            return
        read = 0.0
        for vertex in vertices:
            (metric,) = _get(
                port, f"/jobs/{job}/vertices/{vertex}/subtasks/metrics?get=numRecordsIn&agg=sum"
            ) or [{"sum": 0.0}]
            read += metric["sum"]
        if read > seen:
            probe.add(time.time(), int(read - seen))
            seen = read
        time.sleep(METRICS_INTERVAL_MS / 2000.0)


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
    if args.select is None and args.query not in QUERIES:
        raise SystemExit(f"unknown query {args.query!r}; choose among {sorted(QUERIES)}")
    parts = ensure_csv_parts(args.path, args.parts)
    for table, directory in parts.items():
        extra = ", `dateTime` AS TO_TIMESTAMP_LTZ(date_time, 3)"
        if table == "auction":
            extra += ", expires AS TO_TIMESTAMP_LTZ(expires_ms, 3)"
            extra += ", expiresTime AS TO_TIMESTAMP_LTZ(expires_ms, 3)"
        if table == "bid" and args.select is None:
            # This script's q12 reads it from bid; a --select declares it in a --ddl view,
            # as Flink's q12.sql does.
            extra += ", p_time AS PROCTIME()"
        t_env.execute_sql(  # type: ignore[attr-defined]
            f"CREATE TABLE {table} ({_TYPES[table]}{extra}, "
            f"WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND) WITH ({_files(directory)})"
        )
    for statement in args.ddl:
        t_env.execute_sql(statement)  # type: ignore[attr-defined]
    select = args.select if args.select is not None else QUERIES[args.query]
    return select, event_count(args.path)["total"]


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description="PyFlink SQL peer")
    parser.add_argument("workload", choices=["W1", "nexmark"])
    parser.add_argument("--path", required=True)
    parser.add_argument("--n", type=int, default=0, help="W1: events in --path")
    parser.add_argument("--query", default="q0")
    parser.add_argument(
        "--select",
        default=None,
        help="nexmark: this SELECT over bid/auction/person in place of --query's",
    )
    parser.add_argument(
        "--ddl",
        action="append",
        default=[],
        help="nexmark: a statement run after the tables are declared (a query's CREATE VIEW)",
    )
    parser.add_argument("--parts", type=int, default=4, help="nexmark: CSV files per table")
    parser.add_argument("--checkpoint", type=float, default=1.0)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--probe", default="", help="recovery run's probe directory")
    parser.add_argument("--attempt", type=int, default=0, help="recovery: 0, then 1 restarted")
    parser.add_argument("--checkpoint-dir", default="", help="recovery: kept checkpoints")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=_setting,
        metavar="KEY=VALUE",
        help="a table/job setting over this script's own (e.g. Flink's Nexmark tuning)",
    )
    args = parser.parse_args()
    if args.probe and not args.checkpoint_dir:
        raise SystemExit("--probe needs --checkpoint-dir (the checkpoints a restart resumes from)")
    if args.attempt and not args.probe:
        raise SystemExit("--attempt is for recovery runs (--probe)")
    port = _free_port() if args.probe else None
    t_env, ckdir = _table_env(args, port)
    try:
        from pyflink.table import TableDescriptor

        select, events = (_w1 if args.workload == "W1" else _nexmark)(t_env, args)
        # A blackhole sink whose schema Flink derives from the query's own row type.
        blackhole = TableDescriptor.for_connector("blackhole").build()
        start = time.perf_counter()
        result = t_env.sql_query(select).execute_insert(blackhole)
        if port is not None:
            probe = RateProbe(args.probe, attempt=args.attempt)
            _probe_until_done(result, port, probe)
            probe.close()
        result.wait()
        wall = time.perf_counter() - start
        job = result.get_job_client().get_job_execution_result().result()
        net = job.get_net_runtime() / 1000.0
    finally:
        if not args.checkpoint_dir:
            shutil.rmtree(ckdir, ignore_errors=True)
    out = {"events": events, "seconds": wall, "net_seconds": net, "set": dict(args.set)}
    print(json.dumps(out if args.workload == "W1" else {**out, "query": args.query}))


if __name__ == "__main__":
    main()
