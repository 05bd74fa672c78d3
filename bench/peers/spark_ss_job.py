"""Spark Structured Streaming peer: workloads A and B as streaming SQL aggregations.

Runs in the project's virtualenv (it has pyspark) but in its own process and JVM,
started by ``bench/run.py``. Every micro-batch commits its offsets and state to the
checkpoint location, so micro-batches play the role of checkpoints; the batch size is
chosen so a batch takes roughly the checkpoint interval of the epochstream runs.

- B: the ``rate-micro-batch`` source yields ``value = 0, 1, 2, ...`` (``--rows-per-batch``
  per micro-batch, deterministic, not tied to wall time); the job groups by
  ``value * 7919 % 100000`` and sums ``value % 1000``; the run stops once ``--n`` rows
  were processed.
- A: the text split into files (``--path`` is a directory) read ``--files-per-batch``
  at a time with ``Trigger.AvailableNow``; ``explode(split(value, ' '))``, ``lower``,
  count per word.
- C: workload C's timestamped text the same way; ``withWatermark`` 2 s and a count per
  word and 5 s ``window`` of the timestamp, in ``append`` mode (a window's result once
  the watermark passes it).

A and B write in ``update`` mode to the ``noop`` sink. Expressions run in the JVM
(no Python UDF), as a Spark user would write them. Prints one JSON line.

Example::

    .venv/bin/python bench/peers/spark_ss_job.py B --n 10000000 --rows-per-batch 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from workloads import C_BOUND_MS, C_WINDOW_MS, peer_arguments


def session(parallelism: int, app_name: str = "bench-structured-streaming") -> Any:
    """A local SparkSession for the Structured Streaming peers (loopback, no UI)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(f"local[{parallelism}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        # One shuffle partition per core: the default 200 would dominate on 2 cores.
        .config("spark.sql.shuffle.partitions", str(parallelism))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _run_b(spark: Any, args: argparse.Namespace, ckdir: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", args.rows_per_batch)
        .option("numPartitions", args.parallelism)
        .load()
    )
    agg = (
        df.select((F.col("value") * 7919 % 100000).alias("k"), (F.col("value") % 1000).alias("v"))
        .groupBy("k")
        .agg(F.sum("v").alias("total"))
    )
    start = time.perf_counter()
    query = (
        agg.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", ckdir)
        .trigger(processingTime="0 seconds")
        .start()
    )
    rows = 0
    batches: list[dict[str, Any]] = []
    while rows < args.n:
        if query.exception() is not None:
            raise SystemExit(f"structured streaming query failed: {query.exception()}")
        progress = query.recentProgress
        if progress:
            seen = {p["batchId"]: p for p in progress}
            for p in batches:
                seen.setdefault(p["batchId"], p)
            batches = [seen[b] for b in sorted(seen)]
            rows = sum(p["numInputRows"] for p in batches)
        time.sleep(0.02)
    wall = time.perf_counter() - start
    query.stop()
    return _result(rows, wall, batches)


def _run_a(spark: Any, args: argparse.Namespace, ckdir: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    lines = (
        spark.readStream.format("text")
        .option("maxFilesPerTrigger", args.files_per_batch)
        .load(args.path)
    )
    counts = (
        lines.select(F.explode(F.split(F.col("value"), " ")).alias("w"))
        .where(F.col("w") != "")
        .select(F.lower(F.col("w")).alias("w"))
        .groupBy("w")
        .count()
    )
    start = time.perf_counter()
    query = (
        counts.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", ckdir)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - start
    batches = sorted(query.recentProgress, key=lambda p: p["batchId"])
    result = _result(args.n, wall, batches)
    result["input_lines"] = sum(p["numInputRows"] for p in batches)
    return result


def _run_c(spark: Any, args: argparse.Namespace, ckdir: str) -> dict[str, Any]:
    """Workload C: words per 5 s tumbling window of event time, watermark 2 s behind."""
    from pyspark.sql import functions as F

    lines = (
        spark.readStream.format("text")
        .option("maxFilesPerTrigger", args.files_per_batch)
        .load(args.path)
    )
    parts = F.split(F.col("value"), " ", 2)
    words = lines.select(
        F.timestamp_millis(parts.getItem(0).cast("long")).alias("ts"),
        F.explode(F.split(parts.getItem(1), " ")).alias("w"),
    ).where(F.col("w") != "")
    counts = (
        words.withWatermark("ts", f"{C_BOUND_MS} milliseconds")
        .groupBy(F.window("ts", f"{C_WINDOW_MS} milliseconds"), F.lower(F.col("w")).alias("w"))
        .count()
    )
    start = time.perf_counter()
    query = (
        counts.writeStream.outputMode("append")
        .format("noop")
        .option("checkpointLocation", ckdir)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - start
    batches = sorted(query.recentProgress, key=lambda p: p["batchId"])
    result = _result(args.n, wall, batches)
    result["input_lines"] = sum(p["numInputRows"] for p in batches)
    return result


def _result(events: int, wall: float, batches: list[dict[str, Any]]) -> dict[str, Any]:
    durations = [p["durationMs"].get("triggerExecution", 0) / 1000.0 for p in batches]
    return {
        "events": events,
        "seconds": wall,
        "batches": len(batches),
        "batch_mean_s": sum(durations) / len(durations) if durations else 0.0,
        "batch_max_s": max(durations, default=0.0),
        "busy_seconds": sum(durations),
    }


def main() -> None:
    parser = peer_arguments("spark_ss_job peer")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--rows-per-batch", type=int, default=1_000_000)
    parser.add_argument("--files-per-batch", type=int, default=1)
    args = parser.parse_args()
    spark = session(args.parallelism)
    ckdir = tempfile.mkdtemp(prefix="spark-ss-ck-")
    try:
        run = {"A": _run_a, "B": _run_b, "C": _run_c}[args.workload]
        result = run(spark, args, ckdir)
    finally:
        spark.stop()
        shutil.rmtree(ckdir, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
