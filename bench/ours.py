"""epochstream's part of ``bench/all.py``: W1 on both paths and the Nexmark queries,
each measured by :func:`measure_path` (throughput with checkpoints and without,
latency at half load, recovery after a SIGKILL) in one SparkSession.

Example::

    run_epochstream(results, args)   # args as bench/all.py parses them
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from measure import Results, alternating, measure, median_of, nexmark_files

__all__ = ["measure_path", "run_epochstream"]


def run_epochstream(results: Results, args: argparse.Namespace) -> None:
    """W1 (row, columnar) and the Nexmark queries on epochstream."""
    import epochstream as es
    from epochstream.deploy.spark import create_session

    start = time.perf_counter()
    spark = create_session(f"local[{args.parallelism}]", app_name="epochstream-bench-all")
    results.doc["settings"]["spark_session_start_s"] = time.perf_counter() - start
    try:
        import w1_jobs

        # The first jobs of a session run up to a third slower than later ones, with or
        # without checkpoints (measured: 10 M-event W1 jobs, 1.1-1.2 M events/s for the
        # first two, 1.4-1.8 M after); untimed warm-up jobs take that.
        warm = [
            w1_jobs.run_throughput(
                "row", args.warmup_events, spark=spark, parallelism=args.parallelism
            )["seconds"]
            for _ in range(args.warmup_runs)
        ]
        results.doc["settings"]["warmup_jobs_s"] = warm
        if "W1" in args.workloads:
            for path in w1_jobs.PATHS:
                _w1_path(results, args, spark, path)
        if "nexmark" in args.workloads:
            import nexmark_jobs

            config = es.sources.nexmark.NexmarkConfig(events=args.nexmark_events)
            files = nexmark_files(args) if args.nexmark_source == "files" else None
            long_config = es.sources.nexmark.NexmarkConfig(events=args.nexmark_recovery_events)
            # The columnar path reads millions of events a second: an input that outlasts
            # the kill and the recovery (the run is cancelled once recovered).
            columnar_long_config = es.sources.nexmark.NexmarkConfig(
                events=100 * args.nexmark_recovery_events
            )
            for q in args.queries:
                if q not in nexmark_jobs.QUERY_NAMES:
                    results.add(
                        "rows",
                        {
                            "workload": f"nexmark {q}",
                            "system": f"epochstream row (p={args.parallelism})",
                            "ours": True,
                            "checkpoints": "1 s",
                            "error": "not written (bench/nexmark/queries.py has no such query)",
                        },
                    )
                    continue
                for path in ["row"] + (
                    ["columnar"] if q in nexmark_jobs.columnar.COLUMNAR_QUERIES else []
                ):
                    recovery_config = long_config if path == "row" else columnar_long_config
                    _nexmark_path(results, args, spark, q, path, config, files, recovery_config)
    finally:
        # Peers start their own JVMs; this one would only hold memory meanwhile.
        spark.stop()


def measure_path(
    results: Results,
    args: argparse.Namespace,
    base: dict[str, Any],
    throughput: Callable[[float | None], dict[str, Any]],
    latency: Callable[[float], dict[str, Any]],
    recovery: Callable[[], dict[str, Any]],
) -> None:
    """One workload on one path: ``throughput(checkpoint)`` with checkpoints every 1 s
    and off, ``latency(rate)`` at half the checkpointed rate, ``recovery()``."""
    rate_on = None
    for ck, runs in alternating(throughput, args.repeat).items():
        row = measure(
            results,
            "rows",
            {**base, "checkpoints": "1 s" if ck else "off"},
            lambda runs=runs: median_of(runs),
        )
        if ck and "rate" in row:
            rate_on = row["rate"]
    if not args.no_latency and rate_on is None:
        results.add("latency", {**base, "error": "no checkpointed rate to take half of"})
    elif not args.no_latency and rate_on is not None:
        half = rate_on / 2
        measure(results, "latency", base, lambda: latency(half))
    if not args.no_recovery:
        measure(results, "recovery", base, recovery)


def _nexmark_path(
    results: Results,
    args: argparse.Namespace,
    spark: Any,
    q: str,
    path: str,
    config: Any,
    files: str | None,
    recovery_config: Any,
) -> None:
    """Nexmark query ``q`` on one path (``_measure_path``)."""
    import nexmark_jobs

    p = args.parallelism
    measure_path(
        results,
        args,
        {"workload": f"nexmark {q}", "system": f"epochstream {path} (p={p})", "ours": True},
        lambda ck: nexmark_jobs.run_query(
            q, config, spark=spark, parallelism=p, checkpoint=ck, path=path, files=files
        ),
        lambda rate: nexmark_jobs.run_latency(
            q, rate, args.nexmark_latency_seconds, spark=spark, parallelism=p, path=path
        ),
        lambda: nexmark_jobs.run_recovery(
            q,
            recovery_config,
            spark=spark,
            parallelism=p,
            path=path,
            kill_after=args.kill_after,
            timeout=args.recovery_timeout,
        ),
    )


def _w1_events(args: argparse.Namespace, path: str) -> int:
    """Events of a W1 throughput run. The columnar path reads 10 M events in well under a
    second, so the job's start (slot deployment, a few seconds) would be most of its
    wall time: it runs ``--w1-columnar-events`` (100 M) instead, start included."""
    return args.w1_columnar_events if path == "columnar" else args.w1_events


def _w1_path(results: Results, args: argparse.Namespace, spark: Any, path: str) -> None:
    """W1 on one path (``_measure_path``)."""
    import w1_jobs

    p = args.parallelism
    measure_path(
        results,
        args,
        {"workload": "W1", "system": f"epochstream {path} (p={p})", "ours": True},
        lambda ck: w1_jobs.run_throughput(
            path, _w1_events(args, path), spark=spark, parallelism=p, checkpoint=ck
        ),
        lambda rate: _w1_latency(args, spark, path, rate),
        lambda: w1_jobs.run_recovery(
            path,
            spark=spark,
            parallelism=p,
            kill_after=args.kill_after,
            timeout=args.recovery_timeout,
        ),
    )


def _w1_latency(args: argparse.Namespace, spark: Any, path: str, rate: float) -> dict[str, Any]:
    """W1's latency at ``rate`` (half of W1's checkpointed rate), or at half of the
    latency job's own rate when that is lower: carrying each record's due time makes
    the row job slower, and above half its own rate it would not be at half load."""
    import w1_jobs

    p = args.parallelism
    capacity = w1_jobs.run_capacity(path, _w1_events(args, path), spark=spark, parallelism=p)
    out = w1_jobs.run_latency(
        path, min(rate, capacity / 2), args.latency_seconds, spark=spark, parallelism=p
    )
    return {**out, "latency_job_rate": capacity}
