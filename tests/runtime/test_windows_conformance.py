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
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(10))
            .allowed_lateness(5)
            .trigger(es.ContinuousEventTimeTrigger.of(4))
            .sum(1)
        )
    )
    feed(op, (("a", 1), 1))
    assert fire_times(op, out, range(1, 20)) == [(4, [("a", 1)]), (8, [("a", 1)]), (9, [("a", 1)])]
    assert op.timers is not None and op.timers.pending() == 0


def test_continuous_event_time_trigger_first_firing_is_clamped_too(rig: Rig) -> None:
    """A record whose next interval boundary lies past the window fires at the window's end."""
    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(10))
            .allowed_lateness(10)
            .trigger(es.ContinuousEventTimeTrigger.of(8))
            .sum(1)
        )
    )
    feed(op, (("a", 1), 9))
    assert fire_times(op, out, range(1, 25)) == [(9, [("a", 1)])], "not again at 16"


def test_continuous_event_time_trigger_late_record_fires_once(rig: Rig) -> None:
    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(10))
            .allowed_lateness(5)
            .trigger(es.ContinuousEventTimeTrigger.of(4))
            .sum(1)
        )
    )
    feed(op, (("a", 1), 1))
    assert [wm for wm, _ in fire_times(op, out, range(1, 11))] == [4, 8, 9]
    feed(op, (("a", 2), 3))  # late, within the lateness
    assert out.take() == [("a", 3)]
    assert fire_times(op, out, range(11, 20)) == []


def test_continuous_processing_time_trigger_fires_at_the_window_end_too(rig: Rig) -> None:
    """FLINK-20443: the last firing is clamped to the window's end, so records after the
    last full interval are emitted: a 10 ms window, interval 4, fires at 4, 8 and 9."""
    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.TumblingProcessingTimeWindows.of(10))
            .trigger(es.ContinuousProcessingTimeTrigger.of(4))
            .sum(1)
        )
    )
    rig.clock.advance(0.001)  # processing time 1 ms
    feed(op, (("p", 1), None))
    fired = []
    for now in range(2, 15):
        rig.clock.advance(0.001)
        if now == 9:
            feed(op, (("p", 2), None))  # after the last full interval, before the end
        op.on_processing_time(now)
        op.flush_timer_output()
        records = out.take()
        if records:
            fired.append((now, records))
    assert fired == [(4, [("p", 1)]), (8, [("p", 1)]), (9, [("p", 3)])]
    assert op.next_processing_time() is None


# ---------------------------------------------------------------- window offsets


def test_negative_tumbling_offsets_shift_the_windows_back(rig: Rig) -> None:
    """Flink accepts any |offset| < size: -3 on 10 ms windows gives [-3, 7), [7, 17)..."""

    class Bounds(es.ProcessWindowFunction):
        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            out.collect((ctx.window.start, ctx.window.end, sorted(v for _, v in elements)))

    op, out, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(10, -3)).process(Bounds())
    )
    feed(op, (("a", 0), 0), (("a", 6), 6), (("a", 7), 7), (("a", -3), -3), (("a", -4), -4))
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take() == [(-13, -3, [-4]), (-3, 7, [-3, 0, 6]), (7, 17, [7])]


def test_negative_offsets_of_every_fixed_assigner_match_flink() -> None:
    """start = t - (t - offset) mod size (Flink's TimeWindow.getWindowStartWithOffset)."""
    day, hour = 86_400_000, 3_600_000
    t = 5 * day + 20 * hour  # 20:00 UTC: already the next day in UTC+8
    for assigner in (
        es.TumblingEventTimeWindows.of(day, -8 * hour),
        es.TumblingProcessingTimeWindows.of(day, -8 * hour),
    ):
        assert assigner.assign_windows(None, t, t) == [
            es.TimeWindow(5 * day + 16 * hour, 6 * day + 16 * hour)
        ]
    for sliding in (
        es.SlidingEventTimeWindows.of(10, 5, -3),
        es.SlidingProcessingTimeWindows.of(10, 5, -3),
    ):
        assert sorted(sliding.assign_windows(None, 0, 0)) == [
            es.TimeWindow(-8, 2),
            es.TimeWindow(-3, 7),
        ]
    from datetime import timedelta

    tumbling = es.TumblingEventTimeWindows.of(timedelta(days=1), timedelta(hours=-8))
    assert tumbling.assign_windows(None, t, 0) == [
        es.TimeWindow(5 * day + 16 * hour, 6 * day + 16 * hour)
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: es.TumblingEventTimeWindows.of(10, 10),
            r"TumblingEventTimeWindows needs abs\(offset\) < size",
        ),
        (
            lambda: es.TumblingEventTimeWindows.of(10, -10),
            r"abs\(offset\) < size: got offset -10 ms, size 10 ms",
        ),
        (
            lambda: es.TumblingProcessingTimeWindows.of(10, 25),
            r"TumblingProcessingTimeWindows needs abs\(offset\)",
        ),
        (
            lambda: es.SlidingEventTimeWindows.of(10, 5, 5),
            r"SlidingEventTimeWindows needs abs\(offset\) < slide",
        ),
        (
            lambda: es.SlidingProcessingTimeWindows.of(10, 5, -7),
            r"abs\(offset\) < slide: got offset -7 ms",
        ),
    ],
)
def test_offsets_at_or_beyond_the_size_are_refused(make: Any, message: str) -> None:
    with pytest.raises(es.ConfigurationError, match=message):
        make()


# ---------------------------------------------------------------- evictors, count_window(size, slide)


class Values(es.ProcessWindowFunction):
    """The values (second fields) a firing saw."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        out.collect([v for _, v in elements])


def test_sliding_count_window_emits_the_last_size_records_every_slide(rig: Rig) -> None:
    """Flink's countWindow(5, 2): GlobalWindows, CountEvictor.of(5), CountTrigger.of(2)."""
    op, out, _ = rig.operator(lambda k: k.count_window(5, 2).sum(1))
    feed(op, *[(("c", i), i) for i in range(1, 11)])
    assert out.take() == [("c", 3), ("c", 10), ("c", 20), ("c", 30), ("c", 40)]
    op2, out2, _ = rig.operator(lambda k: k.count_window(5, 2).process(Values()))
    feed(op2, *[(("c", i), i) for i in range(1, 8)])
    assert out2.take() == [[1, 2], [1, 2, 3, 4], [2, 3, 4, 5, 6]]


def test_sliding_count_window_reduce_and_aggregate_fold_what_is_left(rig: Rig) -> None:
    class Mean(es.AggregateFunction):
        def create_accumulator(self) -> tuple[int, int]:
            return (0, 0)

        def add(self, value: Any, acc: tuple[int, int]) -> tuple[int, int]:
            return (acc[0] + value[1], acc[1] + 1)

        def get_result(self, acc: tuple[int, int]) -> float:
            return acc[0] / acc[1]

        def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
            return (a[0] + b[0], a[1] + b[1])

    class Keyed(es.ProcessWindowFunction):
        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            out.collect((key, *elements))

    op, out, _ = rig.operator(
        lambda k: k.count_window(3, 1).reduce(lambda a, b: (a[0], max(a[1], b[1])))
    )
    feed(op, *[(("m", v), i) for i, v in enumerate([5, 1, 2, 3, 0])])
    assert out.take() == [("m", 5), ("m", 5), ("m", 5), ("m", 3), ("m", 3)]
    op2, out2, _ = rig.operator(lambda k: k.count_window(2, 2).aggregate(Mean(), Keyed()))
    feed(op2, *[(("m", v), i) for i, v in enumerate([1, 3, 5, 9])])
    assert out2.take() == [("m", 2.0), ("m", 7.0)]


@pytest.mark.parametrize(
    ("after", "seen"),
    [(False, [[2, 3], [5, 6]]), (True, [[1, 2, 3], [2, 3, 4, 5, 6]])],
)
def test_count_evictor_before_or_after_the_function(
    rig: Rig, after: bool, seen: list[list[int]]
) -> None:
    """Before: the function sees the last 2; after: it sees all, then the window keeps 2."""
    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.GlobalWindows.create())
            .trigger(es.CountTrigger.of(3))
            .evictor(es.CountEvictor.of(2, do_evict_after=after))
            .process(Values())
        )
    )
    feed(op, *[(("c", i), i) for i in range(1, 7)])
    assert out.take() == seen


@pytest.mark.parametrize(
    ("after", "seen"),
    [(False, [[12, 20], [40]]), (True, [[0, 5, 12, 20], [12, 20, 21, 22, 23, 40]])],
)
def test_time_evictor_keeps_what_is_newer_than_the_newest_minus_its_size(
    rig: Rig, after: bool, seen: list[list[int]]
) -> None:
    """Flink's TimeEvictor: evict timestamp <= max timestamp - size (here 10)."""
    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.GlobalWindows.create())
            .trigger(es.CountTrigger.of(4))
            .evictor(es.TimeEvictor.of(10, do_evict_after=after))
            .process(Values())
        )
    )
    feed(op, *[(("t", ts), ts) for ts in (0, 5, 12, 20)])
    feed(op, *[(("t", ts), ts) for ts in (21, 22, 23, 40)])
    assert out.take() == seen


def test_time_evictor_on_an_event_time_window_with_reduce(rig: Rig) -> None:
    from datetime import timedelta

    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(100))
            .evictor(es.TimeEvictor.of(timedelta(milliseconds=40)))
            .sum(1)
        )
    )
    feed(op, (("a", 1), 10), (("a", 2), 50), (("a", 4), 95), (("b", 8), 30))
    op.process_watermark(99)
    assert sorted(out.take()) == [("a", 4), ("b", 8)], (
        "a's records at 10 and 50 are >= 40 ms older than 95"
    )


@pytest.mark.parametrize(("after", "seen"), [(False, [[10, 8, 9]]), (True, [[1, 10, 8, 9]])])
def test_delta_evictor_drops_elements_far_from_the_last_one(
    rig: Rig, after: bool, seen: list[list[int]]
) -> None:
    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.GlobalWindows.create())
            .trigger(es.CountTrigger.of(4))
            .evictor(es.DeltaEvictor.of(3.0, lambda a, b: abs(a[1] - b[1]), do_evict_after=after))
            .process(Values())
        )
    )
    feed(op, *[(("d", v), i) for i, v in enumerate([1, 10, 8, 9])])
    assert out.take() == seen
    feed(op, *[(("d", v), i) for i, v in enumerate([9, 9, 9, 9])])
    assert out.take() == [[10, 8, 9, 9, 9, 9, 9]], "the 1 was evicted at the first firing"


def test_a_user_evictor_sees_timestamped_values_the_window_and_the_key(rig: Rig) -> None:
    calls: list[Any] = []

    class Odd(es.Evictor):
        def evict_before(self, elements: Any, size: int, window: Any, ctx: Any) -> None:
            calls.append(
                (ctx.key, window, size, [tuple(e) for e in elements], ctx.current_watermark())
            )
            elements[:] = [e for e in elements if e.value[1] % 2]

    op, out, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(10)).evictor(Odd()).process(Values())
    )
    feed(op, (("u", 1), 1), (("u", 2), 2), (("u", 3), 3))
    op.process_watermark(9)
    assert out.take() == [[1, 3]]
    assert calls == [
        ("u", es.TimeWindow(0, 10), 3, [(("u", 1), 1), (("u", 2), 2), (("u", 3), 3)], 9)
    ]


def test_evicting_session_windows_keep_the_merged_elements(rig: Rig) -> None:
    class Sorted(es.ProcessWindowFunction):
        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            out.collect((ctx.window.start, ctx.window.end, sorted(v for _, v in elements)))

    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.EventTimeSessionWindows.with_gap(10))
            .evictor(es.TimeEvictor.of(12))
            .process(Sorted())
        )
    )
    feed(op, (("s", 0), 0), (("s", 30), 30), (("s", 5), 5), (("s", 8), 8), (("s", 20), 20))
    feed(op, (("s", 15), 15))  # bridges [0, 18) and [20, 40)
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take() == [(0, 40, [20, 30])], "one session; what is within 12 ms of its newest"


def test_evicted_windows_survive_a_snapshot_and_a_rescale(rig: Rig) -> None:
    """The elements (with their timestamps) are keyed state: restored at parallelism 2,
    each key's window goes on exactly as without the restore."""

    def configure(k: Any) -> Any:
        return (
            k.window(es.GlobalWindows.create())
            .trigger(es.CountTrigger.of(3))
            .evictor(es.TimeEvictor.of(10))
            .process(Values())
        )

    keys = [f"k{i}" for i in range(12)]
    first = [((k, ts), ts) for k in keys for ts in (0, 4)]
    second = [((k, ts), ts) for k in keys for ts in (12,)]
    op, out, _ = rig.operator(configure)
    feed(op, *first)
    feed(op, *second)
    expected = sorted(out.take())
    assert expected == [[4, 12]] * len(keys)
    op, _, _ = rig.operator(configure)
    feed(op, *first)
    handle = rig.snapshot(op, 1)
    results = []
    for subtask in range(2):
        again, out, _ = rig.operator(configure, parallelism=2, subtask=subtask, restore=handle)
        mine = [item for item in second if again.keyed is not None and _owns(again, item[0][0])]
        feed(again, *mine)
        results += out.take()
    assert sorted(results) == expected


def _owns(op: Any, key: Any) -> bool:
    from epochstream.state.keygroups import key_group_for_key

    return key_group_for_key(key, 128) in op.keyed.key_group_range


def test_evictor_and_count_window_configuration_errors() -> None:
    env = es.Environment(parallelism=1, runner="local")
    keyed = env.from_collection([]).key_by(lambda t: t[0])
    with pytest.raises(es.ConfigurationError, match=r"evictor\(\) needs an es\.Evictor"):
        keyed.window(es.GlobalWindows.create()).evictor(3)  # type: ignore[arg-type]
    with pytest.raises(es.ConfigurationError, match="CountEvictor needs a count >= 0"):
        es.CountEvictor.of(-1)
    with pytest.raises(es.ConfigurationError, match="count_window needs a size >= 1"):
        keyed.count_window(0, 2)
    with pytest.raises(es.ConfigurationError, match="CountTrigger needs a count >= 1"):
        keyed.count_window(5, 0)
    with pytest.raises(es.ConfigurationError, match="DeltaEvictor needs a callable"):
        es.DeltaEvictor.of(1.0, None)  # type: ignore[arg-type]


def test_sliding_count_window_in_a_local_job(tmp_path: Path) -> None:
    env = es.Environment(parallelism=1, runner="local")  # one source: records keep their order
    (
        env.from_collection([(k, i) for i in range(1, 11) for k in ("a", "b")])
        .key_by(lambda t: t[0])
        .count_window(4, 3)
        .sum(1)
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("sliding-count")
    rows = sorted(tuple(r) for r in es.testing.read_committed(tmp_path / "out"))
    assert rows == sorted([(k, s) for k in ("a", "b") for s in (6, 18, 30)])


# ---------------------------------------------------------------- per-window and global state


FIRINGS = es.state.ValueStateDescriptor("firings", default=0)
WINDOWS_SEEN = es.state.ValueStateDescriptor("windows-seen", default=0)


class CountFirings(es.ProcessWindowFunction):
    """Numbers each firing of a window (per-window state) and counts the key's windows
    as they are cleaned up (global state)."""

    def __init__(self) -> None:
        self.cleared: list[Any] = []

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        firings = ctx.window_state().get_state(FIRINGS)
        firings.update(firings.value() + 1)
        seen = ctx.global_state().get_state(WINDOWS_SEEN).value()
        out.collect((key, ctx.window.start, sum(v for _, v in elements), firings.value(), seen))

    def clear(self, ctx: Any) -> None:
        seen = ctx.global_state().get_state(WINDOWS_SEEN)
        seen.update(seen.value() + 1)
        self.cleared.append((ctx.window.start, ctx.window_state().get_state(FIRINGS).value()))


def _late_firings(k: Any) -> Any:
    return k.window(es.TumblingEventTimeWindows.of(10)).allowed_lateness(5).process(CountFirings())


def test_window_state_lives_across_late_firings_and_goes_at_cleanup(rig: Rig) -> None:
    op, out, _ = rig.operator(_late_firings)
    feed(op, (("a", 1), 1), (("b", 10), 2))
    op.process_watermark(9)
    assert sorted(out.take()) == [("a", 0, 1, 1, 0), ("b", 0, 10, 1, 0)]
    feed(op, (("a", 2), 3))  # late, within the lateness: the window's second firing
    feed(op, (("a", 4), 5))
    assert out.take() == [("a", 0, 3, 2, 0), ("a", 0, 7, 3, 0)]
    assert op.keyed is not None and len(op.keyed.keys("window-state")) == 2
    op.process_watermark(14)  # cleanup: clear(ctx) still sees the state, then it goes
    assert sorted(op.window_spec.function.cleared) == [(0, 1), (0, 3)]
    assert op.keyed.keys("window-state") == []
    feed(op, (("a", 8), 12))  # the key's next window: fresh per-window state, global kept
    op.process_watermark(19)
    assert out.take() == [("a", 10, 8, 1, 1)]


def test_window_state_survives_a_snapshot_and_a_rescale(rig: Rig) -> None:
    op, out, _ = rig.operator(_late_firings)
    keys = [f"k{i}" for i in range(10)]
    feed(op, *[((k, 1), 1) for k in keys])
    op.process_watermark(9)
    assert len(out.take()) == len(keys)
    handle = rig.snapshot(op, 1)
    results = []
    for subtask in range(2):
        again, out2, _ = rig.operator(_late_firings, parallelism=2, subtask=subtask, restore=handle)
        again.process_watermark(9)
        feed(again, *[((k, 2), 3) for k in keys if _owns(again, k)])
        results += out2.take()
    assert sorted(results) == [(k, 0, 3, 2, 0) for k in keys], "second firing of every window"


class NumberFirings(es.ProcessWindowFunction):
    """Uses per-window state in process only (its clear is the default no-op)."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        firings = ctx.window_state().get_state(FIRINGS)
        firings.update(firings.value() + 1)
        out.collect((key, firings.value()))


def test_window_state_restored_goes_at_cleanup_without_another_firing(rig: Rig) -> None:
    def configure(k: Any) -> Any:
        return (
            k.window(es.TumblingEventTimeWindows.of(10))
            .allowed_lateness(5)
            .process(NumberFirings())
        )

    op, out, _ = rig.operator(configure)
    feed(op, (("a", 1), 1))
    op.process_watermark(9)
    assert out.take() == [("a", 1)]
    again, _, _ = rig.operator(configure, restore=rig.snapshot(op, 1))
    assert again.keyed is not None and len(again.keyed.keys("window-state")) == 1
    again.process_watermark(14)
    assert again.keyed.keys("window-state") == [], "dropped though this operator never used it"


def test_global_state_is_shared_by_the_windows_of_a_key(rig: Rig) -> None:
    class Running(es.ProcessWindowFunction):
        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            total = ctx.global_state().get_reducing_state(
                es.state.ReducingStateDescriptor("total", reduce_fn=lambda a, b: a + b)
            )
            for _, v in elements:
                total.add(v)
            out.collect((key, ctx.window.start, total.get()))

    op, out, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(10)).process(Running())
    )
    feed(op, (("a", 1), 1), (("a", 2), 11), (("b", 5), 12), (("a", 4), 25))
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert sorted(out.take()) == [("a", 0, 1), ("a", 10, 3), ("a", 20, 7), ("b", 10, 5)]


def test_every_kind_of_per_window_state(rig: Rig) -> None:
    class Mean(es.AggregateFunction):
        def create_accumulator(self) -> tuple[int, int]:
            return (0, 0)

        def add(self, value: Any, acc: tuple[int, int]) -> tuple[int, int]:
            return (acc[0] + value, acc[1] + 1)

        def get_result(self, acc: tuple[int, int]) -> float:
            return acc[0] / acc[1]

        def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
            return (a[0] + b[0], a[1] + b[1])

    class All(es.ProcessWindowFunction):
        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            ws = ctx.window_state()
            sizes = ws.get_list_state(es.state.ListStateDescriptor("sizes"))
            seen = ws.get_map_state(es.state.MapStateDescriptor("seen"))
            most = ws.get_reducing_state(es.state.ReducingStateDescriptor("most", reduce_fn=max))
            mean = ws.get_aggregating_state(
                es.state.AggregatingStateDescriptor("mean", aggregate_function=Mean())
            )
            values = [v for _, v in elements]
            sizes.add(len(values))
            for v in values:
                seen.put(v, seen.get(v, 0) + 1)
            most.add(max(values))
            mean.add(sum(values))
            out.collect((sizes.get(), sorted(seen.items()), most.get(), mean.get()))

    op, out, _ = rig.operator(
        lambda k: (
            k.window(es.TumblingEventTimeWindows.of(10))
            .trigger(es.CountTrigger.of(2))
            .process(All())
        )
    )
    feed(op, (("a", 1), 1), (("a", 3), 2), (("a", 2), 3), (("a", 9), 12), (("a", 5), 4))
    assert out.take() == [
        ([2], [(1, 1), (3, 1)], 3, 4.0),
        ([2, 4], [(1, 2), (2, 1), (3, 2), (5, 1)], 5, 7.5),
    ]


def test_per_window_state_is_refused_on_merging_windows_and_with_ttl(rig: Rig) -> None:
    from datetime import timedelta

    class UsesWindowState(es.ProcessWindowFunction):
        def __init__(self, descriptor: Any) -> None:
            self.descriptor = descriptor

        def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
            ctx.window_state().get_state(self.descriptor)

    op, _, _ = rig.operator(
        lambda k: k.window(es.EventTimeSessionWindows.with_gap(10)).process(
            UsesWindowState(FIRINGS)
        )
    )
    feed(op, (("s", 1), 1))
    with pytest.raises(es.UserFunctionError, match="not available with merging"):
        op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    ttl = es.state.ValueStateDescriptor("x", ttl=timedelta(seconds=1))
    op2, _, _ = rig.operator(
        lambda k: k.window(es.TumblingEventTimeWindows.of(10)).process(UsesWindowState(ttl))
    )
    feed(op2, (("s", 1), 1))
    with pytest.raises(es.UserFunctionError, match="no TTL, it is dropped with its window"):
        op2.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
