"""A resumable keyed running count, driven through ``epochstream run`` by the CLI tests.

``epochstream run [--checkpoint-dir D] ... counting_job.py OUT [EVENTS [RATE]]``: counts
``i % 13`` over ``range(EVENTS)`` (default 60,000) throttled to RATE records/s in total
(default 6,000), checkpointing every 0.3 s, into an exactly-once FileSink at OUT. Every
operator has an explicit uid, so any run can resume any other.
"""

from __future__ import annotations

import sys

import epochstream as es

KEYS = 13


def pair(i: int) -> tuple[int, int]:
    return (i % KEYS, 1)


def first(t: tuple[int, int]) -> int:
    return t[0]


def add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0], a[1] + b[1])


def main() -> None:
    out = sys.argv[1]
    events = int(sys.argv[2]) if len(sys.argv) > 2 else 60_000
    rate = float(sys.argv[3]) if len(sys.argv) > 3 else 6_000.0
    env = es.Environment(parallelism=2)
    env.enable_checkpointing(0.3)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    (
        env.from_sequence(0, events, rate=rate)
        .uid("numbers")
        .map(pair)
        .uid("pairs")
        .key_by(first)
        .reduce(add)
        .uid("counts")
        .sink_to(es.sinks.FileSink(out))
        .uid("files")
    )
    env.execute("counting")


if __name__ == "__main__":
    main()
