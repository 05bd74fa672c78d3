"""A resumable keyed running count into an exactly-once KafkaSink, driven through
``epochstream run --supervise`` by tests/e2e/test_kafka_sink.py.

``epochstream run ... kafka_counting_job.py BOOTSTRAP TOPIC [EVENTS [RATE]]``: counts
``i % 13`` over ``range(EVENTS)`` (default 20,000) throttled to RATE records/s in total
(default 4,000), checkpointing every 0.3 s, into ``TOPIC`` as JSON ``[key, count]``.
Every operator has an explicit uid, so a resumed run continues this one.
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
    bootstrap, topic = sys.argv[1], sys.argv[2]
    events = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 4_000.0
    env = es.Environment(parallelism=2)
    env.enable_checkpointing(0.3)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    sink = es.sinks.KafkaSink(
        bootstrap_servers=bootstrap,
        topic=topic,
        key_fn=first,
        transactional_id_prefix=f"counting-{topic}",
    )
    (
        env.from_sequence(0, events, rate=rate)
        .uid("numbers")
        .map(pair)
        .uid("pairs")
        .key_by(first)
        .reduce(add)
        .uid("counts")
        .sink_to(sink)
        .uid("kafka-out")
    )
    env.execute("kafka-counting")


if __name__ == "__main__":
    main()
