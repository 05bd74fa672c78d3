"""The Nexmark queries on epochstream's columnar path (Arrow record batches).

Each query takes :class:`streams.NexmarkStreams` made with ``columnar=True`` (one
columnar source per event kind, created on first use) and returns batches with the
columns of the row query's tuples (see ``queries.py``, whose semantics these share)
plus ``_ts``.

Example::

    env = es.Environment(parallelism=2)
    streams = NexmarkStreams.generated(env, es.sources.nexmark.NexmarkConfig(events=10_000_000), columnar=True)
    COLUMNAR_QUERIES["q1"](streams).sink_to(es.sinks.DiscardSink())
    env.execute("nexmark-q1-columnar")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import epochstream as es

from .queries import Q3_CATEGORY, Q3_STATES, SLIDE_MS, WINDOW_MS, _MostBids, _window_start
from .streams import NexmarkStreams

__all__ = ["COLUMNAR_QUERIES", "q0", "q1", "q2", "q3", "q5", "q8", "q11", "q12"]


# ------------------------------------------------------------------ q0, q1, q2

_Q0_COLUMNS = ["auction", "bidder", "price", "date_time", "extra", "_ts"]


def _q0_batch(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(_Q0_COLUMNS)


def q0(streams: NexmarkStreams) -> es.DataStream:
    """q0 on columnar bids: the same columns, a batch at a time."""
    return streams.of("bid").map_batches(_q0_batch).uid("q0-columnar")


def _q1_batch(b: pa.RecordBatch) -> pa.RecordBatch:
    euros = pc.cast(pc.trunc(pc.multiply(pc.cast(b["price"], pa.float64()), 0.908)), pa.int64())
    return b.select(_Q0_COLUMNS).set_column(2, "price", euros)


def q1(streams: NexmarkStreams) -> es.DataStream:
    """q1 on columnar bids (the same double product and truncation as the row q1)."""
    return streams.of("bid").map_batches(_q1_batch).uid("q1-columnar")


def _q2_columns(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(["auction", "price", "_ts"])


def q2(streams: NexmarkStreams) -> es.DataStream:
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


def q3(streams: NexmarkStreams) -> es.DataStream:
    """q3 on batches: category-10 auctions joined (a regular join, unbounded state) with
    their sellers in OR, ID or CA; returns (name, city, state, auction)."""
    auctions = (
        streams.of("auction")
        .filter(pc.field("category") == Q3_CATEGORY)
        .uid("q3-auctions")
        .map_batches(_q3_auction)
        .uid("q3-auction-columns")
    )
    persons = (
        streams.of("person")
        .filter(pc.field("state").isin(sorted(Q3_STATES)))
        .uid("q3-persons")
        .map_batches(_q3_person)
        .uid("q3-person-columns")
    )
    return (
        auctions.join(persons).where("seller").equal_to("id").apply(_q3_result).uid("q3-columnar")
    )


# ------------------------------------------------------------------ q5

_Q5_SCHEMA = pa.schema(
    [("window_start", pa.int64()), ("auction", pa.int64()), ("count", pa.int64())]
)


def _q5_row(r: dict[str, Any]) -> tuple[int, int, int]:
    return (r["window_start"], r["auction"], r["count"])


def q5(streams: NexmarkStreams) -> es.DataStream:
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
    grouped = (
        pa.Table.from_batches([b.select(keys)]).group_by(keys, use_threads=False).aggregate([])
    )
    distinct = pa.concat_batches(grouped.select(keys).to_batches())
    return distinct.append_column("_ts", pc.add(distinct["window_start"], WINDOW_MS - 1))


def q8(streams: NexmarkStreams) -> es.DataStream:
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


# ------------------------------------------------------------------ q11, q12

_BIDDER_WINDOW_COLUMNS = ["bidder", "count", "window_start", "window_end", "_ts"]


def _bidder_window(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.select(_BIDDER_WINDOW_COLUMNS)


def q11(streams: NexmarkStreams) -> es.DataStream:
    """q11 on columnar bids: (bidder, bids, session start, session end) per session
    closed by 10 s without a bid, merged and counted with vector operations."""
    return (
        streams.of("bid")
        .key_by("bidder")
        .window(es.EventTimeSessionWindows.with_gap(WINDOW_MS))
        .count()
        .uid("q11-columnar")
        .map_batches(_bidder_window)
    )


def q12(streams: NexmarkStreams) -> es.DataStream:
    """q12 on columnar bids: (bidder, bids, window start, window end) per 10 s window of
    processing time; the windows open at the end of a bounded input fire there, as the
    row q12's trigger does."""
    return (
        streams.of("bid")
        .key_by("bidder")
        .window(es.TumblingProcessingTimeWindows.of(WINDOW_MS))
        .count()
        .uid("q12-columnar")
        .map_batches(_bidder_window)
    )


COLUMNAR_QUERIES: dict[str, Callable[[NexmarkStreams], es.DataStream]] = {
    "q0": q0,
    "q1": q1,
    "q2": q2,
    "q3": q3,
    "q5": q5,
    "q8": q8,
    "q11": q11,
    "q12": q12,
}
