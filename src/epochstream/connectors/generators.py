"""In-memory bounded sources: a number sequence and a collection.

Both split their input into at most ``parallelism`` contiguous index ranges; a split
state holds the next index, so a restored reader resumes exactly. A
:class:`SequenceSource` can be rate-limited: it releases records by the injected clock
(``ctx.clock``) and never sleeps inside ``poll``; :meth:`SourceReader.next_available`
tells the runtime when the next record is due.

With ``batch_size`` a :class:`SequenceSource` is columnar: each poll returns one
``pyarrow.RecordBatch`` of up to ``batch_size`` numbers in an int64 column ``value``.

Split states hold positions only; settings (the rate) come from the source object of
the job being run, so a job restored from a checkpoint runs at its own rate.

Example::

    source = SequenceSource(0, 1_000, rate=100.0)   # 100 records/s in total
    reader = source.create_reader(SourceContext(0, 1, ManualClock()))
    reader.add_splits(source.create_splits(1))
    reader.poll(50)            # [0]: one record is due at once
    reader.next_available()    # 0.01: when the next one is
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from epochstream.connectors.base import Source, SourceContext, SourceReader
from epochstream.core.clock import Clock
from epochstream.exceptions import ConfigurationError

__all__ = [
    "CollectionReader",
    "CollectionSource",
    "CollectionSplit",
    "SequenceReader",
    "SequenceSource",
    "SequenceSplit",
]

# Tolerance for float error in elapsed * rate, so a record due at exactly t is released at t.
_DUE_EPSILON = 1e-6

#: A rate-limited reader releases its due records a step at a time: at least this
#: long's worth of its rate (one record at the least, a full poll at the most). Released
#: the moment each came due, a fast task loop polled them one or two at a time, so every
#: record paid a whole batch's way through the chain, the partitioner and the channels:
#: W1's source task then held the GIL for 65 % of the time at half load, and any other
#: work in the slot (a snapshot) stalled the records behind it (docs/benchmarks.md,
#: "Row latency at checkpoints, found").
RELEASE_STEP_S = 0.001


@dataclass(frozen=True)
class SequenceSplit:
    """The numbers ``next, next + 1, ..., stop - 1`` (a position, no settings).

    Example::

        SequenceSplit(split_id="seq-0", next=0, stop=500)
    """

    split_id: str
    next: int
    stop: int


@dataclass(frozen=True)
class CollectionSplit:
    """Items ``[position, end)`` of the source's list (the items stay in the source).

    Example::

        CollectionSplit(split_id="col-1", start=5, end=10, position=7)
    """

    split_id: str
    start: int
    end: int
    position: int


def _ranges(n: int, parallelism: int) -> list[tuple[int, int]]:
    """``min(parallelism, n)`` contiguous ranges covering ``0..n-1``, sizes differing by <= 1."""
    if parallelism < 1:
        raise ConfigurationError(f"parallelism must be >= 1, got {parallelism}")
    k = min(parallelism, n)
    return [(n * i // k, n * (i + 1) // k) for i in range(k)]


class SequenceSource(Source):
    """The integers of ``range(start, stop)``, optionally at ``rate`` records/s in total.

    Guarantee: exactly-once (the next number of each split in every checkpoint).

    The rate is divided evenly over the parallel subtasks; each releases its records on
    schedule from its first poll (record k of a subtask is due ``k * parallelism / rate``
    s after it), those due within a millisecond together (:data:`RELEASE_STEP_S`:
    records released one by one each paid a whole batch's overhead downstream).
    With ``batch_size`` the reader returns Arrow record batches (column ``value``,
    int64) of up to ``batch_size`` rows instead of lists of ints.

    Example::

        SequenceSource(0, 10).create_splits(3)   # 3 splits: 0-2, 3-5, 6-9
        SequenceSource(0, 10_000_000, batch_size=65_536)   # columnar
    """

    bounded = True
    replayable = True

    def __init__(
        self, start: int, stop: int, *, rate: float | None = None, batch_size: int | None = None
    ) -> None:
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise ConfigurationError(f"SequenceSource rate must be a positive number, got {rate}")
        if batch_size is not None and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
        ):
            raise ConfigurationError(
                f"SequenceSource batch_size must be a positive int, got {batch_size!r}"
            )
        self.start = start
        self.stop = stop
        self.rate = rate
        self.batch_size = batch_size
        self.columnar = batch_size is not None

    def create_splits(self, parallelism: int) -> list[SequenceSplit]:
        ranges = _ranges(max(0, self.stop - self.start), parallelism)
        base = self.start
        return [
            SequenceSplit(f"seq-{i}", base + lo, base + hi) for i, (lo, hi) in enumerate(ranges)
        ]

    def create_reader(self, ctx: SourceContext) -> SequenceReader:
        rate = None if self.rate is None else self.rate / ctx.parallelism
        return SequenceReader(ctx.clock, rate=rate, batch_size=self.batch_size)


class CollectionSource(Source):
    """The items of a collection (materialized into a list when the source is made).

    Guarantee: exactly-once (each split's position in every checkpoint).

    Example::

        CollectionSource(["a", "b", "c"]).create_splits(2)   # items 0 and 1-2
    """

    bounded = True
    replayable = True

    def __init__(self, items: Iterable[Any]) -> None:
        self.items: list[Any] = list(items)

    def create_splits(self, parallelism: int) -> list[CollectionSplit]:
        return [
            CollectionSplit(f"col-{i}", lo, hi, lo)
            for i, (lo, hi) in enumerate(_ranges(len(self.items), parallelism))
        ]

    def create_reader(self, ctx: SourceContext) -> CollectionReader:
        return CollectionReader(self.items, ctx.clock)


class _RangeCursor:
    """Read position in one index range."""

    __slots__ = ("end", "pos", "split")

    def __init__(self, split: Any, pos: int, end: int) -> None:
        self.split = split
        self.pos = pos
        self.end = end


class _RangeReader(SourceReader):
    """Reads contiguous index ranges; subclasses map ranges to records and split states.

    With a ``rate`` (records/s of this reader) record k is due at ``t0 + k / rate``,
    ``t0`` being the first poll; due records are released a step at a time
    (:data:`RELEASE_STEP_S`).
    """

    def __init__(
        self,
        clock: Clock,
        fetch: Callable[[int, int], Any],
        rate: float | None = None,
        batch_size: int | None = None,
    ) -> None:
        # Columnar (``fetch`` returns record batches): each poll fills ``batch_size`` rows;
        # the runtime's ``max_records`` hint is for rows.
        self._batch_size = batch_size
        self._clock = clock
        self._fetch = fetch
        self._cursors: list[_RangeCursor] = []
        self._rate = rate
        self._t0: float | None = None
        self._emitted = 0
        self._poll_size = 1  # the latest poll's max_records: a step is at most that

    def _releasable(self, max_records: int) -> int:
        """How many records a poll of up to ``max_records`` may hand out now: all of
        them without a rate, else those due, once a whole step is (see
        :data:`RELEASE_STEP_S`)."""
        if self._rate is None or not self._cursors:
            return max_records
        self._poll_size = max_records
        due = self._due()
        return min(max_records, due) if due >= self._step() else 0

    def _step(self) -> int:
        """Records per release step: a step's worth of the rate, at least one, at most
        the last poll's size."""
        assert self._rate is not None
        return max(1, min(self._poll_size, int(self._rate * RELEASE_STEP_S)))

    def _due(self) -> int:
        """How many records may be released now."""
        assert self._rate is not None
        now = self._clock.now()
        if self._t0 is None:
            self._t0 = now
        return math.floor((now - self._t0) * self._rate + _DUE_EPSILON) + 1 - self._emitted

    @abstractmethod
    def _cursor(self, split: Any) -> _RangeCursor:
        """A cursor for ``split``; rejects splits of another source."""

    @abstractmethod
    def _state(self, cursor: _RangeCursor) -> Any:
        """The split state of ``cursor`` at its current position."""

    def add_splits(self, splits: list[Any]) -> None:
        for split in splits:
            cursor = self._cursor(split)
            if cursor.pos < cursor.end:
                self._cursors.append(cursor)

    def poll(self, max_records: int) -> Any:
        max_records = self._batch_size or max_records
        parts: list[Any] = []
        max_records = self._releasable(max_records)
        left = max_records
        finished = False
        for cursor in self._cursors:
            if left <= 0:
                break
            take = min(left, cursor.end - cursor.pos)
            if take > 0:
                parts.append(self._read(cursor, cursor.pos, cursor.pos + take))
                cursor.pos += take
                left -= take
                finished = finished or cursor.pos >= cursor.end
        self._emitted += max_records - left
        if finished:
            self._cursors = [c for c in self._cursors if c.pos < c.end]
        return self._join(parts)

    def _read(self, cursor: _RangeCursor, lo: int, hi: int) -> Any:
        """The records of ``cursor``'s positions ``lo..hi-1``; a subclass whose split
        positions are not the stream's own maps them here."""
        return self._fetch(lo, hi)

    def _join(self, parts: list[Any]) -> Any:
        """One poll's result from the parts read from each cursor."""
        if len(parts) == 1:
            return parts[0]
        if self._batch_size is not None and parts:
            import pyarrow as pa

            return pa.concat_batches(parts)
        out: list[Any] = []
        for part in parts:
            out.extend(part)
        return out

    def poll_splits(self, max_records: int) -> list[tuple[Any, list[Any], bool]]:
        max_records = self._batch_size or max_records
        groups: list[tuple[Any, list[Any], bool]] = []
        max_records = self._releasable(max_records)
        left = max_records
        for cursor in self._cursors:
            if left <= 0:
                break
            take = min(left, cursor.end - cursor.pos)
            if take > 0:
                records = self._read(cursor, cursor.pos, cursor.pos + take)
                cursor.pos += take
                left -= take
                groups.append((cursor.split.split_id, records, cursor.pos >= cursor.end))
        self._emitted += max_records - left
        if any(done for _, _, done in groups):
            self._cursors = [c for c in self._cursors if c.pos < c.end]
        return groups

    @property
    def exhausted(self) -> bool:
        return not self._cursors

    def next_available(self) -> float | None:
        if self._rate is None or self._t0 is None or not self._cursors:
            return None  # records can be read right now
        # Record k (from 0) is due at t0 + k / rate; the next release is a whole step.
        return self._t0 + (self._emitted + self._step() - 1) / self._rate

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        return [self._state(cursor) for cursor in self._cursors]

    def close(self) -> None:
        self._cursors = []


class SequenceReader(_RangeReader):
    """Reads :class:`SequenceSplit` states.

    Example::

        reader = SequenceReader(ManualClock())
        reader.add_splits([SequenceSplit("seq-0", 0, 3)])
        reader.poll(10) == [0, 1, 2]
        SequenceReader(ManualClock(), batch_size=2)   # polls return RecordBatches of <= 2 rows
    """

    def __init__(
        self, clock: Clock, *, rate: float | None = None, batch_size: int | None = None
    ) -> None:
        fetch = _number_range if batch_size is None else _number_batch
        super().__init__(clock, fetch, rate, batch_size)

    def _cursor(self, split: Any) -> _RangeCursor:
        if not isinstance(split, SequenceSplit):
            raise ConfigurationError(
                f"SequenceReader got a {type(split).__qualname__} split, not a SequenceSplit"
            )
        return _RangeCursor(split, split.next, split.stop)

    def _state(self, cursor: _RangeCursor) -> SequenceSplit:
        split: SequenceSplit = cursor.split
        return SequenceSplit(split.split_id, cursor.pos, cursor.end)


class CollectionReader(_RangeReader):
    """Reads :class:`CollectionSplit` states of ``items``.

    Example::

        reader = CollectionReader(["a", "b"], ManualClock())
        reader.add_splits([CollectionSplit("col-0", 0, 2, 0)])
        reader.poll(10) == ["a", "b"]
    """

    def __init__(self, items: list[Any], clock: Clock) -> None:
        super().__init__(clock, lambda lo, hi: items[lo:hi])
        self._size = len(items)

    def _cursor(self, split: Any) -> _RangeCursor:
        if not isinstance(split, CollectionSplit):
            raise ConfigurationError(
                f"CollectionReader got a {type(split).__qualname__} split, not a CollectionSplit"
            )
        if split.end > self._size:
            raise ConfigurationError(
                f"CollectionSplit {split.split_id} ends at {split.end}, "
                f"but the collection has {self._size} items"
            )
        return _RangeCursor(split, split.position, split.end)

    def _state(self, cursor: _RangeCursor) -> CollectionSplit:
        split: CollectionSplit = cursor.split
        return CollectionSplit(split.split_id, split.start, split.end, cursor.pos)


def _number_range(lo: int, hi: int) -> list[int]:
    return list(range(lo, hi))


def _number_batch(lo: int, hi: int) -> Any:
    import numpy as np
    import pyarrow as pa

    return pa.record_batch([pa.array(np.arange(lo, hi, dtype=np.int64))], names=["value"])
