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
