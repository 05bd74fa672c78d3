"""Checkpoints under backpressure: aligned vs unaligned vs aligned-with-timeout, and what
unaligned checkpoints cost when nothing is back-pressured.

Part 1, ``backpressure``: the keyed running sum (``bench/epochstream_jobs.py``'s W1 row
job: ``(i * 7919 % 100000, i % 1000)`` summed per key) with a slow sink: a map after
the sum holds each subtask to ``--sink-rate`` records/s, so the job runs at 100 %
backpressure from the first second. Parallelism 2, local runner, a checkpoint every
``--interval`` s (timeout ``--timeout`` s), in each mode in turn: ``aligned``,
``unaligned``, ``timeout`` (unaligned with ``aligned_timeout=--aligned-timeout``).
Per mode: checkpoints completed while the job ran (against the ``wall / interval``
triggers it had time for: a checkpoint still aligning when the next is due delays it,
and one older than ``--timeout`` expires),
their duration and alignment (median and max), and the channel state each kept.

Part 2, ``throughput``: the same job without the slow sink (W1 as it is), checkpoints
every second, aligned and unaligned alternating ``--rounds`` times; the cost is the
ratio of the medians (what the credited output queues and their sender threads take
when barriers have nothing to overtake).

Example::

    .venv/bin/python bench/unaligned_checkpoints.py backpressure --events 600000
    .venv/bin/python bench/unaligned_checkpoints.py backpressure --events 120000 \
        --sink-rate 2000 --timeout 10
    .venv/bin/python bench/unaligned_checkpoints.py throughput --events 4000000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import epochstream as es  # noqa: E402

KEYS = 100_000
SCRATCH = "/tmp/epochstream-bench/unaligned"
MODES = ("aligned", "unaligned", "timeout")


class SlowSink(es.MapFunction):
    """Holds each subtask to ``per_second`` records/s (a sink that cannot keep up)."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self._t0 = 0.0
        self._n = 0

    def open(self, ctx: es.RuntimeContext) -> None:
        self._n = 0

    def map(self, value: Any) -> Any:
        if self._n == 0:
            self._t0 = time.monotonic()
        self._n += 1
        if self._n % 64 == 0:
            ahead = self._n / self.per_second - (time.monotonic() - self._t0)
            if ahead > 0:
                time.sleep(ahead)
        return value


def _to_pair(i: int) -> tuple[int, int]:
    return (i * 7919 % KEYS, i % 1000)


def _key(t: tuple[int, int]) -> int:
    return t[0]


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0], a[1] + b[1])


def _run(mode: str, events: int, args: argparse.Namespace, sink_rate: float | None) -> Any:
    storage = os.path.join(SCRATCH, mode)
    shutil.rmtree(storage, ignore_errors=True)
    env = es.Environment(parallelism=2, runner="local")
    # Expired checkpoints are what part 1 counts, not a reason to fail the job.
    options: dict[str, Any] = {
        "storage": storage,
        "timeout": args.timeout,
        "tolerable_failures": 1_000_000,
    }
    if mode != "aligned":
        options["unaligned"] = True
    if mode == "timeout":
        options["aligned_timeout"] = args.aligned_timeout
    env.enable_checkpointing(args.interval, **options)
    sums = (
        env.from_sequence(0, events)
        .uid("numbers")
        .map(_to_pair)
        .key_by(_key)
        .reduce(_add)
        .uid("sums")
    )
    if sink_rate is not None:
        sums = sums.map(SlowSink(sink_rate))
    sums.sink_to(es.sinks.DiscardSink())
    start = time.perf_counter()
    result = env.execute(f"bench-unaligned-{mode}")
    return result, time.perf_counter() - start


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def backpressure(args: argparse.Namespace) -> None:
    print(
        f"keyed running sum, {args.events:,} events, sink {args.sink_rate:,.0f} records/s per "
        f"subtask, p=2, interval {args.interval} s, aligned timeout {args.aligned_timeout} s"
    )
    print(
        "mode       | wall s | done | triggers | duration s med/max | alignment s med/max "
        "| channel state KB med/max | unaligned"
    )
    for mode in MODES:
        result, wall = _run(mode, args.events, args, args.sink_rate)
        # The final checkpoint (at end of input) is aligned by design; leave it out.
        periodic = [c for c in result.checkpoints if c.kind == "checkpoint"][:-1]
        durations = [c.duration for c in periodic]
        alignments = [c.max_alignment_s for c in periodic]
        channel = [c.channel_state_bytes / 1024 for c in periodic]
        print(
            f"{mode:10} | {wall:6.1f} | {len(periodic):4} | {wall / args.interval:8.0f} | "
            f"{_summary(durations):>18} | {_summary(alignments):>19} | "
            f"{_summary(channel):>24} | {sum(c.unaligned for c in periodic)}"
        )


def throughput(args: argparse.Namespace) -> None:
    rates: dict[str, list[float]] = {"aligned": [], "unaligned": []}
    for round_ in range(args.rounds):
        for mode in ("aligned", "unaligned") if round_ % 2 == 0 else ("unaligned", "aligned"):
            _, wall = _run(mode, args.events, args, None)
            rates[mode].append(args.events / wall)
            print(f"round {round_ + 1} {mode:9}: {args.events / wall:,.0f} events/s")
    aligned, unaligned = statistics.median(rates["aligned"]), statistics.median(rates["unaligned"])
    print(
        f"median aligned {aligned:,.0f} events/s, unaligned {unaligned:,.0f} events/s: "
        f"unaligned/aligned = {unaligned / aligned:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("part", choices=("backpressure", "throughput"))
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--aligned-timeout", type=float, default=0.5)
    parser.add_argument("--sink-rate", type=float, default=20_000.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.part == "backpressure":
        args.events = args.events or 600_000
        backpressure(args)
    else:
        args.events = args.events or 4_000_000
        throughput(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
