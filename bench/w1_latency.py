"""W1's row latency with checkpoints every 1 s and without, in alternating runs.

One SparkSession (``local[2]``): two untimed warm-up jobs, then the latency job's own
rate (:func:`w1_jobs.run_capacity`), then ``--pairs`` pairs of latency runs at
``--rate`` (default: half of that rate), checkpoints on and off alternating which
goes first. Each run prints p50/p99 and, with checkpoints, the asynchronous part of
the keyed tasks' last checkpoint (wall seconds, as the tasks report them). Single runs
on a shared machine spread widely; the pairs are what to compare.

``--where`` adds one run with checkpoints that places the tail: every checkpoint's
alignment, synchronous and asynchronous part on the keyed tasks, and how long after
the latest checkpoint trigger the slowest 1 % of the samples reached the sink
(:func:`tail_after_triggers`).

Example::

    .venv/bin/python bench/w1_latency.py --pairs 4
    .venv/bin/python bench/w1_latency.py --rate 280000 --pairs 2 --where
"""

from __future__ import annotations

import argparse
import bisect
import glob
import json
import math
import os
import statistics
import sys
from collections import Counter
from typing import Any

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


def tail_after_triggers(
    samples: list[tuple[float, float]], triggers: list[float], *, bin_s: float = 0.05
) -> dict[float, int]:
    """How many of the slowest 1 % of ``samples`` (``(sink time, latency)``, both in
    seconds) arrived how long after the latest of ``triggers`` (wall seconds), counted
    in bins of ``bin_s`` keyed by each bin's start; samples before the first trigger
    are left out.

    Example: ``tail_after_triggers([(1.02, 0.3)] + [(1.5, 0.001)] * 99, [1.0])`` is
    ``{0.0: 1}``
    """
    if not samples:
        return {}
    ordered = sorted(triggers)
    cut = sorted(lat for _, lat in samples)[int(len(samples) * 0.99)]
    bins: Counter[float] = Counter()
    for t, lat in samples:
        i = bisect.bisect_right(ordered, t) - 1
        if lat >= cut and i >= 0:
            # Float floor division puts 0.5 s into the 0.45 bin (0.05 is stored above 0.05).
            bins[round(math.floor((t - ordered[i]) / bin_s + 1e-9) * bin_s, 6)] += 1
    return dict(sorted(bins.items()))


def _where(spark: Any, rate: float, seconds: float) -> None:
    out = w1_jobs.run_latency("row", rate, seconds, spark=spark, detail=True)
    print(
        f"where the tail is, at {rate:,.0f}/s: p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms"
    )
    for c in out["checkpoints"]:
        keyed = {k: t for k, t in sorted(c.tasks.items()) if k.startswith("sums/")}
        parts = ", ".join(
            f"{k} {t.alignment_s * 1e3:.1f}/{t.sync_s * 1e3:.1f}/{t.async_s * 1e3:.0f}"
            for k, t in keyed.items()
        )
        print(
            f"  checkpoint {c.checkpoint_id}: {c.duration * 1e3:.0f} ms; alignment/sync/async ms: {parts}"
        )
    bins = tail_after_triggers(out["samples"], [c.trigger_time for c in out["checkpoints"]])
    print("  slowest 1 % by time after the latest trigger (ms: samples):")
    print("  " + ", ".join(f"{start * 1e3:.0f}: {n}" for start, n in bins.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--rate", type=float, help="events/s (default: half the job's own rate)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--where", action="store_true", help="place the tail (one more run)")
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
        print(
            f"ckpt {mode}: p99 {sorted(round(v, 1) for v in values)} ms, median {statistics.median(values):.1f}"
        )
    if args.where:
        _where(spark, rate, args.seconds)


if __name__ == "__main__":
    main()
