"""Nexmark q11 (sessions) and q12 (processing-time windows): the columnar path against
the row path, with checkpoints every 1 s and without, on Spark ``local[P]``.

Each run is ``nexmark_jobs.run_query`` over generated events (``es.sources.nexmark.NexmarkConfig``):
one job per query, path and checkpoint setting, results into a ``DiscardSink``; the
rate counts every event of the config, as in ``bench/all.py``. Runs alternate the
paths, so a noisy neighbour weighs on both; the table shows every run's rate.

Example::

    .venv/bin/python bench/nexmark_windows.py --queries q11,q12 --paths columnar,row --repeat 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", default="q11,q12")
    parser.add_argument("--paths", default="columnar,row")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--checkpoints", default="1.0,off", help="seconds between checkpoints, or off"
    )
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()

    import nexmark_jobs

    import epochstream as es
    from epochstream.deploy.spark import create_session

    spark = create_session(
        f"local[{args.parallelism}]", app_name="epochstream-bench-nexmark-windows"
    )
    config = es.sources.nexmark.NexmarkConfig(events=args.events)
    rates: dict[tuple[str, str, str], list[float]] = {}
    try:
        nexmark_jobs.run_query(
            "q0", es.sources.nexmark.NexmarkConfig(events=1_000), spark=spark, checkpoint=None
        )  # warm-up
        for _ in range(args.repeat):
            for query in args.queries.split(","):
                for checkpoint in args.checkpoints.split(","):
                    for path in args.paths.split(","):
                        interval = None if checkpoint == "off" else float(checkpoint)
                        start = time.perf_counter()
                        run = nexmark_jobs.run_query(
                            query,
                            config,
                            spark=spark,
                            parallelism=args.parallelism,
                            checkpoint=interval,
                            path=path,
                        )
                        rates.setdefault((query, path, checkpoint), []).append(run["rate"])
                        print(
                            f"{query} {path:8} checkpoints {checkpoint:>4}: {run['rate'] / 1000:7.1f} k events/s "
                            f"({time.perf_counter() - start:.1f} s)",
                            flush=True,
                        )
    finally:
        spark.stop()
    print("\n| query | path | checkpoints | runs (k events/s) |\n|---|---|---|---|")
    for (query, path, checkpoint), values in rates.items():
        shown = ", ".join(f"{v / 1000:.0f}" for v in values)
        print(f"| {query} | {path} | {checkpoint} | {shown} |")


if __name__ == "__main__":
    main()
