"""Kafka connector: :class:`KafkaSource` (partitions as splits, exactly-once),
:func:`timestamp` for ``starting_offsets``, and :class:`KafkaSink` (transactions,
exactly-once). The clients (confluent-kafka for the source, kafka-python for the
sink) are imported only when a job connects, so ``import epochstream`` needs neither.

Example::

    es.sources.KafkaSource(bootstrap_servers="127.0.0.1:9092", topics=["bids"],
                           starting_offsets=es.sources.kafka.timestamp(1_700_000_000_000))
"""

from epochstream.connectors.kafka.client import KafkaClientError
from epochstream.connectors.kafka.sink import KafkaSink
from epochstream.connectors.kafka.source import KafkaSource, StartAtTimestamp, timestamp
from epochstream.connectors.kafka.splits import EARLIEST, KafkaPartitionSplit

__all__ = [
    "EARLIEST",
    "KafkaClientError",
    "KafkaPartitionSplit",
    "KafkaSink",
    "KafkaSource",
    "StartAtTimestamp",
    "timestamp",
]
