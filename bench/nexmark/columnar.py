"""The Nexmark queries on epochstream's columnar path (Arrow record batches).

Each query takes :class:`NexmarkBatches` (one columnar source per event kind, created
on first use) and returns batches with the columns of the row query's tuples (see
``queries.py``, whose semantics these share) plus ``_ts``.

Example::

    env = es.Environment(parallelism=2)
    streams = NexmarkBatches.generated(env, es.NexmarkConfig(events=10_000_000))
    COLUMNAR_QUERIES["q1"](streams).sink_to(es.sinks.DiscardSink())
    env.execute("nexmark-q1-columnar")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import epochstream as es

from .queries import (
    Q3_CATEGORY,
    Q3_STATES,
    SLIDE_MS,
    WATERMARK_BOUND_MS,
    WINDOW_MS,
    _MostBids,
    _window_start,
)

__all__ = ["COLUMNAR_QUERIES", "NexmarkBatches", "q0", "q1", "q2", "q3", "q5", "q8"]

KINDS = ("person", "auction", "bid")


class NexmarkBatches:
    """The Nexmark events as one columnar stream per kind (``person``, ``auction``,
    ``bid``), each with event time from ``date_time`` and the 4 s watermark bound.
    A kind's source is created the first time a query asks for it, so a query over
    bids alone reads bids alone.

    Example: ``bids = NexmarkBatches.generated(env, config).of("bid")``
    """

    def __init__(self, make: Callable[[str, es.WatermarkStrategy], es.DataStream]) -> None:
        self._make = make
        self._streams: dict[str, es.DataStream] = {}

    @classmethod
    def generated(
        cls, env: es.Environment, config: es.NexmarkConfig, *, batch_size: int = 65_536
    ) -> NexmarkBatches:
        """Batches of the deterministic generator (``es.NexmarkSource(kind=...)``).

        Example: ``NexmarkBatches.generated(env, es.NexmarkConfig(events=1_000_000))``
        """

        def make(kind: str, strategy: es.WatermarkStrategy) -> es.DataStream:
            source = es.NexmarkSource(config, batch_size=batch_size, kind=kind)
            return env.from_source(source, name=f"nexmark-{kind}", watermark_strategy=strategy)

        return cls(make)

    @classmethod
    def from_files(cls, env: es.Environment, directory: str) -> NexmarkBatches:
        """Batches of ``es.write_nexmark_files``' ``<kind>.parquet`` files.

        Example: ``NexmarkBatches.from_files(env, "/tmp/nexmark-1m")``
        """

        def make(kind: str, strategy: es.WatermarkStrategy) -> es.DataStream:
            return env.from_parquet(f"{directory}/{kind}.parquet", watermark_strategy=strategy)

        return cls(make)

    def of(self, kind: str) -> es.DataStream:
        """The columnar stream of ``kind``'s events. Example: ``streams.of("auction")``"""
        if kind not in KINDS:
            raise ValueError(f"no Nexmark event kind {kind!r}; choose among {KINDS}")
        if kind not in self._streams:
            strategy = es.WatermarkStrategy.bounded_out_of_orderness(
                WATERMARK_BOUND_MS
            ).with_timestamp_column("date_time")
            self._streams[kind] = self._make(kind, strategy).uid(f"nexmark-{kind}-batches")
        return self._streams[kind]


# ------------------------------------------------------------------ q0, q1, q2

_Q0_COLUMNS = ["auction", "bidder", "price", "date_time", "extra", "_ts"]


def _q0_batch(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(_Q0_COLUMNS)


def q0(streams: NexmarkBatches) -> es.DataStream:
    """q0 on columnar bids: the same columns, a batch at a time."""
    return streams.of("bid").map_batches(_q0_batch).uid("q0-columnar")


def _q1_batch(b: pa.RecordBatch) -> pa.RecordBatch:
    euros = pc.cast(pc.trunc(pc.multiply(pc.cast(b["price"], pa.float64()), 0.908)), pa.int64())
    return b.select(_Q0_COLUMNS).set_column(2, "price", euros)


def q1(streams: NexmarkBatches) -> es.DataStream:
    """q1 on columnar bids (the same double product and truncation as the row q1)."""
    return streams.of("bid").map_batches(_q1_batch).uid("q1-columnar")


def _q2_columns(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(["auction", "price", "_ts"])


def q2(streams: NexmarkBatches) -> es.DataStream:
    """q2 on columnar bids: (auction, price) where auction % 123 == 0, the selection as
    an Arrow expression."""
    selected = streams.of("bid").filter(pc.equal(pc.remainder(pc.field("auction"), 123), 0))
    return selected.uid("q2-filter").map_batches(_q2_columns).uid("q2-columnar")


# ------------------------------------------------------------------ q3


def _q3_auction(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(["id", "seller", "_ts"])


def _q3_person(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(["id", "name", "city", "state", "_ts"])


def _q3_result(b: pa.RecordBatch) -> pa.RecordBatch:
    # Joined columns: id, seller (auction), id_right, name, city, state (person), _ts.
    return pa.record_batch(
        [b["name"], b["city"], b["state"], b["id"], b["_ts"]],
        names=["name", "city", "state", "auction", "_ts"],
    )


def q3(streams: NexmarkBatches) -> es.DataStream:
    """q3 on batches: category-10 auctions joined (a regular join, unbounded state) with
    their sellers in OR, ID or CA; returns (name, city, state, auction)."""
    auctions = (
        streams.of("auction").filter(pc.field("category") == Q3_CATEGORY).uid("q3-auctions")
        .map_batches(_q3_auction).uid("q3-auction-columns")
    )
    persons = (
        streams.of("person").filter(pc.field("state").isin(sorted(Q3_STATES))).uid("q3-persons")
        .map_batches(_q3_person).uid("q3-person-columns")
    )
    return auctions.join(persons).where("seller").equal_to("id").apply(_q3_result).uid("q3-columnar")


# ------------------------------------------------------------------ q5

_Q5_SCHEMA = pa.schema([("window_start", pa.int64()), ("auction", pa.int64()), ("count", pa.int64())])


def _q5_row(r: dict[str, Any]) -> tuple[int, int, int]:
    return (r["window_start"], r["auction"], r["count"])


def q5(streams: NexmarkBatches) -> es.DataStream:
    """q5 with the bid counts per auction and sliding window on the columnar path (the
    bulk of the work), then the most-bid auctions of each window on rows, as in the row
    q5; returns batches of (window_start, auction, count)."""
    counts = (
        streams.of("bid")
        .key_by("auction")
        .window(es.SlidingEventTimeWindows.of(WINDOW_MS, SLIDE_MS))
        .count()
        .uid("q5-columnar-counts")
    )
    # A count's timestamp is its window's last ms (``_ts``), as in the row q5.
    return (
        counts.to_rows()
        .map(_q5_row)
        .key_by(_window_start)
        .window(es.TumblingEventTimeWindows.of(SLIDE_MS))
        .process(_MostBids())
        .uid("q5-columnar-max")
        .to_batches(_Q5_SCHEMA)
    )


# ------------------------------------------------------------------ q8


def _q8_person(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(["id", "name", "_ts"])


def _q8_auction(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(["seller", "_ts"])


def _q8_new_sellers(b: pa.RecordBatch) -> pa.RecordBatch:
    # All pairs of one window (of one subtask) come in one batch: distinct per window.
    keys = ["id", "name", "window_start"]
    grouped = pa.Table.from_batches([b.select(keys)]).group_by(keys, use_threads=False).aggregate([])
    distinct = pa.concat_batches(grouped.select(keys).to_batches())
    return distinct.append_column("_ts", pc.add(distinct["window_start"], WINDOW_MS - 1))


def q8(streams: NexmarkBatches) -> es.DataStream:
    """q8 on batches: persons joined with the auctions they opened in the same 10 s
    tumbling window (a columnar window join); returns distinct (id, name, window_start)."""
    persons = streams.of("person").map_batches(_q8_person).uid("q8-person-columns")
    sellers = streams.of("auction").map_batches(_q8_auction).uid("q8-auction-columns")
    return (
        persons.join(sellers)
        .where("id")
        .equal_to("seller")
        .window(es.TumblingEventTimeWindows.of(WINDOW_MS))
        .apply(_q8_new_sellers)
        .uid("q8-columnar")
    )


COLUMNAR_QUERIES: dict[str, Callable[[NexmarkBatches], es.DataStream]] = {
    "q0": q0,
    "q1": q1,
    "q2": q2,
    "q3": q3,
    "q5": q5,
    "q8": q8,
}
