"""Per-record cost of epochstream's Kafka sink producer against confluent-kafka's, both
transactional, on a throwaway Tansu broker: why the row path of
``bench/kafka_pipeline.py`` ends where it does (docs/benchmarks.md, Kafka pipeline).

Sends ``--n`` JSON records in one transaction through epochstream's
``KafkaPythonProducer`` and ``RecordEncoder`` (what ``KafkaSink``'s writer does per
record), then the same records through a transactional confluent-kafka ``Producer``;
rounds alternate. Also times what the sink does once per checkpoint per subtask: a new
producer, ``init_transactions``, a one-record transaction and ``close``.

Example::

    PYTHONPATH=src .venv/bin/python bench/kafka_sink_cost.py --n 200000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

from epochstream.connectors.kafka.producer import KafkaPythonProducer
from epochstream.connectors.kafka.sink import RecordEncoder
from kafka_server import KafkaServer

NEW_PRODUCERS = 20


def _key(record: dict[str, int]) -> int:
    return record["k"]


def ours(bootstrap: str, records: list[dict[str, int]], txn_id: str) -> tuple[float, float]:
    """(records/s, CPU us per record) through epochstream's sink producer."""
    encode = RecordEncoder("ours", None, _key, "json").encode
    producer = KafkaPythonProducer({"bootstrap_servers": bootstrap}, txn_id)
    producer.init_transactions()
    producer.begin()
    wall, cpu = time.perf_counter(), time.process_time()
    for record in records:
        topic, key, value = encode(record)
        producer.send(topic, key, value, record)
    producer.flush()
    producer.commit()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    producer.close()
    return len(records) / wall, cpu / len(records) * 1e6


def confluent(bootstrap: str, records: list[dict[str, int]], txn_id: str) -> tuple[float, float]:
    """(records/s, CPU us per record) through a transactional confluent-kafka producer."""
    from confluent_kafka import Producer

    producer: Any = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    wall, cpu = time.perf_counter(), time.process_time()
    for record in records:
        value = json.dumps(record, separators=(",", ":")).encode()
        producer.produce("bare", key=json.dumps(record["k"]).encode(), value=value)
        producer.poll(0)
    producer.flush()
    producer.commit_transaction()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return len(records) / wall, cpu / len(records) * 1e6


def new_producer_ms(bootstrap: str) -> float:
    """Wall ms of one producer's life per transaction, as the sink has it."""
    began = time.perf_counter()
    for i in range(NEW_PRODUCERS):
        producer = KafkaPythonProducer({"bootstrap_servers": bootstrap}, f"fresh-{i}")
        producer.init_transactions()
        producer.begin()
        producer.send("ours", None, b"1", 1)
        producer.flush()
        producer.commit()
        producer.close()
    return (time.perf_counter() - began) / NEW_PRODUCERS * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    records = [{"k": i % 1000, "v": i, "ts": 0} for i in range(args.n)]
    broker = KafkaServer().start()
    try:
        broker.create_topic("ours", 4)
        broker.create_topic("bare", 4)
        for r in range(args.rounds):
            ours_rate, ours_cpu = ours(broker.bootstrap, records, f"ours-{r}")
            bare_rate, bare_cpu = confluent(broker.bootstrap, records, f"bare-{r}")
            print(
                f"round {r}: epochstream sink producer {ours_rate:,.0f} records/s, "
                f"{ours_cpu:.1f} us CPU/record | confluent-kafka {bare_rate:,.0f} records/s, "
                f"{bare_cpu:.1f} us CPU/record | ratio {ours_rate / bare_rate:.2f}",
                flush=True,
            )
        print(
            f"new producer + init + 1-record transaction + close: {new_producer_ms(broker.bootstrap):.0f} ms"
        )
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
