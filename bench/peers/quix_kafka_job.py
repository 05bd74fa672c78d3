"""Quix Streams peer of the Kafka pipeline (``bench/kafka_pipeline.py``): Kafka ->
keyed running sum -> Kafka, one ``quixstreams.Application`` process (the driver starts
one per unit of parallelism, all in one consumer group: Quix scales by processes).

Runs inside the ``quixstreams`` virtualenv. Input values are JSON ``{"k": key, "v":
value, "ts": ms}`` keyed by ``k``; Quix's state is per message key, so the running sum
is a stateful ``apply`` emitting ``{"k", "v": sum, "ts"}`` to the output topic under
the same key. State lives in RocksDB under ``--state-dir`` with Quix's changelog
topics (its recovery, on by default). ``--guarantee exactly-once`` (the default)
commits a Kafka transaction every ``--commit-interval`` seconds (the checkpoint
interval's counterpart); ``at-least-once`` is Quix's default guarantee.

``--set consumer.X=V`` / ``--set producer.X=V`` go to librdkafka
(``consumer_extra_config`` / ``producer_extra_config``); ``--set commit_every=N``
commits after N messages as well. The application stops on SIGTERM (the driver sends
it once the output is complete), committing what it processed.

Example::

    /tmp/bench-venvs/quixstreams/bin/python bench/peers/quix_kafka_job.py \\
        127.0.0.1:9092 in out --state-dir /tmp/quix-0 --set producer.linger.ms=20
"""

from __future__ import annotations

import argparse
from typing import Any

from quixstreams import Application, State


def _running_sum(event: dict[str, int], state: State) -> dict[str, int]:
    total = state.get("sum", 0) + event["v"]
    state.set("sum", total)
    return {"k": event["k"], "v": total, "ts": event["ts"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bootstrap")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--group", default="quix-kafka-bench")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument(
        "--guarantee", choices=("exactly-once", "at-least-once"), default="exactly-once"
    )
    parser.add_argument("--commit-interval", type=float, default=1.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.set)
    consumer = {k[len("consumer.") :]: v for k, v in settings.items() if k.startswith("consumer.")}
    producer = {k[len("producer.") :]: v for k, v in settings.items() if k.startswith("producer.")}
    extra: dict[str, Any] = {}
    if "commit_every" in settings:
        extra["commit_every"] = int(settings["commit_every"])
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee=args.guarantee,
        commit_interval=args.commit_interval,
        state_dir=args.state_dir,
        consumer_extra_config=consumer,
        producer_extra_config=producer,
        **extra,
    )
    source = app.topic(args.input, value_deserializer="json")
    sink = app.topic(args.output, value_serializer="json")
    sdf = app.dataframe(source)
    sdf = sdf.apply(_running_sum, stateful=True)
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
