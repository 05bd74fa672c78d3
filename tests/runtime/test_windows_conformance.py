"""Window behaviour checked against Flink's (issue 21, section 5): the same programs,
the firing and output sequences Flink's documented semantics give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from window_support import Rig, feed

import epochstream as es


@pytest.fixture(params=["heap", "rocksdb"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Rig:
    return Rig(request.param, tmp_path)


def fire_times(op: Any, out: Any, watermarks: range) -> list[tuple[int, Any]]:
    """``(watermark, outputs)`` for each watermark of ``watermarks`` that fired something."""
    fired = []
    for wm in watermarks:
        op.process_watermark(wm)
        records = out.take()
        if records:
            fired.append((wm, records))
    return fired


# ---------------------------------------------------------------- ContinuousEventTimeTrigger


def test_continuous_event_time_trigger_stops_at_the_window_end_despite_lateness(rig: Rig) -> None:
    """Flink clamps the next firing to min(time + interval, window.max_timestamp()): a
    10 ms window, interval 4, lateness 5, one record at 1 fires at 4, 8 and 9, not 12."""
    op, out, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(10))
        .allowed_lateness(5)
        .trigger(es.ContinuousEventTimeTrigger.of(4))
        .sum(1)
    )
    feed(op, (("a", 1), 1))
    assert fire_times(op, out, range(1, 20)) == [(4, [("a", 1)]), (8, [("a", 1)]), (9, [("a", 1)])]
    assert op.timers is not None and op.timers.pending() == 0


def test_continuous_event_time_trigger_first_firing_is_clamped_too(rig: Rig) -> None:
    """A record whose next interval boundary lies past the window fires at the window's end."""
    op, out, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(10))
        .allowed_lateness(10)
        .trigger(es.ContinuousEventTimeTrigger.of(8))
        .sum(1)
    )
    feed(op, (("a", 1), 9))
    assert fire_times(op, out, range(1, 25)) == [(9, [("a", 1)])], "not again at 16"


def test_continuous_event_time_trigger_late_record_fires_once(rig: Rig) -> None:
    op, out, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(10))
        .allowed_lateness(5)
        .trigger(es.ContinuousEventTimeTrigger.of(4))
        .sum(1)
    )
    feed(op, (("a", 1), 1))
    assert [wm for wm, _ in fire_times(op, out, range(1, 11))] == [4, 8, 9]
    feed(op, (("a", 2), 3))  # late, within the lateness
    assert out.take() == [("a", 3)]
    assert fire_times(op, out, range(11, 20)) == []


# ---------------------------------------------------------------- window offsets


def test_negative_tumbling_offsets_shift_the_windows_back(rig: Rig) -> None:
    """Flink accepts any |offset| < size: -3 on 10 ms windows gives [-3, 7), [7, 17)..."""

    class Bounds(es.ProcessWindowFunction):
        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            out.collect((ctx.window.start, ctx.window.end, sorted(v for _, v in elements)))

    op, out, _ = rig.operator(lambda k: k.window(es.TumblingEventTimeWindows.of(10, -3)).process(Bounds()))
    feed(op, (("a", 0), 0), (("a", 6), 6), (("a", 7), 7), (("a", -3), -3), (("a", -4), -4))
    op.process_watermark(es.MAX_WATERMARK)
    assert out.take() == [(-13, -3, [-4]), (-3, 7, [-3, 0, 6]), (7, 17, [7])]


def test_negative_offsets_of_every_fixed_assigner_match_flink() -> None:
    """start = t - (t - offset) mod size (Flink's TimeWindow.getWindowStartWithOffset)."""
    day, hour = 86_400_000, 3_600_000
    t = 5 * day + 20 * hour  # 20:00 UTC: already the next day in UTC+8
    for assigner in (
        es.TumblingEventTimeWindows.of(day, -8 * hour),
        es.TumblingProcessingTimeWindows.of(day, -8 * hour),
    ):
        assert assigner.assign_windows(None, t, t) == [es.TimeWindow(5 * day + 16 * hour, 6 * day + 16 * hour)]
    for sliding in (es.SlidingEventTimeWindows.of(10, 5, -3), es.SlidingProcessingTimeWindows.of(10, 5, -3)):
        assert sorted(sliding.assign_windows(None, 0, 0)) == [es.TimeWindow(-8, 2), es.TimeWindow(-3, 7)]
    from datetime import timedelta

    tumbling = es.TumblingEventTimeWindows.of(timedelta(days=1), timedelta(hours=-8))
    assert tumbling.assign_windows(None, t, 0) == [es.TimeWindow(5 * day + 16 * hour, 6 * day + 16 * hour)]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: es.TumblingEventTimeWindows.of(10, 10), r"TumblingEventTimeWindows needs abs\(offset\) < size"),
        (lambda: es.TumblingEventTimeWindows.of(10, -10), r"abs\(offset\) < size: got offset -10 ms, size 10 ms"),
        (lambda: es.TumblingProcessingTimeWindows.of(10, 25), r"TumblingProcessingTimeWindows needs abs\(offset\)"),
        (lambda: es.SlidingEventTimeWindows.of(10, 5, 5), r"SlidingEventTimeWindows needs abs\(offset\) < slide"),
        (lambda: es.SlidingProcessingTimeWindows.of(10, 5, -7), r"abs\(offset\) < slide: got offset -7 ms"),
    ],
)
def test_offsets_at_or_beyond_the_size_are_refused(make: Any, message: str) -> None:
    with pytest.raises(es.ConfigurationError, match=message):
        make()
