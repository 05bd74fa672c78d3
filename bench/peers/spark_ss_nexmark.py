"""Spark Structured Streaming peer: the Nexmark queries it can express, over the files.

Runs on the project's interpreter (it has pyspark) in its own process and JVM,
started by ``bench/all.py``. Each table is read as a Parquet file stream of the parts
``nexmark_files.ensure_parquet_parts`` cut (``maxFilesPerTrigger`` 1: one part per
micro-batch), ``Trigger.AvailableNow``, a checkpoint location (every micro-batch
commits offsets and state there: Spark's checkpoints), ``noop`` sink. Event time is
``timestamp_millis(date_time)`` with the Nexmark watermark of 4 s. JVM expressions
only, no Python UDF. Prints one JSON line (``events``: every event of the files).

What Spark can and cannot express (Spark 4, DataFrame API):

- q0, q1, q2: projections and filters, append mode.
- q3: stream-stream inner join (person, auction), append mode. Without a time bound
  the join keeps all state, as Flink's regular join does.
- q4: **not expressible**. The winning bid is ``max(price)`` per auction of a
  time-range join, then ``avg`` per category: two chained aggregations that are not
  event-time window aggregations. Spark 4 rejects the plan (in update mode: the
  stateful-operator correctness check, "possible 'correctness' issue due to global
  watermark"; complete mode: not supported with a stream-stream join). With that
  check switched off it runs but is wrong: Structured Streaming has no retractions,
  so the average takes every intermediate maximum of an auction, not its final one.
  Only ``applyInPandasWithState`` (a Python UDF with hand-written state) could do it.
- q5: the count per auction and sliding window (10 s / 2 s), then per window (its
  ``window_time``) the maximum count and the auctions that have it: two chained
  window aggregations (Spark 3.4+) instead of Flink's join of the two; ties kept.
- q7: per 10 s tumbling window the highest bid, ``max_by``-style
  (``max(struct(price, ...))``): one row per window; Flink's join returns every bid
  at the maximum price (ties), this returns one of them.
- q8: persons left-semi-joined (Spark 3.2+) with auctions on seller and the same
  10 s tumbling window: the person once per window, as Flink's grouped join.
- q11: ``session_window`` (gap 10 s) count per bidder, append mode.
- q12: processing time: ``current_timestamp()`` is the micro-batch's start time,
  so every record of a micro-batch falls in one window; count per bidder and 10 s
  window of it, update mode (no watermark on processing time).

Recovery (``--probe DIR --checkpoint-dir CK``, driven by ``bench/peer_recovery.py``'s
``kill_and_restart``): the same query with its checkpoint location kept in ``CK``,
each micro-batch's input rows (every table's) written to the probe as processed
evenly over the batch; a restarted process (``--attempt 1``) resumes from ``CK`` and
records the last batch committed before the kill and its own first batch.

Example::

    .venv/bin/python bench/peers/spark_ss_nexmark.py --path /tmp/nexmark --query q3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nexmark_files import ensure_parquet_parts, event_count
from rate_probe import RateProbe
from spark_ss_job import committed_batches, probe_progress, session

WATERMARK = "4 seconds"
NOT_EXPRESSIBLE = {
    "q4": "two chained non-window aggregations (max per auction, then avg per category): "
    "Spark rejects the plan, and without retractions the average would be wrong anyway",
}


class Tables:
    """The three tables as streaming DataFrames with ``ts`` (event time) and a watermark."""

    def __init__(self, spark: Any, parts: dict[str, str]) -> None:
        self.spark = spark
        self.parts = parts

    def _read(self, table: str) -> Any:
        from pyspark.sql import functions as F

        path = self.parts[table]
        schema = self.spark.read.parquet(path).schema
        df = (
            self.spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(path)
            .withColumn("ts", F.timestamp_millis(F.col("date_time")))
        )
        return df.withWatermark("ts", WATERMARK)

    def bid(self) -> Any:
        return self._read("bid")

    def person(self) -> Any:
        return self._read("person")

    def auction(self) -> Any:
        return self._read("auction")


def q0(t: Tables) -> tuple[Any, str]:
    return t.bid().select("auction", "bidder", "price", "ts", "extra"), "append"


def q1(t: Tables) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    bids = t.bid()
    price = (F.lit(0.908) * F.col("price")).cast("long").alias("price")
    return bids.select("auction", "bidder", price, "ts", "extra"), "append"


def q2(t: Tables) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    return t.bid().where(F.col("auction") % 123 == 0).select("auction", "price"), "append"


def q3(t: Tables) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    a = (
        t.auction()
        .where(F.col("category") == 10)
        .select(F.col("id").alias("a_id"), F.col("seller"))
    )
    p = (
        t.person()
        .where(F.col("state").isin("OR", "ID", "CA"))
        .select(F.col("id").alias("p_id"), "name", "city", "state")
    )
    joined = a.join(p, F.col("seller") == F.col("p_id"), "inner")
    return joined.select("name", "city", "state", "a_id"), "append"


def q5(t: Tables) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    counts = (
        t.bid()
        .groupBy(F.window("ts", "10 seconds", "2 seconds").alias("w"), "auction")
        .agg(F.count("*").alias("num"))
        .select(F.window_time("w").alias("wt"), "auction", "num")
    )
    per_window = counts.groupBy(F.window("wt", "2 seconds").alias("w2")).agg(
        F.max("num").alias("maxn"),
        F.collect_list(F.struct("auction", "num")).alias("all"),
    )
    hot = per_window.select(
        "w2", "maxn", F.explode(F.filter("all", lambda x: x["num"] >= F.col("maxn"))).alias("h")
    ).select(F.col("h.auction").alias("auction"), F.col("h.num").alias("num"))
    return hot, "append"


def q7(t: Tables) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    top = (
        t.bid()
        .groupBy(F.window("ts", "10 seconds").alias("w"))
        .agg(F.max(F.struct("price", "auction", "bidder", "ts", "extra")).alias("b"))
    )
    return top.select("b.auction", "b.price", "b.bidder", "b.ts", "b.extra"), "append"


def q8(t: Tables) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    p = t.person().select(
        F.col("id"), "name", F.window("ts", "10 seconds").alias("pw"), F.col("ts").alias("pts")
    )
    a = t.auction().select(
        F.col("seller"), F.window("ts", "10 seconds").alias("aw"), F.col("ts").alias("ats")
    )
    joined = p.join(a, (F.col("id") == F.col("seller")) & (F.col("pw") == F.col("aw")), "left_semi")
    return joined.select("id", "name", F.col("pw.start").alias("starttime")), "append"


def q11(t: Tables) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    sessions = (
        t.bid()
        .groupBy("bidder", F.session_window("ts", "10 seconds").alias("s"))
        .agg(F.count("*").alias("bid_count"))
    )
    return sessions.select(
        "bidder", "bid_count", F.col("s.start").alias("starttime"), F.col("s.end").alias("endtime")
    ), "append"


def q12(t: Tables) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    counts = (
        t.bid()
        .withColumn("p_time", F.current_timestamp())
        .groupBy("bidder", F.window("p_time", "10 seconds").alias("w"))
        .agg(F.count("*").alias("bid_count"))
    )
    return counts.select("bidder", "bid_count", "w.start", "w.end"), "update"


QUERIES: dict[str, Callable[[Tables], tuple[Any, str]]] = {
    "q0": q0,
    "q1": q1,
    "q2": q2,
    "q3": q3,
    "q5": q5,
    "q7": q7,
    "q8": q8,
    "q11": q11,
    "q12": q12,
}


def _recover(df: Any, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """The query with its checkpoint location kept in ``--checkpoint-dir``, each
    micro-batch's input rows written to ``--probe`` until the input is done or the
    process is killed (``spark_ss_job.probe_progress``)."""
    probe = RateProbe(args.probe, attempt=args.attempt)
    committed = committed_batches(args.checkpoint_dir)
    query = _start(df, mode, args.checkpoint_dir)
    batches = probe_progress(query, probe, args, committed)
    query.stop()
    probe.close()
    return {"query": args.query, "batches": batches}


def _start(df: Any, mode: str, ckdir: str) -> Any:
    return (
        df.writeStream.outputMode(mode)
        .format("noop")
        .option("checkpointLocation", ckdir)
        .trigger(availableNow=True)
        .start()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Spark Structured Streaming Nexmark peer")
    parser.add_argument("--path", required=True, help="write_nexmark_files' directory")
    parser.add_argument("--query", required=True)
    parser.add_argument("--parts", type=int, default=8, help="Parquet parts (micro-batches)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--probe", default="", help="recovery run's probe directory")
    parser.add_argument("--attempt", type=int, default=0, help="recovery: 0, then 1 restarted")
    parser.add_argument("--checkpoint-dir", default="", help="recovery: kept checkpoint location")
    parser.add_argument("--seconds", type=float, default=900.0, help="recovery: longest run")
    args = parser.parse_args()
    if args.query in NOT_EXPRESSIBLE:
        raise SystemExit(f"{args.query}: not expressible: {NOT_EXPRESSIBLE[args.query]}")
    if args.query not in QUERIES:
        raise SystemExit(f"unknown query {args.query!r}; choose among {sorted(QUERIES)}")
    if args.probe and not args.checkpoint_dir:
        raise SystemExit("--probe needs --checkpoint-dir (the location a restart resumes from)")
    parts = ensure_parquet_parts(args.path, args.parts)
    events = event_count(args.path)["total"]
    spark = session(args.parallelism, "bench-nexmark-structured-streaming")
    if args.probe:
        try:
            df, mode = QUERIES[args.query](Tables(spark, parts))
            print(json.dumps(_recover(df, mode, args)))
        finally:
            spark.stop()
        return
    ckdir = tempfile.mkdtemp(prefix="spark-ss-nexmark-ck-")
    try:
        df, mode = QUERIES[args.query](Tables(spark, parts))
        start = time.perf_counter()
        query = _start(df, mode, ckdir)
        query.awaitTermination()
        wall = time.perf_counter() - start
        batches = sorted(query.recentProgress, key=lambda p: p["batchId"])
    finally:
        spark.stop()
        shutil.rmtree(ckdir, ignore_errors=True)
    rows = sum(p["numInputRows"] for p in batches)
    print(
        json.dumps(
            {
                "events": events,
                "seconds": wall,
                "query": args.query,
                "batches": len(batches),
                "input_rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
