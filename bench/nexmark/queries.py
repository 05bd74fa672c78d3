"""The Nexmark queries q0-q5, q7, q8, q11, q12 on epochstream's DataStream API.

Each ``qN(streams)`` takes :class:`streams.NexmarkStreams` (one row stream per event
kind, dicts of the kind's fields: timestamps from ``date_time``, watermarks 4 s behind
the largest one seen) and returns the result stream; results are tuples (lists once
written as JSON). A query reads only the kinds it needs.
Semantics are Flink's nexmark SQL (see docs/benchmarks.md, "Nexmark"), with these
choices where a stream API has to pick:

- q3 is an incremental join (unbounded keyed state, as Flink's regular join); its
  inputs never update, so its output is append-only: (name, city, state, auction id).
- q4 emits an auction's winning bid when event time passes the auction's ``expires``
  (every bid that can win has ``date_time <= expires``, so with no late data the result
  equals Flink's incremental join), then a running average per category. Rows are
  ``(category, average, auctions so far)``: the count makes the last value of a
  category the one with the largest count, whatever order a sink writes them in.
  Averages are integer (``sum // count``), as Flink's ``AVG`` of a ``BIGINT``.
- q5 rows are (window start, auction, bids): every auction with the most bids of its
  10 s window sliding by 2 s.
- q7 rows are (auction, price, bidder, date_time, extra): the highest bids of each 10 s
  tumbling window (all of them on a tie).
- q8 rows are (person id, name, window start).
- q11 rows are (bidder, bids, session start, session end); sessions close after 10 s
  without a bid; records exactly 10 s apart share a session (windows that touch merge).
- q12 rows are (bidder, bids, window start, window end) per 10 s window of processing
  time. A bounded input ends before its last windows' ends, so the trigger also fires
  them at the end of input (the end-of-input watermark), which Flink's does not.

The same queries on the columnar path (Arrow batches) are in ``columnar.py``.

Example::

    env = es.Environment(parallelism=2)
    streams = NexmarkStreams.generated(env, es.sources.nexmark.NexmarkConfig(events=1_000_000))
    q7(streams).sink_to(es.sinks.DiscardSink())
    env.execute("nexmark-q7")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import epochstream as es

from .streams import NexmarkStreams

__all__ = [
    "QUERIES",
    "q0",
    "q1",
    "q2",
    "q3",
    "q4",
    "q5",
    "q7",
    "q8",
    "q11",
    "q12",
]

WINDOW_MS = 10_000
SLIDE_MS = 2_000
Q3_STATES = frozenset({"OR", "ID", "CA"})
Q3_CATEGORY = 10


# ------------------------------------------------------------------ q0, q1, q2


def _q0_row(b: dict[str, Any]) -> tuple[Any, ...]:
    return (b["auction"], b["bidder"], b["price"], b["date_time"], b["extra"])


def q0(streams: NexmarkStreams) -> es.DataStream:
    """Pass-through: (auction, bidder, price, date_time, extra) of every bid."""
    return streams.of("bid").map(_q0_row).uid("q0")


def _q1_row(b: dict[str, Any]) -> tuple[Any, ...]:
    return (b["auction"], b["bidder"], int(0.908 * b["price"]), b["date_time"], b["extra"])


def q1(streams: NexmarkStreams) -> es.DataStream:
    """Currency conversion: the price in euros, ``CAST(0.908 * price AS BIGINT)`` (truncated)."""
    return streams.of("bid").map(_q1_row).uid("q1")


def _q2_keep(b: dict[str, Any]) -> bool:
    return b["auction"] % 123 == 0


def _q2_row(b: dict[str, Any]) -> tuple[int, int]:
    return (b["auction"], b["price"])


def q2(streams: NexmarkStreams) -> es.DataStream:
    """Selection: (auction, price) of the bids on auctions whose id is a multiple of 123."""
    return streams.of("bid").filter(_q2_keep).map(_q2_row).uid("q2")


# ------------------------------------------------------------------ q3


def _q3_auction(e: dict[str, Any]) -> bool:
    return e["category"] == Q3_CATEGORY


def _q3_person(e: dict[str, Any]) -> bool:
    return e["state"] in Q3_STATES


def _seller(a: dict[str, Any]) -> int:
    return a["seller"]


def _id(p: dict[str, Any]) -> int:
    return p["id"]


class _Q3Join(es.KeyedCoProcessFunction):
    """Key: person id. Auctions wait for their seller; the seller's row is kept forever."""

    def open(self, ctx: Any) -> None:
        self.person = ctx.get_state(es.state.ValueStateDescriptor("person"))
        self.waiting = ctx.get_state(es.state.ListStateDescriptor("auctions"))

    def process_element1(self, auction: Any, ctx: Any, out: Any) -> None:
        person = self.person.value()
        if person is None:
            self.waiting.add(auction["id"])
        else:
            out.collect((*person, auction["id"]))

    def process_element2(self, p: Any, ctx: Any, out: Any) -> None:
        person = (p["name"], p["city"], p["state"])
        self.person.update(person)
        for auction_id in self.waiting.get():
            out.collect((*person, auction_id))
        self.waiting.clear()


def q3(streams: NexmarkStreams) -> es.DataStream:
    """Local item suggestion: (name, city, state, auction id) of category-10 auctions by
    sellers in OR, ID or CA."""
    auctions = streams.of("auction").filter(_q3_auction).key_by(_seller)
    persons = streams.of("person").filter(_q3_person).key_by(_id)
    return auctions.connect(persons).process(_Q3Join()).uid("q3-join")


# ------------------------------------------------------------------ q4


def _auction_id(b: dict[str, Any]) -> int:
    return b["auction"]


class _WinningBid(es.KeyedCoProcessFunction):
    """Key: auction id. Input 1 auctions, input 2 bids; emits (auction, category, price)
    of the winning bid when event time passes the auction's ``expires``.

    Bids may come before their auction (ids run up to 10 ahead, and the stream is out
    of order): they wait, with a timer at their own time; once event time passes it
    without the auction, the auction cannot be earlier than the bid, so they are dropped.
    """

    def open(self, ctx: Any) -> None:
        self.auction = ctx.get_state(es.state.ValueStateDescriptor("auction"))
        self.best = ctx.get_state(es.state.ValueStateDescriptor("best"))
        self.waiting = ctx.get_state(es.state.ListStateDescriptor("waiting"))

    def _offer(self, auction: tuple[int, int, int], price: int, at: int) -> None:
        _, start, expires = auction
        if start <= at <= expires:
            best = self.best.value()
            if best is None or price > best:
                self.best.update(price)

    def process_element1(self, a: Any, ctx: Any, out: Any) -> None:
        auction = (a["category"], a["date_time"], a["expires"])
        self.auction.update(auction)
        for price, at in self.waiting.get():
            self._offer(auction, price, at)
        self.waiting.clear()
        ctx.timer_service().register_event_time_timer(a["expires"])

    def process_element2(self, b: Any, ctx: Any, out: Any) -> None:
        auction = self.auction.value()
        if auction is None:
            self.waiting.add((b["price"], b["date_time"]))
            ctx.timer_service().register_event_time_timer(b["date_time"])
        else:
            self._offer(auction, b["price"], b["date_time"])

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        auction = self.auction.value()
        if auction is None:
            self.waiting.update([w for w in self.waiting.get() if w[1] > timestamp])
            return
        if timestamp == auction[2]:
            best = self.best.value()
            if best is not None:
                out.collect((ctx.current_key, auction[0], best))
            self.auction.clear()
            self.best.clear()
            self.waiting.clear()


class _CategoryAverage(es.KeyedProcessFunction):
    """Key: category. Running integer average of the winning prices."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(es.state.ValueStateDescriptor("total", default=(0, 0)))

    def process_element(self, winner: Any, ctx: Any, out: Any) -> None:
        total, count = self.total.value()
        total, count = total + winner[2], count + 1
        self.total.update((total, count))
        out.collect((ctx.current_key, total // count, count))


def _category(w: tuple[int, int, int]) -> int:
    return w[1]


def q4(streams: NexmarkStreams) -> es.DataStream:
    """Average winning price per category: (category, average, auctions so far)."""
    auctions = streams.of("auction").key_by(_id)
    bids = streams.of("bid").key_by(_auction_id)
    winners = auctions.connect(bids).process(_WinningBid()).uid("q4-winning-bids")
    return winners.key_by(_category).process(_CategoryAverage()).uid("q4-average")


# ------------------------------------------------------------------ q5


class _Count(es.AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


class _WindowCount(es.ProcessWindowFunction):
    """(window start, key, count)."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for count in elements:
            out.collect((ctx.window.start, key, count))


def _window_start(r: tuple[Any, ...]) -> int:
    return r[0]


class _MostBids(es.ProcessWindowFunction):
    """Every (window start, auction, count) of a window with the largest count."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        rows = list(elements)
        most = max(r[2] for r in rows)
        for r in rows:
            if r[2] == most:
                out.collect(r)


def q5(streams: NexmarkStreams) -> es.DataStream:
    """Hot items: (window start, auction, bids) of the auctions with the most bids per
    10 s window sliding by 2 s."""
    counts = (
        streams.of("bid")
        .key_by(_auction_id)
        .window(es.SlidingEventTimeWindows.of(WINDOW_MS, SLIDE_MS))
        .aggregate(_Count(), _WindowCount())
        .uid("q5-counts")
    )
    # A count's timestamp is its window's last ms: the 2 s tumbling window holding it
    # holds exactly the counts of that one sliding window.
    return (
        counts.key_by(_window_start)
        .window(es.TumblingEventTimeWindows.of(SLIDE_MS))
        .process(_MostBids())
        .uid("q5-max")
    )


# ------------------------------------------------------------------ q7


def _q7_top(b: dict[str, Any]) -> tuple[int, list[tuple[Any, ...]]]:
    return (b["price"], [(b["auction"], b["price"], b["bidder"], b["date_time"], b["extra"])])


def _higher(a: tuple[int, list[Any]], b: tuple[int, list[Any]]) -> tuple[int, list[Any]]:
    if a[0] == b[0]:
        return (a[0], a[1] + b[1])
    return a if a[0] > b[0] else b


class _WithWindowStart(es.ProcessWindowFunction):
    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for top in elements:
            out.collect((ctx.window.start, *top))


def _drop_window(r: tuple[int, int, list[Any]]) -> tuple[int, list[Any]]:
    return (r[1], r[2])


def _top_bids(r: tuple[int, int, list[Any]]) -> list[tuple[Any, ...]]:
    return r[2]


def q7(streams: NexmarkStreams) -> es.DataStream:
    """Highest bid: (auction, price, bidder, date_time, extra) of the highest bids of
    each 10 s tumbling window; per auction first, then per window."""
    window = es.TumblingEventTimeWindows.of(WINDOW_MS)
    per_auction = (
        streams.of("bid")
        .map(_q7_top)
        .key_by(_auction_of_top)
        .window(window)
        .reduce(_higher, _WithWindowStart())
        .uid("q7-per-auction")
    )
    return (
        per_auction.key_by(_window_start)
        .window(window)
        .reduce(_higher_with_start, _KeepTop())
        .uid("q7-per-window")
        .flat_map(_top_bids)
    )


def _auction_of_top(t: tuple[int, list[tuple[Any, ...]]]) -> int:
    return t[1][0][0]


def _higher_with_start(
    a: tuple[int, int, list[Any]], b: tuple[int, int, list[Any]]
) -> tuple[Any, ...]:
    price, bids = _higher(_drop_window(a), _drop_window(b))
    return (a[0], price, bids)


class _KeepTop(es.ProcessWindowFunction):
    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for top in elements:
            out.collect(top)


# ------------------------------------------------------------------ q8


def _q8_person(p: dict[str, Any]) -> tuple[int, int, str]:
    return (0, p["id"], p["name"])


def _q8_auction(a: dict[str, Any]) -> tuple[int, int, str]:
    return (1, a["seller"], "")


def _person_key(r: tuple[int, int, str]) -> int:
    return r[1]


class _PersonAndAuction(es.AggregateFunction):
    """(name or None, whether an auction was opened) per person and window."""

    def create_accumulator(self) -> tuple[str | None, bool]:
        return (None, False)

    def add(self, value: Any, accumulator: Any) -> Any:
        name, opened = accumulator
        if value[0] == 0:
            return (value[2], opened)
        return (name, True)

    def get_result(self, accumulator: Any) -> Any:
        return accumulator

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] if a[0] is not None else b[0], a[1] or b[1])


class _NewSellers(es.ProcessWindowFunction):
    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for name, opened in elements:
            if name is not None and opened:
                out.collect((key, name, ctx.window.start))


def q8(streams: NexmarkStreams) -> es.DataStream:
    """New users: (id, name, window start) of persons who registered and opened an
    auction in the same 10 s tumbling window."""
    persons = streams.of("person").map(_q8_person)
    sellers = streams.of("auction").map(_q8_auction)
    return (
        persons.union(sellers)
        .key_by(_person_key)
        .window(es.TumblingEventTimeWindows.of(WINDOW_MS))
        .aggregate(_PersonAndAuction(), _NewSellers())
        .uid("q8")
    )


# ------------------------------------------------------------------ q11, q12


def _bidder(b: dict[str, Any]) -> int:
    return b["bidder"]


class _BidderWindow(es.ProcessWindowFunction):
    """(bidder, bids, window start, window end)."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for count in elements:
            out.collect((key, count, ctx.window.start, ctx.window.end))


def q11(streams: NexmarkStreams) -> es.DataStream:
    """User sessions: (bidder, bids, start, end) per session with a 10 s gap."""
    return (
        streams.of("bid")
        .key_by(_bidder)
        .window(es.EventTimeSessionWindows.with_gap(WINDOW_MS))
        .aggregate(_Count(), _BidderWindow())
        .uid("q11")
    )


class ProcessingTimeOrEndOfInput(es.Trigger):
    """Fires a processing-time window when the clock passes its end, or at the end of a
    bounded input (the final watermark), whichever comes first; then purges it.

    Example: ``.window(es.TumblingProcessingTimeWindows.of(10_000)).trigger(ProcessingTimeOrEndOfInput())``
    """

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: Any
    ) -> es.TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp())
        ctx.register_event_time_timer(es.WatermarkGenerator.MAX_WATERMARK)
        return es.TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Any) -> es.TriggerResult:
        return es.TriggerResult.FIRE_AND_PURGE

    def on_event_time(self, time: int, window: Any, ctx: Any) -> es.TriggerResult:
        return (
            es.TriggerResult.FIRE_AND_PURGE
            if time == es.WatermarkGenerator.MAX_WATERMARK
            else es.TriggerResult.CONTINUE
        )

    def clear(self, window: Any, ctx: Any) -> None:
        ctx.delete_processing_time_timer(window.max_timestamp())
        ctx.delete_event_time_timer(es.WatermarkGenerator.MAX_WATERMARK)


def q12(streams: NexmarkStreams) -> es.DataStream:
    """Processing-time windows: (bidder, bids, window start, window end) per 10 s window
    of the job's clock."""
    return (
        streams.of("bid")
        .key_by(_bidder)
        .window(es.TumblingProcessingTimeWindows.of(WINDOW_MS))
        .trigger(ProcessingTimeOrEndOfInput())
        .aggregate(_Count(), _BidderWindow())
        .uid("q12")
    )


QUERIES: dict[str, Callable[[NexmarkStreams], es.DataStream]] = {
    "q0": q0,
    "q1": q1,
    "q2": q2,
    "q3": q3,
    "q4": q4,
    "q5": q5,
    "q7": q7,
    "q8": q8,
    "q11": q11,
    "q12": q12,
}
