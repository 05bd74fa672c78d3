"""Watermarks: the task's input valve, and generation at sources and timestamp assigners."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import epochstream as es
from epochstream.core.events import MAX_WATERMARK, MIN_WATERMARK
from epochstream.core.watermarks import BoundedOutOfOrdernessWatermarks
from epochstream.runtime.watermarks import TimestampsAndWatermarks, WatermarkValve

# ---------------------------------------------------------------- the input valve


def test_the_valve_forwards_the_minimum_over_channels_only_when_it_advances() -> None:
    valve = WatermarkValve(3)
    assert valve.on_watermark(0, 100) == (None, None)
    assert valve.on_watermark(1, 50) == (None, None)
    assert valve.on_watermark(2, 70) == (50, None)
    assert valve.on_watermark(1, 60) == (60, None)
    assert valve.on_watermark(1, 40) == (None, None), "a channel's watermark never goes back"
    assert valve.on_watermark(1, 200) == (70, None)
    assert valve.current == 70


def test_idle_channels_do_not_hold_the_watermark_back() -> None:
    valve = WatermarkValve(2)
    valve.on_watermark(0, 500)
    assert valve.on_status(1, True) == (500, None), "the idle channel stops holding it back"
    assert valve.on_status(0, True) == (None, True), "all idle: the task is idle"
    assert valve.on_watermark(0, 600) == (600, False), "a watermark makes its channel active"
    assert valve.on_status(1, False) == (None, None)
    assert valve.on_watermark(1, 700) == (None, None)
    assert valve.on_watermark(0, 800) == (700, None)


def test_ended_channels_leave_and_all_ended_means_the_end_of_time() -> None:
    valve = WatermarkValve(2)
    valve.on_watermark(0, 10)
    assert valve.on_end(1) == 10
    assert valve.on_end(0) == MAX_WATERMARK


# ---------------------------------------------------------------- generation


class Emitted:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def records(self, records: list[Any], timestamps: list[Any]) -> None:
        self.items.append(("records", list(records), list(timestamps)))

    def watermark(self, mark: int) -> None:
        self.items.append(("watermark", mark))

    def status(self, idle: bool) -> None:
        self.items.append(("idle" if idle else "active",))


def _tw(
    strategy: es.WatermarkStrategy, now: list[int], interval: int = 0
) -> tuple[TimestampsAndWatermarks, Emitted]:
    out = Emitted()
    tw = TimestampsAndWatermarks(
        strategy,
        "test",
        out.records,
        out.watermark,
        out.status,
        now_ms=lambda: now[0],
        interval_ms=interval,
    )
    return tw, out


BOUNDED = es.WatermarkStrategy.bounded_out_of_orderness(
    timedelta(milliseconds=10)
).with_timestamp_assigner(lambda r, ts: r)


def test_a_late_record_gets_the_watermark_sent_ahead_of_it() -> None:
    now = [0]
    tw, out = _tw(BOUNDED, now, interval=1_000_000)  # no periodic watermarks
    tw.add_split("s")
    tw.process("s", [100, 105, 120, 95, 108, 130], None)
    # 95 <= 120 - 11: late for the watermark reached before it (109): that goes first.
    assert out.items == [
        ("records", [100, 105, 120], [100, 105, 120]),
        ("watermark", 109),
        ("records", [95, 108, 130], [95, 108, 130]),
    ]


def test_periodic_watermarks_and_the_minimum_over_splits() -> None:
    now = [0]
    tw, out = _tw(BOUNDED, now, interval=200)
    tw.add_split("a")
    tw.add_split("b")
    now[0] = 250
    tw.process("a", [1000], None)
    assert ("watermark", 989) not in out.items, "split b has no records yet: it holds it back"
    now[0] = 500
    tw.process("b", [500], None)
    assert out.items[-1] == ("watermark", 489)
    tw.finish_split("b")
    now[0] = 700
    tw.on_processing_time(700)
    assert out.items[-1] == ("watermark", 989), "a finished split no longer holds it back"
    tw.end_of_input()
    assert out.items[-1] == ("watermark", MAX_WATERMARK)


def test_idle_splits_stop_holding_the_watermark_back() -> None:
    now = [0]
    strategy = BOUNDED.with_idleness(timedelta(seconds=1))
    tw, out = _tw(strategy, now, interval=0)
    tw.add_split("busy")
    tw.add_split("quiet")
    tw.process("busy", [5000], None)
    tw.process("quiet", [100], None)
    assert out.items[-1] == ("watermark", 89)
    now[0] = 800
    tw.process("busy", [6000], None)
    now[0] = 1200
    tw.on_processing_time(1200)  # quiet: idle (no record for 1 s); busy: active
    assert out.items[-1] == ("watermark", 5989)
    now[0] = 2500
    tw.on_processing_time(2500)
    assert out.items[-1] == ("idle",), "every split idle: the subtask is idle"
    tw.process("quiet", [7000], None)
    assert ("active",) in out.items


def test_timestamps_must_be_int_milliseconds_and_errors_name_the_record() -> None:
    tw, _ = _tw(
        es.WatermarkStrategy.monotonous_timestamps().with_timestamp_assigner(lambda r: r["t"]), [0]
    )
    tw.add_split("s")
    with pytest.raises(es.DataError, match=r"record \{'t': 1.5\}.*int milliseconds"):
        tw.process("s", [{"t": 1}, {"t": 1.5}], None)
    with pytest.raises(es.UserFunctionError, match="timestamp assigner"):
        tw.process("s", [{"x": 1}], None)
    no_assigner, _ = _tw(es.WatermarkStrategy.monotonous_timestamps(), [0])
    with pytest.raises(es.DataError, match="no timestamp assigner"):
        no_assigner.process("s", [1], None)


def test_a_subtask_without_splits_goes_idle() -> None:
    tw, out = _tw(BOUNDED, [0])
    tw.on_processing_time(0)
    assert out.items == [("idle",)]


def test_generators() -> None:
    g = BoundedOutOfOrdernessWatermarks(3000)
    assert g.current_watermark() == MIN_WATERMARK
    g.on_event(None, 10_000)
    assert g.current_watermark() == 6_999
    assert (
        es.WatermarkStrategy.no_watermarks().create_generator().current_watermark() == MIN_WATERMARK
    )

    class EveryTen(es.WatermarkGenerator):
        def __init__(self) -> None:
            self.max = MIN_WATERMARK

        def on_event(self, event: Any, timestamp: int) -> None:
            self.max = max(self.max, timestamp)

        def current_watermark(self) -> int:
            return self.max // 10 * 10 - 1

    custom = es.WatermarkStrategy.for_generator(EveryTen).create_generator()
    assert custom.on_batch([None] * 3, [15, 25, 5]) == [(2, 19)]
    with pytest.raises(es.ConfigurationError, match="idleness timeout must be > 0"):
        BOUNDED.with_idleness(0)
