"""The window operator driven directly: timestamps in, watermarks advanced by hand,
real keyed-state backends (heap and RocksDB), snapshots and restores."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from window_support import LATE, Rig, feed, first

import epochstream as es
from epochstream.api.windowed import WindowedStream


@pytest.fixture(params=["heap", "rocksdb"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Rig:
    return Rig(request.param, tmp_path)


# ---------------------------------------------------------------- tumbling, lateness


def test_tumbling_windows_fire_when_the_watermark_passes_their_end(rig: Rig) -> None:
    op, out, _ = rig.operator(lambda k: k.window(es.TumblingEventTimeWindows.of(1000)).sum(1))
    feed(op, (("a", 1), 100), (("b", 1), 200), (("a", 1), 999), (("a", 1), 1000))
    op.process_watermark(998)
    assert out.take() == []
    op.process_watermark(999)
    assert sorted(out.records) == [("a", 2), ("b", 1)]
    assert out.timestamps == [999, 999], "window results carry the window's max timestamp"
    out.take()
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take() == [("a", 1)]
    assert op.timers is not None and op.timers.pending() == 0, "state and timers cleaned up"


def test_late_records_go_to_the_side_output_and_lateness_refires(rig: Rig) -> None:
    op, out, late = rig.operator(
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(1000))
            .allowed_lateness(500)
            .side_output_late_data(LATE)
            .sum(1)
        )
    )
    feed(op, (("a", 1), 10))
    op.process_watermark(1200)
    assert out.take() == [("a", 1)]
    feed(op, (("a", 5), 20))  # late but within the allowed lateness: fires again
    assert out.take() == [("a", 6)]
    op.process_watermark(1499)  # cleanup time: window end - 1 + lateness
    feed(op, (("a", 7), 30))  # too late for every window it belongs to
    assert out.take() == []
    assert late.records == [("a", 7)] and late.timestamps == [30]
    assert op.counters.late_records_dropped == 0, "the side output took it"


def test_late_records_without_a_side_output_are_dropped_and_counted(rig: Rig) -> None:
    op, out, _ = rig.operator(lambda k: k.window(es.TumblingEventTimeWindows.of(1000)).sum(1))
    feed(op, (("a", 1), 10))
    op.process_watermark(1200)
    assert out.take() == [("a", 1)]
    feed(op, (("a", 5), 20), (("b", 2), 30), (("a", 3), 1300))
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take() == [("a", 3)]
    assert op.counters.late_records_dropped == 2


def test_sliding_windows_give_each_record_to_size_over_slide_windows(rig: Rig) -> None:
    op, out, _ = rig.operator(lambda k: k.window(es.SlidingEventTimeWindows.of(1000, 500)).count())
    feed(op, (("a", 0), 0), (("a", 0), 600), (("a", 0), 1100))
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    by_time = sorted(zip(out.timestamps, out.records, strict=True))
    # windows [-500,500) [0,1000) [500,1500) [1000,2000)
    assert by_time == [(499, ("a", 1)), (999, ("a", 2)), (1499, ("a", 2)), (1999, ("a", 1))]


def test_process_window_function_sees_all_elements_and_the_window(rig: Rig) -> None:
    class Describe(es.ProcessWindowFunction):
        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            out.collect((key, ctx.window.start, ctx.window.end, sorted(v for _, v in elements)))

    op, out, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(100)).process(Describe())
    )
    feed(op, (("k", 3), 5), (("k", 1), 50), (("k", 2), 150))
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.records == [("k", 0, 100, [1, 3]), ("k", 100, 200, [2])]


def test_aggregate_with_a_window_function(rig: Rig) -> None:
    class Mean(es.AggregateFunction):
        def create_accumulator(self) -> tuple[int, int]:
            return (0, 0)

        def add(self, value: Any, acc: tuple[int, int]) -> tuple[int, int]:
            return (acc[0] + value[1], acc[1] + 1)

        def get_result(self, acc: tuple[int, int]) -> float:
            return acc[0] / acc[1]

        def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
            return (a[0] + b[0], a[1] + b[1])

    class Label(es.ProcessWindowFunction):
        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            (mean,) = elements
            out.collect((key, ctx.window.end, mean))

    op, out, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(10)).aggregate(Mean(), Label())
    )
    feed(op, (("x", 2), 1), (("x", 4), 2), (("y", 9), 3))
    op.process_watermark(9)
    assert sorted(out.records) == [("x", 10, 3.0), ("y", 10, 9.0)]


# ---------------------------------------------------------------- sessions


def test_session_windows_merge_when_a_record_bridges_them(rig: Rig) -> None:
    op, out, _ = rig.operator(lambda k: k.window(es.EventTimeSessionWindows.with_gap(100)).sum(1))
    feed(op, (("s", 1), 0), (("s", 2), 300))  # two sessions: [0,100) [300,400)
    op.process_watermark(98)
    assert out.take() == []
    feed(op, (("s", 4), 90), (("s", 8), 180), (("s", 16), 270))  # bridge them: [0,400)
    op.process_watermark(398)
    assert out.take() == []
    op.process_watermark(399)
    assert out.take() == [("s", 31)]
    assert out.timestamps == [] and op.timers is not None and op.timers.pending() == 0
    feed(op, (("s", 32), 1000))
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take() == [("s", 32)]


def test_session_windows_that_touch_merge_as_in_flink(rig: Rig) -> None:
    """A record exactly one gap after another continues its session: [0,100) and
    [100,200) touch, and Flink's TimeWindow.intersects merges touching windows."""
    op, out, _ = rig.operator(
        lambda k: k.window(es.EventTimeSessionWindows.with_gap(100)).process(_Bounds())
    )
    feed(op, (("s", 1), 100), (("s", 2), 0), (("s", 4), 201))
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take() == [("s", 0, 200, 3), ("s", 201, 301, 4)]


class _Bounds(es.ProcessWindowFunction):
    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        out.collect((key, ctx.window.start, ctx.window.end, sum(v for _, v in elements)))


def test_sessions_survive_a_snapshot_and_keep_merging(rig: Rig) -> None:
    op, _, _ = rig.operator(lambda k: k.window(es.EventTimeSessionWindows.with_gap(100)).sum(1))
    feed(op, (("s", 1), 0), (("s", 2), 300), (("t", 5), 10))
    handle = rig.snapshot(op, 1)
    again, out, _ = rig.operator(
        lambda k: k.window(es.EventTimeSessionWindows.with_gap(100)).sum(1), restore=handle
    )
    feed(again, (("s", 4), 150), (("s", 8), 240))
    again.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert sorted(out.records) == [("s", 1), ("s", 14), ("t", 5)]


# ---------------------------------------------------------------- triggers


def test_count_window_fires_and_purges_every_n_records(rig: Rig) -> None:
    op, out, _ = rig.operator(lambda k: k.count_window(3).sum(1))
    feed(op, *[(("c", i), i) for i in range(1, 8)])
    assert out.take() == [("c", 6), ("c", 15)]
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take() == [], "a global window never fires by time"


def test_continuous_event_time_trigger_fires_every_interval(rig: Rig) -> None:
    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(1000))
            .trigger(es.ContinuousEventTimeTrigger.of(250))
            .sum(1)
        )
    )
    feed(op, (("a", 1), 10))
    op.process_watermark(250)
    assert out.take() == [("a", 1)]
    feed(op, (("a", 2), 300))
    op.process_watermark(999)
    assert out.take() == [("a", 3)] * 3, "at 500, 750 and the window's end (999)"


def test_processing_time_windows_follow_the_injected_clock(rig: Rig) -> None:
    op, out, _ = rig.operator(lambda k: k.window(es.TumblingProcessingTimeWindows.of(1000)).sum(1))
    rig.clock.advance(10.0)  # 10,000 ms
    feed(op, (("p", 1), 0), (("p", 2), 0))
    op.on_processing_time(10_998)
    assert out.take() == []
    op.on_processing_time(10_999)
    assert out.take() == [("p", 3)]
    assert op.next_processing_time() is None


# ---------------------------------------------------------------- snapshots, rescale


def test_open_windows_and_timers_restore_at_another_parallelism(rig: Rig) -> None:
    op, _, _ = rig.operator(lambda k: k.window(es.TumblingEventTimeWindows.of(100)).sum(1))
    keys = [f"k{i}" for i in range(30)]
    feed(op, *[((k, i), i) for i, k in enumerate(keys)])
    handle = rig.snapshot(op, 1)
    results = []
    for subtask in range(2):
        again, out, _ = rig.operator(
            lambda k: k.window(es.TumblingEventTimeWindows.of(100)).sum(1),
            parallelism=2,
            subtask=subtask,
            restore=handle,
        )
        again.process_watermark(99)
        results += out.records
    assert sorted(results) == sorted((k, i) for i, k in enumerate(keys))


def test_a_record_without_timestamp_in_an_event_time_window_is_a_clear_error(rig: Rig) -> None:
    op, _, _ = rig.operator(lambda k: k.window(es.TumblingEventTimeWindows.of(100)).sum(1))
    with pytest.raises(es.UserFunctionError, match="assign_timestamps_and_watermarks"):
        op.process_batch([("a", 1)], None)


def test_windowed_stream_refuses_bad_configuration() -> None:
    env = es.Environment(parallelism=1, runner="local")
    keyed = env.from_collection([]).key_by(first)
    with pytest.raises(es.ConfigurationError, match="window assigner"):
        keyed.window("5s")  # type: ignore[arg-type]
    sessions = keyed.window(es.EventTimeSessionWindows.with_gap(10))
    assert isinstance(sessions, WindowedStream)
    with pytest.raises(es.ConfigurationError, match="event-time windows only"):
        keyed.window(es.TumblingProcessingTimeWindows.of(10)).allowed_lateness(5)
    with pytest.raises(es.ConfigurationError, match=r"int milliseconds or a datetime\.timedelta"):
        es.TumblingEventTimeWindows.of(5.0)
    with pytest.raises(es.ConfigurationError, match=r"aggregate needs an es\.AggregateFunction"):
        keyed.window(es.TumblingEventTimeWindows.of(10)).aggregate(lambda a: a)  # type: ignore[arg-type]


def test_dynamic_session_gaps_come_from_each_record(rig: Rig) -> None:
    op, out, _ = rig.operator(
        lambda k: k.window(es.EventTimeSessionWindows.with_dynamic_gap(lambda r: r[1])).count()
    )
    # a gap of 50 after the first record does not reach 100; a gap of 500 after 100 does reach 400
    feed(op, (("g", 50), 0), (("g", 500), 100), (("g", 10), 400))
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert sorted(zip(out.timestamps, out.records, strict=True)) == [
        (49, ("g", 1)),
        (599, ("g", 2)),
    ]


def test_trigger_state_and_timers_are_per_window_and_key(rig: Rig) -> None:
    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(100)).trigger(es.CountTrigger.of(2)).count()
        )
    )
    feed(op, (("a", 0), 1), (("b", 0), 2), (("a", 0), 150), (("a", 0), 3))
    assert out.take() == [("a", 2)], "a's first window reached 2; its second has 1, b's has 1"
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take() == [], "a count trigger never fires by time, and the windows are cleaned up"
    assert op.timers is not None and op.timers.pending() == 0


@pytest.mark.parametrize("assigner", ["tumbling", "sliding"])
@pytest.mark.parametrize("how", ["sum", "aggregate"])
def test_inlined_event_time_path_matches_the_general_path(
    rig: Rig, assigner: str, how: str
) -> None:
    """Event-time windows with the default trigger take an inlined per-record path; it
    must emit exactly what the general (trigger-driven) path emits, late firings and
    late side output included, across a snapshot and restore."""

    class Sum(es.AggregateFunction):
        def create_accumulator(self) -> int:
            return 0

        def add(self, value: Any, acc: int) -> int:
            return acc + value[1]

        def get_result(self, acc: int) -> int:
            return acc

        def merge(self, a: int, b: int) -> int:
            return a + b

    def configure(k: Any) -> Any:
        w = (
            es.TumblingEventTimeWindows.of(100)
            if assigner == "tumbling"
            else (es.SlidingEventTimeWindows.of(100, 40))
        )
        windowed = k.window(w).allowed_lateness(60).side_output_late_data(LATE)
        return windowed.sum(1) if how == "sum" else windowed.aggregate(Sum())

    rng = random.Random(7)
    events = [
        ((f"k{rng.randrange(5)}", rng.randrange(1, 9)), t + rng.randrange(-400, 30))
        for t in range(0, 1500, 3)
    ]
    results = []
    for fast in (True, False):
        pending: list[int] = []  # timers after each watermark: the cleanup ones too
        op, out, late = rig.operator(configure)
        assert op._fast
        op._fast = fast
        for i in range(0, len(events), 25):
            feed(op, *events[i : i + 25])
            if i == 250:  # snapshot and carry on in a restored operator
                restored = rig.snapshot(op, 1 if fast else 2)
                op, _, _ = rig.operator(configure, restore=restored)
                op._fast = fast
                op.output, op.side_outputs[LATE.name] = out, late
            op.process_watermark(3 * i - 40)  # the i-th event's base time, 40 ms behind
            op.flush_timer_output()
            assert op.timers is not None
            pending.append(op.timers.pending())
        op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
        op.flush_timer_output()
        assert not list(op._table.items()), "every window's contents were cleaned up"
        results.append((out.records, out.timestamps, late.records, pending))
        assert late.records, "the input has records later than the allowed lateness"
    assert results[0] == results[1]


def test_fixed_assigners_give_exactly_the_windows_holding_a_timestamp() -> None:
    """Window lists are cached by aligned start; checked against every grid window."""
    rng = random.Random(3)
    for _ in range(200):
        size = rng.randrange(1, 120)
        slide = rng.randrange(1, size + 1)
        offset = rng.randrange(-slide + 1, slide)  # Flink takes any |offset| < slide (size)
        sliding = es.SlidingEventTimeWindows.of(size, slide, offset)
        tumbling = es.TumblingEventTimeWindows.of(size, offset)
        for _ in range(100):
            t = rng.randrange(-1000, 1000)
            for assigner, step in ((sliding, slide), (tumbling, size)):
                expected = sorted(
                    es.TimeWindow(s, s + size)
                    for s in range(t - size - step, t + 1)
                    if (s - offset) % step == 0 and s <= t < s + size
                )
                assert sorted(assigner.assign_windows(None, t, 0)) == expected, (
                    size,
                    step,
                    offset,
                    t,
                )


def test_window_operators_keep_at_most_30_instance_attributes(rig: Rig) -> None:
    """CPython 3.11 shares instance dict keys up to 30 names; past that every attribute
    read on the per-record path is slower (about a fifth, measured): new operator state
    belongs on helper objects."""
    for configure in (
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(10)).trigger(es.CountTrigger.of(2)).sum(1)
        ),
        lambda k: k.window(es.TumblingEventTimeWindows.of(10)).aggregate(_Sum(), _Pass()),
        lambda k: k.count_window(5, 2).process(_Pass()),
    ):
        op, _, _ = rig.operator(configure)
        feed(op, (("a", 1), 1))
        again, _, _ = rig.operator(configure, restore=rig.snapshot(op, rig.made))
        for operator in (op, again):
            assert len(vars(operator)) <= 30, sorted(vars(operator))


class _Sum(es.AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + value[1]

    def get_result(self, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


class _Pass(es.ProcessWindowFunction):
    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        out.collect(list(elements))
