"""Kafka splits: one per topic partition; the state is the next offset to read.

``next_offset`` is a real offset, or :data:`EARLIEST` (the partition's log start,
resolved by the reader when it first fetches: a split checkpointed before its first
record says "from the start" again). ``stop_offset`` (bounded reading) is the
partition's end offset seen when the job started; reading stops before it.

Example::

    KafkaPartitionSplit.of("bids", 3, next_offset=42)   # split_id "bids/3"
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EARLIEST", "KafkaPartitionSplit", "StartAtTimestamp"]

#: ``next_offset`` of a partition read from its log start (librdkafka's OFFSET_BEGINNING).
EARLIEST = -2


@dataclass(frozen=True)
class KafkaPartitionSplit:
    """Partition ``partition`` of ``topic``, read on from ``next_offset`` (to ``stop_offset``).

    Example::

        KafkaPartitionSplit("bids/0", "bids", 0, next_offset=EARLIEST, stop_offset=None)
    """

    split_id: str
    topic: str
    partition: int
    next_offset: int
    stop_offset: int | None = None

    @staticmethod
    def of(
        topic: str, partition: int, next_offset: int = EARLIEST, stop_offset: int | None = None
    ) -> KafkaPartitionSplit:
        """A split with the canonical id ``"<topic>/<partition>"``."""
        return KafkaPartitionSplit(
            f"{topic}/{partition}", topic, partition, next_offset, stop_offset
        )

    @property
    def finished(self) -> bool:
        """A bounded split read up to its stop offset (an empty one from the start)."""
        stop = self.stop_offset
        if stop is None:
            return False
        return self.next_offset >= stop or (self.next_offset == EARLIEST and stop == 0)

    def at(self, next_offset: int) -> KafkaPartitionSplit:
        """This split moved on to ``next_offset``."""
        return KafkaPartitionSplit(
            self.split_id, self.topic, self.partition, next_offset, self.stop_offset
        )


@dataclass(frozen=True)
class StartAtTimestamp:
    """``starting_offsets``: each partition's first record at or after ``ms`` (epoch ms).

    Example: ``KafkaSource(..., starting_offsets=StartAtTimestamp(1_700_000_000_000))``
    """

    ms: int
