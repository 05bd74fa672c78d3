"""A job's fixed cost: the wall time of tiny columnar jobs in one warm SparkSession.

Each run starts its own ``local[2]`` session, with Spark's Python workers forked from
``epochstream.deploy.daemon`` (``--daemon epochstream``, what ``create_session`` sets)
or from pyspark's own daemon (``--daemon pyspark``: every slot imports epochstream,
NumPy and pyarrow itself), runs ``--warmup`` untimed jobs of ``--events`` events, then
``--jobs`` timed ones, and prints one JSON line: the median, the minimum and every
job's seconds. ``--pairs N`` runs both variants N times, alternating, each in a fresh
process (a session's daemon lives as long as the session).

Example::

    .venv/bin/python bench/job_start.py --pairs 2
"""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import argparse
import json
import statistics
import subprocess
import sys
import time

DAEMONS = {"epochstream": "epochstream.deploy.daemon", "pyspark": "pyspark.daemon"}


def run_variant(daemon: str, *, events: int, warmup: int, jobs: int) -> dict[str, object]:
    """Time ``jobs`` tiny jobs in a session whose workers fork from ``daemon``."""
    from pyspark.sql import SparkSession

    import epochstream as es

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "false")
        .config("spark.python.daemon.module", DAEMONS[daemon])
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def job() -> float:
        env = es.Environment(parallelism=2, spark=spark)
        env.from_sequence(0, events, batch_size=65_536).map_batches(lambda b: b).sink_to(
            es.sinks.DiscardSink()
        )
        start = time.perf_counter()
        env.execute("job-start")
        return time.perf_counter() - start

    try:
        for _ in range(warmup):
            job()
        times = [job() for _ in range(jobs)]
    finally:
        spark.stop()
    return {
        "daemon": daemon,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "seconds": [round(t, 3) for t in times],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemon", choices=sorted(DAEMONS), help="one variant, in this process")
    parser.add_argument("--pairs", type=int, default=2, help="both variants, alternating")
    parser.add_argument("--events", type=int, default=1_000)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=8)
    args = parser.parse_args()
    sizes = {"events": args.events, "warmup": args.warmup, "jobs": args.jobs}
    if args.daemon:
        print(json.dumps(run_variant(args.daemon, **sizes)), flush=True)
        return
    for _ in range(args.pairs):
        for daemon in ("pyspark", "epochstream"):
            argv = [sys.executable, __file__, "--daemon", daemon]
            argv += [f"--{k}={v}" for k, v in sizes.items()]
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            print([ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1], flush=True)


if __name__ == "__main__":
    main()
