"""The reader half of the Kafka source: fetches its partitions, decodes per fetch.

A reader holds any number of partition splits (pushed by the enumerator, or restored
from a checkpoint at any parallelism) and one consumer with all of them assigned at
their split offsets. A poll takes one fetch (up to ``max_records`` messages), groups it
by partition, decodes each group in one go and advances each split's ``next_offset``
past its last message: that offset is the position in the next checkpoint. Event time
gets the messages' timestamps (:meth:`poll_splits` returns them), one watermark per
partition.

On checkpoint completion the offsets that checkpoint holds are committed to the
consumer group, for monitoring only: where the job reads comes from its checkpoints.

Example::

    reader = KafkaPartitionReader(decoder, fetcher_factory, dead_letter=None)
    reader.add_splits([KafkaPartitionSplit.of("bids", 0, 0)])
    reader.poll_splits(1000)   # [("bids/0", [{...}, ...], False, [ts, ...])]
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from epochstream.connectors.base import SourceReader
from epochstream.connectors.kafka.client import Fetcher, KafkaClientError
from epochstream.connectors.kafka.decoding import DeadLetter
from epochstream.connectors.kafka.splits import EARLIEST, KafkaPartitionSplit
from epochstream.exceptions import ConfigurationError, SourceDecodeError

__all__ = ["Decoder", "KafkaPartitionReader"]

log = logging.getLogger(__name__)

#: Seconds a poll waits for messages: short, so checkpoint barriers are not delayed.
FETCH_WAIT = 0.05


class Decoder(Protocol):
    """Decodes one partition's messages (``RowDecoder`` or ``ColumnarDecoder``).

    Example: ``records, kept, error = decoder.decode("bids", 0, msgs, None)``
    """

    def decode(
        self, topic: str, partition: int, messages: list[Any], dead_letter: DeadLetter | None
    ) -> tuple[Any, list[Any], SourceDecodeError | None]: ...


class KafkaPartitionReader(SourceReader):
    """Reads the partition splits of one subtask (module docstring).

    ``bounded``: splits end at their stop offsets and the reader is then exhausted.
    ``commit_offsets``: commit completed checkpoints' offsets to the consumer group.

    Example::

        reader.add_splits(splits)
        reader.poll(500)
        states = reader.snapshot(3); reader.notify_checkpoint_complete(3)
    """

    def __init__(
        self,
        decoder: Decoder,
        fetcher: Callable[[], Fetcher],
        dead_letter: DeadLetter | None,
        *,
        bounded: bool,
        columnar: bool,
        commit_offsets: bool = True,
    ) -> None:
        self._decoder = decoder
        self._connect = fetcher
        self._fetcher: Fetcher | None = None
        self._dead_letter = dead_letter
        self._bounded = bounded
        self._columnar = columnar
        self._commit_offsets = commit_offsets
        self._splits: dict[tuple[str, int], KafkaPartitionSplit] = {}
        self._error: SourceDecodeError | None = None
        self._to_commit: dict[int, list[tuple[str, int, int]]] = {}

    def _client(self) -> Fetcher:
        if self._fetcher is None:
            self._fetcher = self._connect()
        return self._fetcher

    def add_splits(self, splits: list[Any]) -> None:
        positions = []
        for split in splits:
            if not isinstance(split, KafkaPartitionSplit):
                raise ConfigurationError(
                    f"KafkaPartitionReader got a {type(split).__qualname__} split, not a KafkaPartitionSplit"
                )
            key = (split.topic, split.partition)
            if key in self._splits:
                raise ConfigurationError(
                    f"KafkaPartitionReader got partition {split.split_id} twice"
                )
            self._splits[key] = split
            if not split.finished:
                positions.append((split.topic, split.partition, split.next_offset))
        if positions:
            self._client().assign(positions)

    def poll(self, max_records: int) -> Any:
        groups = self._poll_groups(max_records, with_timestamps=False)
        if self._columnar:
            import pyarrow as pa

            batches = [records for _, records, _, _ in groups if len(records)]
            if not batches:
                return []
            if len(batches) == 1:
                return batches[0]
            return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
        if len(groups) == 1:
            return groups[0][1]
        return [r for _, records, _, _ in groups for r in records]

    def poll_splits(self, max_records: int) -> list[tuple[Any, Any, bool, Any]]:  # type: ignore[override]
        """``(split_id, records, finished, timestamps)`` per partition of one fetch;
        ``timestamps`` are the messages' timestamps (None in columnar mode: the
        ``timestamp`` column has them)."""
        return self._poll_groups(max_records, with_timestamps=not self._columnar)

    def _poll_groups(
        self, max_records: int, *, with_timestamps: bool
    ) -> list[tuple[Any, Any, bool, Any]]:
        if self._error is not None:
            raise self._error
        active = [s for s in self._splits.values() if not s.finished]
        if not active:
            return []
        messages = self._client().fetch(max_records, FETCH_WAIT)
        if not messages:
            return self._finish_past_markers() if self._bounded else []
        groups: dict[tuple[str, int], list[Any]] = {}
        for m in messages:
            key = (m.topic(), m.partition())
            group = groups.get(key)
            if group is None:
                groups[key] = [m]
            else:
                group.append(m)
        out: list[tuple[Any, Any, bool, Any]] = []
        done: list[tuple[str, int]] = []
        for key, group in groups.items():
            entry = self._read(key, group, with_timestamps)
            if entry is None:
                continue
            out.append(entry)
            if entry[2]:
                done.append(key)
            if self._error is not None:
                break  # what was accepted goes out; the failure comes next poll
        if done:
            self._client().unassign(done)
        return out

    def _read(
        self, key: tuple[str, int], group: list[Any], with_timestamps: bool
    ) -> tuple[Any, Any, bool, Any] | None:
        split = self._splits.get(key)
        if split is None or split.finished:
            return None  # unassigned meanwhile: what was in flight is not ours
        nxt = split.next_offset
        if nxt != EARLIEST and group[0].offset() < nxt:
            group = [m for m in group if m.offset() >= nxt]  # before the restored position
        stop = split.stop_offset
        if stop is not None and group and group[-1].offset() >= stop:
            group = [m for m in group if m.offset() < stop]
        if not group:
            return None
        topic, partition = key
        records, kept, error = self._decoder.decode(topic, partition, group, self._dead_letter)
        if error is not None:
            self._error = error
            new_next = error.offset  # the bad message is read again after a restore
        else:
            new_next = group[-1].offset() + 1
        split = split.at(new_next) if new_next != EARLIEST else split
        self._splits[key] = split
        # Only event time needs them: a plain poll skips a call per message.
        timestamps = [m.timestamp()[1] for m in kept] if with_timestamps else None
        if error is not None and not kept:
            return None
        return split.split_id, records, split.finished, timestamps

    def _finish_past_markers(self) -> list[tuple[Any, Any, bool, Any]]:
        """Bounded splits whose consumer got past the stop offset without a record there.

        The end offset counts control records (a transaction's commit marker is often
        the last offset of a partition), which are never returned: a split would wait
        for them forever. Asked only when a fetch returned nothing.
        """
        waiting = [key for key, split in self._splits.items() if not split.finished]
        if not waiting:
            return []
        positions = self._client().positions(waiting)
        out: list[tuple[Any, Any, bool, Any]] = []
        for key in waiting:
            split = self._splits[key]
            stop = split.stop_offset
            if stop is not None and positions.get(key, -1) >= stop:
                self._splits[key] = split = split.at(stop)
                out.append((split.split_id, [], True, []))
        if out:
            self._client().unassign([key for key in waiting if self._splits[key].finished])
        return out

    @property
    def exhausted(self) -> bool:
        """Bounded: every split reached its stop offset. Unbounded: never."""
        return (
            self._bounded and self._error is None and all(s.finished for s in self._splits.values())
        )

    @property
    def needs_splits(self) -> bool:
        """Never asks: the enumerator pushes partitions as it finds them."""
        return False

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        states = list(self._splits.values())
        self._to_commit[checkpoint_id] = [
            (s.topic, s.partition, s.next_offset) for s in states if s.next_offset != EARLIEST
        ]
        return states

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the offsets of the newest completed checkpoint to the consumer group."""
        done = [cid for cid in self._to_commit if cid <= checkpoint_id]
        if not done or not self._commit_offsets:
            self._to_commit = {cid: o for cid, o in self._to_commit.items() if cid > checkpoint_id}
            return
        offsets = self._to_commit[max(done)]
        for cid in done:
            del self._to_commit[cid]
        try:
            self._client().commit(offsets)
        except KafkaClientError as exc:
            # Monitoring only (the checkpoint has the positions): the next checkpoint retries.
            log.warning(
                "Kafka offsets of checkpoint %d not committed to the group: %s", checkpoint_id, exc
            )

    def close(self) -> None:
        if self._fetcher is not None:
            fetcher, self._fetcher = self._fetcher, None
            fetcher.close()
