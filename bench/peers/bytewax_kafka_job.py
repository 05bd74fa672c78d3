"""Bytewax peer of the Kafka pipeline (``bench/kafka_pipeline.py``): Kafka -> keyed
running sum -> Kafka with Bytewax's own connector (``bytewax.connectors.kafka``).

Runs inside the ``bytewax-kafka`` virtualenv, one process of a Bytewax cluster
(``--process-id`` of ``--addresses``, what ``python -m bytewax.run -i/-a`` starts), one
worker each. Input values are JSON ``{"k": key, "v": value, "ts": ms}``; every record
updates its key's sum and emits ``{"k", "v": sum, "ts"}`` keyed by ``k``. Snapshots
every ``--epoch`` seconds into the SQLite recovery partitions of ``--recovery-dir``
(made by ``python -m bytewax.recovery`` beforehand). Bytewax's Kafka sink is not
transactional: the pipeline is at-least-once (a restart replays the epoch's outputs).

Without ``--tail`` the source stops at the end of each partition (throughput run);
with it, it waits for more (latency run). ``--set batch_size=N`` sets KafkaSource's
``batch_size`` (messages per poll, default 1000); ``--set consumer.X=V`` and
``--set producer.X=V`` go to librdkafka.

Example::

    /tmp/bench-venvs/bytewax-kafka/bin/python bench/peers/bytewax_kafka_job.py \\
        127.0.0.1:9092 in out --process-id 0 --addresses "127.0.0.1:2101;127.0.0.1:2102" \\
        --recovery-dir /tmp/bw-db --set batch_size=10000
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax._bytewax import cluster_main
from bytewax.connectors.kafka import KafkaSinkMessage, KafkaSourceMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig


def _key_value(msg: KafkaSourceMessage[Any, Any]) -> tuple[str, dict[str, int]]:
    event = json.loads(msg.value)
    return str(event["k"]), event


def _running_sum(state: int | None, event: dict[str, int]) -> tuple[int, dict[str, int]]:
    total = (state or 0) + event["v"]
    return total, {"k": event["k"], "v": total, "ts": event["ts"]}


def _to_message(item: tuple[str, dict[str, int]]) -> KafkaSinkMessage[bytes, bytes]:
    key, out = item
    return KafkaSinkMessage(key.encode(), json.dumps(out, separators=(",", ":")).encode())


def build(args: argparse.Namespace, settings: dict[str, str]) -> Dataflow:
    consumer = {k[len("consumer.") :]: v for k, v in settings.items() if k.startswith("consumer.")}
    producer = {k[len("producer.") :]: v for k, v in settings.items() if k.startswith("producer.")}
    flow = Dataflow("kafka_running_sum")
    source = kop.input(
        "in",
        flow,
        brokers=[args.bootstrap],
        topics=[args.input],
        tail=args.tail,
        add_config={"group.id": args.group, **consumer},
        batch_size=int(settings.get("batch_size", "1000")),
    )
    pairs = op.map("parse", source.oks, _key_value)
    sums = op.stateful_map("sum", pairs, _running_sum)
    kop.output(
        "out",
        op.map("serialize", sums, _to_message),
        brokers=[args.bootstrap],
        topic=args.output,
        add_config=producer,
    )
    return flow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bootstrap")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--group", default="bytewax-kafka-bench")
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--addresses", required=True, help="host:port;host:port (one per process)")
    parser.add_argument("--recovery-dir", type=Path, required=True)
    parser.add_argument("--epoch", type=float, default=1.0, help="seconds between snapshots")
    parser.add_argument("--tail", action="store_true", help="keep reading at the end of input")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.set)
    cluster_main(
        build(args, settings),
        args.addresses.split(";"),
        args.process_id,
        epoch_interval=timedelta(seconds=args.epoch),
        recovery_config=RecoveryConfig(str(args.recovery_dir)),
    )


if __name__ == "__main__":
    main()
