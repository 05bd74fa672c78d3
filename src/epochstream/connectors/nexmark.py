"""Nexmark: a deterministic generator of the benchmark's people, auctions and bids.

``NexmarkConfig`` says what to generate; :func:`nexmark_events` gives the events at
positions ``start..stop-1`` of the stream (a pure function: the same events whatever
the split, parallelism or process); :class:`NexmarkSource` reads them as a bounded,
replayable source whose splits are position ranges; :func:`write_nexmark_files` writes
the same events as Parquet for peers and the DuckDB oracle. The event model and its
differences from the reference generator are in
:mod:`epochstream.connectors.nexmark_model`.

Columnar form: ``NexmarkSource(config, batch_size=N, kind="bid")`` reads one kind as
Arrow record batches (the kind's columns; a stream has one schema).

Row form: each event is a plain dict with the spec's field names plus ``"type"``
(``"person"``, ``"auction"`` or ``"bid"``). Dicts are what the file and JSON sources
produce too, and queries read fields by name as in the SQL. They cost little more than
tuples between slots: the dicts of a batch share their key objects, which pickle memoizes
(a bid pickles to about 178 bytes in a batch, 160 as a tuple).

Example::

    config = es.sources.nexmark.NexmarkConfig(events=100_000, seed=7)
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(4_000).with_timestamp_assigner(
        lambda e: e["date_time"])
    events = env.from_source(es.sources.NexmarkSource(config), watermark_strategy=strategy)
    bids = events.filter(lambda e: e["type"] == "bid")
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from epochstream.connectors.base import Source, SourceContext
from epochstream.connectors.generators import _RangeCursor, _RangeReader
from epochstream.connectors.nexmark_model import KINDS, event_numbers, generate_columns
from epochstream.core.arrow import rows_of
from epochstream.core.clock import Clock
from epochstream.exceptions import ConfigurationError

__all__ = [
    "NexmarkConfig",
    "NexmarkReader",
    "NexmarkSource",
    "NexmarkSplit",
    "nexmark_columns",
    "nexmark_events",
    "write_nexmark_files",
]

#: Positions generated at once by a reader (one numpy pass; polls slice it).
_BLOCK = 8_192
#: Positions per chunk when writing files (bounds memory).
_FILE_CHUNK = 500_000


@dataclass(frozen=True, kw_only=True)
class NexmarkConfig:
    """What the Nexmark generator produces (keyword-only; defaults are the benchmark's).

    ``events``: how many (positions ``0..events-1``). ``seed``: different seeds give
    different events. ``events_per_second``: of event time (``date_time`` advances
    ``1/events_per_second`` s per event number; at most 1,000,000). ``out_of_order_group_size``:
    events are shuffled within groups of this many positions (1: in order).
    ``base_time_ms``: ``date_time`` of event 0. ``num_active_people``,
    ``num_in_flight_auctions`` and the ``hot_*_ratio`` shape the key skew as in the
    reference generator: with odds ``1 - 1/ratio`` a bid names the hot auction (the
    first of the last block of 100) and the hot bidder, an auction the hot seller.

    Example: ``NexmarkConfig(events=1_000_000, seed=1, events_per_second=50_000)``
    """

    events: int = 1_000_000
    seed: int = 0
    events_per_second: float = 10_000.0
    out_of_order_group_size: int = 1_000
    base_time_ms: int = 1_700_000_000_000
    num_active_people: int = 1_000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_seller_ratio: int = 4
    hot_bidder_ratio: int = 4

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "events_per_second":
                ok = (
                    isinstance(value, int | float)
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                    and 0 < value <= 1_000_000
                )
                if not ok:
                    raise ConfigurationError(
                        f"NexmarkConfig.events_per_second must be a number in (0, 1000000], got {value!r}"
                    )
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigurationError(f"NexmarkConfig.{f.name} must be an int, got {value!r}")
            low = {"events": 0, "seed": 0, "base_time_ms": 0}.get(f.name, 1)
            if value < low:
                raise ConfigurationError(f"NexmarkConfig.{f.name} must be >= {low}, got {value}")
        if self.seed >= 1 << 63:
            raise ConfigurationError(f"NexmarkConfig.seed must be below 2**63, got {self.seed}")

    @property
    def inter_event_delay_us(self) -> int:
        """Microseconds of event time between consecutive event numbers (at least 1)."""
        return max(1, math.floor(1_000_000 / self.events_per_second + 0.5))


def _check_range(config: NexmarkConfig, start: int, stop: int) -> None:
    if not 0 <= start <= stop <= config.events:
        raise ConfigurationError(
            f"Nexmark positions {start}..{stop} are outside the configured 0..{config.events}"
        )


def nexmark_columns(
    config: NexmarkConfig, start: int, stop: int, kinds: tuple[str, ...] = KINDS
) -> tuple[dict[str, pa.RecordBatch], dict[str, np.ndarray]]:
    """Positions ``start..stop-1`` as one Arrow batch per kind of ``kinds`` (rows in
    stream order) plus each row's position.

    Example: ``batches, where = nexmark_columns(config, 0, 1_000, ("bid",))``
    """
    _check_range(config, start, stop)
    return generate_columns(config, start, stop, kinds)


def nexmark_events(config: NexmarkConfig, start: int, stop: int) -> list[dict[str, Any]]:
    """The events at positions ``start..stop-1`` as dicts with ``"type"`` (stream order).

    Example: ``nexmark_events(NexmarkConfig(events=50), 0, 1)[0]["id"] == 1000`` (position
    0 holds event 0, the first person; later positions of a group hold shuffled events).
    """
    batches, where = nexmark_columns(config, start, stop)
    out: list[Any] = [None] * (stop - start)
    for kind in KINDS:
        for i, row in zip((where[kind] - start).tolist(), rows_of(batches[kind]), strict=True):
            row["type"] = kind
            out[i] = row
    return out


@dataclass(frozen=True)
class NexmarkSplit:
    """Split ``index`` of ``of``: the blocks of ``block`` positions whose number is
    ``index`` modulo ``of`` (block ``b`` holds positions ``b * block ..``), read from
    the split's own position ``next`` (counted over its blocks) up to ``stop``. With
    ``of=1`` the split is positions ``next..stop-1`` of the stream.

    Example: ``NexmarkSplit(split_id="nexmark-0", next=0, stop=500_000, index=0, of=2)``
    """

    split_id: str
    next: int
    stop: int
    index: int = 0
    of: int = 1
    block: int = 8_192

    def stream_ranges(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The stream's position ranges of the split's positions ``lo..hi-1``, in order.

        Example: ``NexmarkSplit("s", 0, 10, index=1, of=2, block=4).stream_ranges(3, 6) == [(7, 8), (12, 14)]``
        """
        if self.of == 1:
            return [(lo, hi)]
        out = []
        while lo < hi:
            rnd, offset = divmod(lo, self.block)
            start = (rnd * self.of + self.index) * self.block + offset
            take = min(hi - lo, self.block - offset)
            out.append((start, start + take))
            lo += take
        return out


def interleaved_splits(events: int, parallelism: int, block: int) -> list[NexmarkSplit]:
    """``parallelism`` splits taking turns by blocks of ``block`` positions (fewer when
    there are fewer blocks), so parallel readers advance through event time together.

    Example: ``[s.stop for s in interleaved_splits(20_000, 2, 8_192)] == [11_808, 8_192]``
    """
    k = max(1, min(parallelism, -(-events // block)))
    rounds, rest = divmod(events, k * block)
    return [
        NexmarkSplit(
            f"nexmark-{i}", 0, rounds * block + min(max(rest - i * block, 0), block), i, k, block
        )
        for i in range(k)
    ]


class NexmarkSource(Source):
    """The Nexmark events of ``config`` (see the module docstring).

    Guarantee: exactly-once (each split's next position in every checkpoint). There are
    up to ``parallelism`` splits, taking turns by blocks of 8,192 positions, so parallel
    readers go through event time together (windows fire as the job goes, not when a
    slower reader's range ends). An event's content depends on its position only, so
    any split or parallelism gives the same events.
    ``rate``: positions/s in total (wall time), as ``SequenceSource``; None: as fast as
    the job reads.

    Rows (default): every event as a dict with ``"type"``; with ``kind``, the events of
    that kind only, as dicts of its fields (no ``"type"``). Columnar (``batch_size``
    given, with ``kind``): the events of one kind as ``pyarrow.RecordBatch`` objects of
    that kind's columns (one schema per stream), each from up to ``batch_size``
    positions. Read the other kinds with another source over the same config: a query
    that joins persons and auctions then reads neither the bids nor their fields.

    Example::

        env.from_source(es.sources.NexmarkSource(es.sources.nexmark.NexmarkConfig(events=1_000_000)))
        bids = env.from_source(
            es.sources.NexmarkSource(config, batch_size=65_536, kind="bid"),
            watermark_strategy=strategy.with_timestamp_column("date_time"))
    """

    bounded = True
    replayable = True

    def __init__(
        self,
        config: NexmarkConfig,
        *,
        rate: float | None = None,
        batch_size: int | None = None,
        kind: str | None = None,
    ) -> None:
        if not isinstance(config, NexmarkConfig):
            raise ConfigurationError(
                f"NexmarkSource needs a NexmarkConfig, got {type(config).__name__}"
            )
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise ConfigurationError(f"NexmarkSource rate must be a positive number, got {rate}")
        if batch_size is not None and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
        ):
            raise ConfigurationError(
                f"NexmarkSource batch_size must be a positive int, got {batch_size!r}"
            )
        if (batch_size is not None and kind is None) or (kind is not None and kind not in KINDS):
            raise ConfigurationError(
                f"NexmarkSource kind={kind!r}: a columnar source (batch_size) reads one kind, "
                f"one of {KINDS}; a row source reads one kind or (kind=None) all of them"
            )
        self.config = config
        self.rate = rate
        self.batch_size = batch_size
        self.kind = kind
        self.columnar = batch_size is not None

    def create_splits(self, parallelism: int) -> list[NexmarkSplit]:
        return interleaved_splits(self.config.events, parallelism, _BLOCK)

    def create_reader(self, ctx: SourceContext) -> NexmarkReader:
        rate = None if self.rate is None else self.rate / ctx.parallelism
        return NexmarkReader(
            self.config, ctx.clock, rate=rate, batch_size=self.batch_size, kind=self.kind
        )


class _BlockFetch:
    """Generates aligned blocks of ``_BLOCK`` positions and serves slices of them, so a
    reader polled for a few hundred records pays numpy's per-call cost once per block."""

    def __init__(self, config: NexmarkConfig) -> None:
        self._config = config
        self._start = 0
        self._events: list[dict[str, Any]] = []

    def __call__(self, lo: int, hi: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while lo < hi:
            if not self._start <= lo < self._start + len(self._events):
                self._start = lo // _BLOCK * _BLOCK
                end = min(self._start + _BLOCK, self._config.events)
                self._events = nexmark_events(self._config, self._start, end)
            take = min(hi, self._start + len(self._events))
            out.extend(self._events[lo - self._start : take - self._start])
            lo = take
        return out


class _KindRows:
    """One kind's events as dicts of its fields, for a range of positions: generated in
    aligned blocks of ``_BLOCK`` positions, as :class:`_BlockFetch`."""

    def __init__(self, config: NexmarkConfig, kind: str) -> None:
        self._config = config
        self._kinds = (kind,)
        self._start = 0
        self._stop = 0
        self._rows: list[dict[str, Any]] = []
        self._positions = np.empty(0, dtype=np.int64)

    def __call__(self, lo: int, hi: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while lo < hi:
            if not self._start <= lo < self._stop:
                self._start = lo // _BLOCK * _BLOCK
                self._stop = min(self._start + _BLOCK, self._config.events)
                batches, where = nexmark_columns(self._config, self._start, self._stop, self._kinds)
                self._rows = rows_of(batches[self._kinds[0]])
                self._positions = where[self._kinds[0]]
            take = min(hi, self._stop)
            first, last = np.searchsorted(self._positions, [lo, take]).tolist()
            out.extend(self._rows[first:last])
            lo = take
        return out


class _KindBatches:
    """One kind's columns for a range of positions (the columnar reader's fetch)."""

    def __init__(self, config: NexmarkConfig, kind: str) -> None:
        self._config = config
        self._kinds = (kind,)

    def __call__(self, lo: int, hi: int) -> pa.RecordBatch:
        return nexmark_columns(self._config, lo, hi, self._kinds)[0][self._kinds[0]]


class NexmarkReader(_RangeReader):
    """Reads :class:`NexmarkSplit` states; its snapshot is each split's next position.

    With ``batch_size`` (and ``kind``) each poll is one record batch of ``kind``'s
    events among the next ``batch_size`` positions (the runtime's hint is for rows).

    Example::

        reader = NexmarkReader(NexmarkConfig(events=100), ManualClock())
        reader.add_splits([NexmarkSplit("nexmark-0", 0, 100)])
        len(reader.poll(10)) == 10
    """

    def __init__(
        self,
        config: NexmarkConfig,
        clock: Clock,
        *,
        rate: float | None = None,
        batch_size: int | None = None,
        kind: str | None = None,
    ) -> None:
        if batch_size is not None and kind is None:
            raise ConfigurationError("NexmarkReader: a columnar reader (batch_size) reads one kind")
        fetch: Any
        if kind is None:
            fetch = _BlockFetch(config)
        elif batch_size is None:
            fetch = _KindRows(config, kind)
        else:
            fetch = _KindBatches(config, kind)
        super().__init__(clock, fetch, rate, batch_size)
        self._events = config.events

    def _cursor(self, split: Any) -> _RangeCursor:
        if not isinstance(split, NexmarkSplit):
            raise ConfigurationError(
                f"NexmarkReader got a {type(split).__qualname__} split, not a NexmarkSplit"
            )
        last = split.stream_ranges(split.stop - 1, split.stop)[-1][1] if split.stop else 0
        if not (
            0 <= split.next <= split.stop and 0 <= split.index < split.of and last <= self._events
        ):
            raise ConfigurationError(
                f"NexmarkSplit {split.split_id} covers {split.next}..{split.stop} of part "
                f"{split.index} of {split.of}, outside the source's 0..{self._events} events"
            )
        return _RangeCursor(split, split.next, split.stop)

    def _read(self, cursor: _RangeCursor, lo: int, hi: int) -> Any:
        return self._join([self._fetch(a, b) for a, b in cursor.split.stream_ranges(lo, hi)])

    def _state(self, cursor: _RangeCursor) -> NexmarkSplit:
        split: NexmarkSplit = cursor.split
        return replace(split, next=cursor.pos)


def write_nexmark_files(directory: str | os.PathLike[str], config: NexmarkConfig) -> dict[str, int]:
    """Write ``person.parquet``, ``auction.parquet``, ``bid.parquet`` (each kind's
    columns) and ``events.parquet`` (every event in stream order: ``event_type`` 0/1/2,
    ``seq`` the event number, the union of the fields, null where a kind lacks one)
    into ``directory``; returns the row count per file stem.

    Example: ``write_nexmark_files("/tmp/nexmark", NexmarkConfig(events=1_000_000))``
    """
    os.makedirs(directory, exist_ok=True)
    writers: dict[str, pq.ParquetWriter] = {}
    counts = dict.fromkeys((*KINDS, "events"), 0)
    union_schema: pa.Schema | None = None
    try:
        # One pass over an empty range when there are no events: the files still get schemas.
        for lo in range(0, max(config.events, 1), _FILE_CHUNK):
            hi = min(lo + _FILE_CHUNK, config.events)
            batches, where = nexmark_columns(config, lo, hi)
            parts = []
            numbers = event_numbers(config, lo, hi)
            for event_type, kind in enumerate(KINDS):
                batch = batches[kind]
                table = pa.Table.from_batches([batch], schema=batch.schema)
                _write(writers, directory, kind, table)
                counts[kind] += batch.num_rows
                extra = {
                    "event_type": pa.array(np.full(batch.num_rows, event_type, dtype=np.int8)),
                    "seq": pa.array(numbers[where[kind] - lo]),
                    "_position": pa.array(where[kind]),
                }
                for name, column in extra.items():
                    table = table.append_column(name, column)
                parts.append(table)
            merged = pa.concat_tables(parts, promote_options="default")
            merged = merged.take(
                pa.array(np.argsort(merged.column("_position").to_numpy(), kind="stable"))
            )
            merged = merged.drop_columns(["_position"])
            if union_schema is None:
                union_schema = _union_schema(merged.schema)
            _write(
                writers, directory, "events", merged.select(union_schema.names).cast(union_schema)
            )
            counts["events"] += merged.num_rows
    finally:
        for writer in writers.values():
            writer.close()
    return counts


def _union_schema(schema: pa.Schema) -> pa.Schema:
    """``event_type``, ``seq`` first, then every field (all nullable)."""
    names = ["event_type", "seq", *(n for n in schema.names if n not in ("event_type", "seq"))]
    return pa.schema([pa.field(n, schema.field(n).type, nullable=True) for n in names])


def _write(
    writers: dict[str, pq.ParquetWriter], directory: Any, stem: str, table: pa.Table
) -> None:
    writer = writers.get(stem)
    if writer is None:
        path = os.path.join(os.fspath(directory), f"{stem}.parquet")
        writer = writers[stem] = pq.ParquetWriter(path, table.schema)
    # Row groups of _BLOCK * 8 rows: Parquet sources split by row group and hand them out
    # in turn, so parallel readers go through event time together, as the generator's.
    writer.write_table(table, row_group_size=_BLOCK * 8)
