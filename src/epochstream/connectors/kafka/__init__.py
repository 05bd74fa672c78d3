"""Kafka connector: :class:`KafkaSource` (partitions as splits, exactly-once) and
:func:`timestamp` for ``starting_offsets``. The client (confluent-kafka) is imported
only when a job connects, so ``import epochstream`` does not need it.

Example::

    es.sources.KafkaSource(bootstrap_servers="127.0.0.1:9092", topics=["bids"],
                           starting_offsets=es.sources.kafka.timestamp(1_700_000_000_000))
"""

from epochstream.connectors.kafka.client import KafkaClientError
from epochstream.connectors.kafka.source import KafkaSource, StartAtTimestamp, timestamp
from epochstream.connectors.kafka.splits import EARLIEST, KafkaPartitionSplit

__all__ = ["EARLIEST", "KafkaClientError", "KafkaPartitionSplit", "KafkaSource", "StartAtTimestamp", "timestamp"]
