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

Latency, B with ``--rate R`` (:func:`_run_b_latency`): after an untimed warm-up job (B
over ``--warmup-batches`` batches of ``--rows-per-batch``, as epochstream's latency
runs come after warm-up jobs in their session: a fresh JVM runs its first batches
slower), the ``rate`` source releases ``R`` rows a second, ``value = 0, 1, 2, ...``,
each with its ``timestamp``: the wall time the source's schedule made it due, its
creation time. The same aggregation, checkpoint location, ``update`` mode and ``noop``
sink as B, and the default trigger (the next micro-batch starts as soon as the
previous one ended and new rows are there): what a Spark user runs for low latency; a
``ProcessingTime`` trigger only adds waiting for the next tick. The source offers
whole seconds of its schedule (its offsets are seconds) once each second has passed,
so while a batch takes under a second the batches are one second of rows each, the
cadence of epochstream's checkpoints. Every row's result is visible once its
micro-batch committed, so a row's latency is the batch's end (trigger start plus
``triggerExecution`` in the query progress: the sink written, state and offsets
committed) minus the row's ``timestamp``. ``observe`` takes each batch's input rows'
count, first ``timestamp`` and ``QUANTILES`` quantiles of their timestamps
(``percentile_approx``) in the JVM; the batch contributes one sample per
``R / QUANTILES`` of its rows, drawn from those quantiles. The run lasts until
``--seconds`` of the schedule were processed after the first batch (which holds every
row due during the query's start-up); batches ending in the first second of output are
left out (warm-up). A row waits 0-1 s in the source before any batch can read it: that
is part of the figure, as for any job on this source; ``offered_p50_ms`` /
``offered_p99_ms`` are the latency from the moment it was offered.

Recovery, B with ``--probe DIR`` (:func:`_run_b_recovery`, driven by
``bench/recovery.py``'s ``kill_and_restart``): B without an end, checkpointing to
``--checkpoint-dir`` (kept, so that the restarted process resumes from it), each
micro-batch's rows written to the probe as processed evenly over the batch's
execution (``rate_probe.spread``), until ``--seconds`` pass or the process is killed.
A restarted process (``--attempt 1``) writes ``restore-1.json``: the last batch
committed before the kill and the first batch it ran.

Example::

    .venv/bin/python bench/peers/spark_ss_job.py B --n 10000000 --rows-per-batch 1000000
    .venv/bin/python bench/peers/spark_ss_job.py B --rate 250000 --seconds 20 --rows-per-batch 500000
    .venv/bin/python bench/peers/spark_ss_job.py B --probe /tmp/probe --checkpoint-dir /tmp/ss-ck
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

# bench/, for report.latency_summary; last, so that it shadows nothing installed.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from latency_samples import batch_end, offered_ms, pick
from rate_probe import RateProbe, spread, write_restore
from report import WARMUP_S, latency_summary, steady
from workloads import C_BOUND_MS, C_WINDOW_MS, peer_arguments

# Quantiles of each micro-batch's creation times taken in the JVM (latency runs).
QUANTILES = 200


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


def _w1_sums(df: Any) -> Any:
    """W1 over a ``value`` column: key ``value * 7919 % 100000``, running sum of
    ``value % 1000`` per key (in the JVM, no Python UDF)."""
    from pyspark.sql import functions as F

    return (
        df.select((F.col("value") * 7919 % 100000).alias("k"), (F.col("value") % 1000).alias("v"))
        .groupBy("k")
        .agg(F.sum("v").alias("total"))
    )


def _start_w1(df: Any, ckdir: str, *, trigger: str | None) -> Any:
    """The W1 streaming query over ``df``, started: update mode into the ``noop`` sink,
    checkpointing to ``ckdir``; ``trigger``: a processing-time interval, or ``None``
    for Spark's default (the next micro-batch as soon as the previous one ends)."""
    writer = _w1_sums(df).writeStream.outputMode("update").format("noop")
    writer = writer.option("checkpointLocation", ckdir)
    if trigger is not None:
        writer = writer.trigger(processingTime=trigger)
    return writer.start()


def _sequence(spark: Any, args: argparse.Namespace) -> Any:
    """``value = 0, 1, 2, ...``, ``--rows-per-batch`` a micro-batch (not tied to wall time)."""
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", args.rows_per_batch)
        .option("numPartitions", args.parallelism)
        .load()
    )


def _run_b(spark: Any, args: argparse.Namespace, ckdir: str) -> dict[str, Any]:
    start = time.perf_counter()
    query = _start_w1(_sequence(spark, args), ckdir, trigger="0 seconds")
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


def _run_b_latency(spark: Any, args: argparse.Namespace, ckdir: str) -> dict[str, Any]:
    """W1 fed by the ``rate`` source at ``--rate`` rows/s for ``--seconds`` of its
    schedule after the first batch; latency p50/p99 (see the module docstring for what
    is measured)."""
    from pyspark.sql import functions as F

    # A fresh JVM runs its first batches slower (class loading, JIT); epochstream's
    # latency runs come after warm-up jobs in their session, these after this one.
    warmup_start = time.perf_counter()
    warmup_rows = args.warmup_batches * args.rows_per_batch
    _run_b(spark, argparse.Namespace(**{**vars(args), "n": warmup_rows}), f"{ckdir}-warmup")
    warmup_s = time.perf_counter() - warmup_start
    rows_per_second = max(1, round(args.rate))
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rows_per_second)
        .option("numPartitions", args.parallelism)
        .load()
    )
    created = F.unix_millis(F.col("timestamp"))
    fractions = [(j + 0.5) / QUANTILES for j in range(QUANTILES)]
    observed = df.observe(
        "created",
        F.count(F.lit(1)).alias("rows"),
        F.min(created).alias("first_ms"),
        F.percentile_approx(created, fractions, 10_000).alias("ms"),
    )
    start = time.perf_counter()
    query = _start_w1(observed, ckdir, trigger=None)
    batches: dict[int, Any] = {}
    want = rows_per_second * args.seconds
    after_first = 0
    # The source's schedule starts with the query, so the first batch holds every row
    # due during the query's start-up: the run's length counts from its end.
    while after_first < want:
        if query.exception() is not None:
            raise SystemExit(f"structured streaming query failed: {query.exception()}")
        for p in query.recentProgress:
            # Progress reports of idle triggers carry no rows and no observed metrics.
            if p["numInputRows"] and "created" in p["observedMetrics"]:
                batches.setdefault(p["batchId"], p)
        after_first = sum(p["numInputRows"] for b, p in batches.items() if b > min(batches))
        # Each poll parses every retained progress report (with its quantiles): rarely,
        # so that the driver takes little CPU from the query it measures.
        time.sleep(0.5)
    wall = time.perf_counter() - start
    query.stop()
    ordered = [batches[b] for b in sorted(batches)]
    origin = min(p["observedMetrics"]["created"]["first_ms"] for p in ordered)
    emitted: list[tuple[float, list[float]]] = []
    offered: list[tuple[float, list[float]]] = []
    for p in ordered:
        end = batch_end(p["timestamp"], p["durationMs"]["triggerExecution"])
        metrics = p["observedMetrics"]["created"]
        picks = pick(metrics["ms"], metrics["rows"], rows_per_second / QUANTILES)
        emitted.append((end, [end - ms / 1000.0 for ms in picks]))
        offered.append((end, [end - offered_ms(ms, origin) / 1000.0 for ms in picks]))
    since_offered = latency_summary(steady(offered, WARMUP_S))
    return {
        **_result(sum(p["numInputRows"] for p in ordered), wall, ordered),
        "latency_rate": rows_per_second,
        "trigger": "default",
        "warmup_job_s": warmup_s,
        **latency_summary(steady(emitted, WARMUP_S)),
        "offered_p50_ms": since_offered["p50_ms"],
        "offered_p99_ms": since_offered["p99_ms"],
        # Per batch: input rows and seconds of triggerExecution (how the run went).
        "batch_rows": [p["numInputRows"] for p in ordered],
        "batch_s": [p["durationMs"]["triggerExecution"] / 1000.0 for p in ordered],
    }


def probe_progress(
    query: Any, probe: RateProbe, args: argparse.Namespace, committed: list[int]
) -> int:
    """Write each micro-batch's input rows to ``probe`` as processed evenly over its
    execution (``rate_probe.spread``) until ``args.seconds`` pass or ``query`` ends;
    the number of batches seen. A restarted process (``args.attempt``) records the last
    batch ``committed`` before it and its first batch (``restore-<attempt>.json``)."""
    seen: set[int] = set()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and query.isActive:
        if query.exception() is not None:
            raise SystemExit(f"structured streaming query failed: {query.exception()}")
        for p in query.recentProgress:
            if p["batchId"] in seen or not p["numInputRows"]:
                continue
            if not seen and args.attempt:
                write_restore(
                    args.probe,
                    args.attempt,
                    {
                        "last_committed_batch": committed[-1] if committed else None,
                        "first_batch": p["batchId"],
                    },
                )
            seen.add(p["batchId"])
            end = batch_end(p["timestamp"], p["durationMs"]["triggerExecution"])
            begin = end - p["durationMs"]["triggerExecution"] / 1000.0
            for at, rows in spread(begin, end, p["numInputRows"]):
                probe.add(at, rows)
        probe.flush()
        # Each poll parses every retained progress report: not more often than this.
        time.sleep(0.25)
    if query.exception() is not None:
        raise SystemExit(f"structured streaming query failed: {query.exception()}")
    return len(seen)


def committed_batches(ckdir: str) -> list[int]:
    """Ids of the micro-batches committed in the checkpoint location ``ckdir``."""
    commits = os.path.join(ckdir, "commits")
    if not os.path.isdir(commits):
        return []
    return sorted(int(name) for name in os.listdir(commits) if name.isdigit())


def _run_b_recovery(spark: Any, args: argparse.Namespace, ckdir: str) -> dict[str, Any]:
    """B without an end, its throughput written to ``--probe`` until killed (or until
    ``--seconds`` passed); see the module docstring."""
    probe = RateProbe(args.probe, attempt=args.attempt)
    committed = committed_batches(ckdir)
    query = _start_w1(_sequence(spark, args), ckdir, trigger="0 seconds")
    batches = probe_progress(query, probe, args, committed)
    query.stop()
    probe.close()
    return {"batches": batches, "seconds": args.seconds}


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
    parser.add_argument("--rate", type=float, default=0.0, help="B: latency run at R rows/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="B: latency run's length")
    parser.add_argument(
        "--warmup-batches", type=int, default=4, help="B latency: batches of the warm-up job"
    )
    parser.add_argument("--probe", default="", help="B: recovery run's probe directory")
    parser.add_argument("--attempt", type=int, default=0, help="recovery: 0, then 1 restarted")
    parser.add_argument("--checkpoint-dir", default="", help="recovery: kept checkpoint location")
    args = parser.parse_args()
    spark = session(args.parallelism)
    if args.probe:
        if args.workload != "B" or not args.checkpoint_dir:
            raise SystemExit("--probe runs workload B and needs --checkpoint-dir")
        try:
            result = _run_b_recovery(spark, args, args.checkpoint_dir)
        finally:
            spark.stop()
        print(json.dumps(result))
        return
    ckdir = tempfile.mkdtemp(prefix="spark-ss-ck-")
    try:
        run = {"A": _run_a, "B": _run_b_latency if args.rate else _run_b, "C": _run_c}[
            args.workload
        ]
        result = run(spark, args, ckdir)
    finally:
        spark.stop()
        shutil.rmtree(ckdir, ignore_errors=True)
        shutil.rmtree(f"{ckdir}-warmup", ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
