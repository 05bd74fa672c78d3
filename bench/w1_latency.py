"""W1's row latency with checkpoints every 1 s and without, in alternating runs.

One SparkSession (``local[2]``): two untimed warm-up jobs, then the latency job's own
rate (:func:`w1_jobs.run_capacity`), then ``--pairs`` pairs of latency runs at
``--rate`` (default: half of that rate), checkpoints on and off alternating which
goes first. Each run prints p50/p99 and, with checkpoints, the asynchronous part of
the keyed tasks' last checkpoint (wall seconds, as the tasks report them). Single runs
on a shared machine spread widely; the pairs are what to compare.

Example::

    .venv/bin/python bench/w1_latency.py --pairs 4
    .venv/bin/python bench/w1_latency.py --rate 280000 --pairs 4 --seconds 20
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import w1_jobs  # noqa: E402


def _last_async_s() -> list[float]:
    """The keyed (``sums``) tasks' async seconds in the latency job's last checkpoint."""
    pattern = os.path.join(w1_jobs.SCRATCH, "ck-row-lat", "*", "chk-*", "_metadata")
    found = sorted(glob.glob(pattern))
    if not found:
        return []
    with open(found[-1]) as f:
        tasks = json.load(f)["stats"]["tasks"]
    return [t["async_s"] for name, t in sorted(tasks.items()) if name.startswith("sums/")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--rate", type=float, help="events/s (default: half the job's own rate)")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()

    from epochstream.deploy.spark import create_session

    spark = create_session("local[2]", app_name="w1-latency")
    for _ in range(2):
        w1_jobs.run_throughput("row", 5_000_000, spark=spark)
    rate = args.rate
    if rate is None:
        capacity = w1_jobs.run_capacity("row", 10_000_000, spark=spark)
        print(f"latency job's own rate: {capacity:,.0f} events/s", flush=True)
        rate = capacity / 2
    p99: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(args.pairs):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            checkpoint = 1.0 if mode == "on" else None
            out = w1_jobs.run_latency("row", rate, args.seconds, spark=spark, checkpoint=checkpoint)
            extra = f"  async s {_last_async_s()}" if mode == "on" else ""
            line = f"p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms{extra}"
            print(f"ckpt {mode:3} at {rate:,.0f}/s: {line}", flush=True)
            p99[mode].append(out["p99_ms"])
    for mode, values in p99.items():
        print(f"ckpt {mode}: p99 {sorted(round(v, 1) for v in values)} ms, median {statistics.median(values):.1f}")


if __name__ == "__main__":
    main()
