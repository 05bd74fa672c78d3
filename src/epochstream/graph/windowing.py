"""Windows: assigners (which windows a record belongs to) and window functions (what a
window emits) (Flink's names and semantics); triggers (when it emits) are in
:mod:`epochstream.graph.triggers`.

Time windows are :class:`TimeWindow` ``[start, end)`` in int milliseconds; a window's
results get ``window.max_timestamp()`` (``end - 1``) as their timestamp. Event-time
windows fire when the watermark passes their end, processing-time ones when the
clock does. A window's state is kept until the watermark passes its end plus the
allowed lateness; a record for a window already gone is *late* (dropped, or sent to
``side_output_late_data``).

Example::

    (events.key_by(lambda e: e["word"])
        .window(es.TumblingEventTimeWindows.of(timedelta(seconds=5)))
        .allowed_lateness(timedelta(seconds=2))
        .aggregate(CountAgg(), CountWindowFunction()))
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from epochstream.core.events import MAX_WATERMARK
from epochstream.core.functions import Collector, Function
from epochstream.core.time import to_millis, to_signed_millis
from epochstream.exceptions import ConfigurationError
from epochstream.graph.triggers import (
    EventTimeTrigger,
    ProcessingTimeTrigger,
    Trigger,
    _NeverTrigger,
)

__all__ = [
    "CumulativeEventTimeWindows",
    "EventTimeSessionWindows",
    "GlobalWindow",
    "GlobalWindows",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
]


# ---------------------------------------------------------------------- windows


class TimeWindow(NamedTuple):
    """The time interval ``[start, end)`` in int milliseconds.

    Example: ``TimeWindow(0, 5000).max_timestamp() == 4999``
    """

    start: int
    end: int

    def max_timestamp(self) -> int:
        """The largest timestamp in the window (``end - 1``)."""
        return self.end - 1

    def intersects(self, other: TimeWindow) -> bool:
        """True if the windows overlap or touch (sessions merge then)."""
        return self.start <= other.end and self.end >= other.start

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window containing both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))


class GlobalWindow(NamedTuple):
    """The one window of :class:`GlobalWindows`: everything of a key.

    Example: ``GlobalWindow().max_timestamp() == es.WatermarkGenerator.MAX_WATERMARK``
    """

    def max_timestamp(self) -> int:
        """The end of time."""
        return MAX_WATERMARK


# ---------------------------------------------------------------------- assigners


class WindowAssigner(ABC):
    """Assigns each record to windows; knows its default trigger and time domain.

    Example: ``assigner.assign_windows(record, timestamp, now_ms)``
    """

    event_time: bool = True
    merging: bool = False

    @abstractmethod
    def assign_windows(self, element: Any, timestamp: int | None, now_ms: int) -> list[Any]:
        """The windows of ``element`` (``timestamp``: its event time; ``now_ms``: processing time)."""

    @abstractmethod
    def default_trigger(self) -> Trigger:
        """The trigger used unless ``.trigger(...)`` sets another."""

    def window_from(self, value: Any) -> Any:
        """A window of this assigner from its canonical form (a tuple, after a restore)."""
        return TimeWindow(*value)


def _time_of(assigner: WindowAssigner, timestamp: int | None, now_ms: int) -> int:
    if not assigner.event_time:
        return now_ms
    if timestamp is None:
        raise ConfigurationError(
            f"{type(assigner).__name__} needs event timestamps, and a record has none: call "
            "assign_timestamps_and_watermarks(...) or give the source a watermark strategy, "
            "or use a processing-time window"
        )
    return timestamp


#: Aligned windows a fixed assigner remembers (records come near each other in time:
#: most look up a window list made for an earlier record instead of building one).
_WINDOW_CACHE = 256


class _Fixed(WindowAssigner):
    """Tumbling and sliding windows: a record's windows follow from one aligned start,
    so the window lists are cached by it (callers must not change a returned list)."""

    def __init__(self) -> None:
        self._cache: dict[Any, list[TimeWindow]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}

    def _aligned(self, t: int) -> Any:
        """What every timestamp with the same windows as ``t`` shares (a cache key)."""
        raise NotImplementedError

    def _windows(self, aligned: Any, t: int) -> list[TimeWindow]:
        """The windows of ``t``."""
        raise NotImplementedError

    def assign_windows(self, element: Any, timestamp: int | None, now_ms: int) -> list[Any]:
        t = _time_of(self, timestamp, now_ms)
        aligned = self._aligned(t)
        windows = self._cache.get(aligned)
        if windows is None:
            if len(self._cache) >= _WINDOW_CACHE:
                self._cache.clear()
            windows = self._cache[aligned] = self._windows(aligned, t)
        return windows


def _offset(assigner: str, offset: Any, bound: int, bound_name: str) -> int:
    """A window offset as Flink takes it: any ``|offset| < bound``, negative ones too
    (``-8 h`` aligns days to UTC+8); normalized into ``[0, bound)``, the same grid."""
    ms = to_signed_millis(offset, "window offset")
    if abs(ms) >= bound:
        raise ConfigurationError(
            f"{assigner} needs abs(offset) < {bound_name}: got offset {ms} ms, {bound_name} {bound} ms"
        )
    return ms % bound


class _Tumbling(_Fixed):
    def __init__(self, size: Any, offset: Any = 0) -> None:
        super().__init__()
        self.size = to_millis(size, "window size", allow_zero=False)
        self.offset = _offset(type(self).__name__, offset, self.size, "size")

    def _aligned(self, t: int) -> Any:
        return t - (t - self.offset) % self.size

    def _windows(self, aligned: Any, t: int) -> list[TimeWindow]:
        return [TimeWindow(aligned, aligned + self.size)]


class TumblingEventTimeWindows(_Tumbling):
    """Fixed-size, non-overlapping event-time windows ``[k*size + offset, ...)``.

    Example: ``es.TumblingEventTimeWindows.of(timedelta(seconds=5))``
    """

    event_time = True

    @staticmethod
    def of(size: Any, offset: Any = 0) -> TumblingEventTimeWindows:
        """Windows of ``size`` (ms or timedelta), shifted by ``offset`` (``|offset| < size``,
        may be negative: ``of(timedelta(days=1), timedelta(hours=-8))`` gives days of UTC+8)."""
        return TumblingEventTimeWindows(size, offset)

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger()


class TumblingProcessingTimeWindows(_Tumbling):
    """Fixed-size processing-time windows (the record's arrival time on the job's clock).

    Example: ``es.TumblingProcessingTimeWindows.of(timedelta(seconds=5))``
    """

    event_time = False

    @staticmethod
    def of(size: Any, offset: Any = 0) -> TumblingProcessingTimeWindows:
        """Windows of ``size`` (ms or timedelta), shifted by ``offset`` (``|offset| < size``,
        may be negative)."""
        return TumblingProcessingTimeWindows(size, offset)

    def default_trigger(self) -> Trigger:
        return ProcessingTimeTrigger()


class _Sliding(_Fixed):
    def __init__(self, size: Any, slide: Any, offset: Any = 0) -> None:
        super().__init__()
        self.size = to_millis(size, "window size", allow_zero=False)
        self.slide = to_millis(slide, "window slide", allow_zero=False)
        self.offset = _offset(type(self).__name__, offset, self.slide, "slide")

    def _aligned(self, t: int) -> Any:
        last = t - (t - self.offset) % self.slide
        if self.size % self.slide == 0:
            return last  # then every t with this last start has the same windows
        # Otherwise the earliest start depends on t too.
        return (last, t - self.size - (t - self.size - self.offset) % self.slide)

    def _windows(self, aligned: Any, t: int) -> list[TimeWindow]:
        # Every start on the slide grid in (t - size, last start].
        size = self.size
        last = t - (t - self.offset) % self.slide
        return [TimeWindow(s, s + size) for s in range(last, t - size, -self.slide)]


class SlidingEventTimeWindows(_Sliding):
    """Windows of ``size`` starting every ``slide`` (a record is in ``size/slide`` of them).

    Example: ``es.SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5))``
    """

    event_time = True

    @staticmethod
    def of(size: Any, slide: Any, offset: Any = 0) -> SlidingEventTimeWindows:
        """Windows of ``size`` every ``slide`` (ms or timedelta), shifted by ``offset``
        (``|offset| < slide``, may be negative)."""
        return SlidingEventTimeWindows(size, slide, offset)

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger()


class SlidingProcessingTimeWindows(_Sliding):
    """Sliding windows over processing time.

    Example: ``es.SlidingProcessingTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5))``
    """

    event_time = False

    @staticmethod
    def of(size: Any, slide: Any, offset: Any = 0) -> SlidingProcessingTimeWindows:
        """Windows of ``size`` every ``slide`` (ms or timedelta), shifted by ``offset``
        (``|offset| < slide``, may be negative)."""
        return SlidingProcessingTimeWindows(size, slide, offset)

    def default_trigger(self) -> Trigger:
        return ProcessingTimeTrigger()


class CumulativeEventTimeWindows(WindowAssigner):
    """Flink SQL's CUMULATE windows: from each ``size``-aligned start, windows of
    ``step``, ``2 * step`` ... ``size`` (``size`` a multiple of ``step``), shifted by
    ``offset``. For the columnar SQL window aggregation only (``.aggregate(es.agg...)``
    on a columnar keyed stream); windows of rows refuse it.

    Example::

        batches.key_by("k").window(es.CumulativeEventTimeWindows.of(60_000, 10_000)) \
            .aggregate(es.agg.count_star("n"))
    """

    event_time = True

    def __init__(self, size: Any, step: Any, offset: Any = 0) -> None:
        self.size = to_millis(size, "window size", allow_zero=False)
        self.step = to_millis(step, "window step", allow_zero=False)
        if self.size % self.step:
            raise ConfigurationError(
                f"CumulativeEventTimeWindows: size ({self.size} ms) must be a multiple of "
                f"step ({self.step} ms)"
            )
        self.offset = _offset(type(self).__name__, offset, self.size, "size")

    @staticmethod
    def of(size: Any, step: Any, offset: Any = 0) -> CumulativeEventTimeWindows:
        """Cumulating windows up to ``size`` growing by ``step`` (ms or timedelta)."""
        return CumulativeEventTimeWindows(size, step, offset)

    def assign_windows(self, element: Any, timestamp: int | None, now_ms: int) -> list[Any]:
        raise ConfigurationError(
            "CumulativeEventTimeWindows are for the columnar SQL window aggregation "
            "(batches.key_by(...).window(...).aggregate(es.agg...)); windows of rows do not "
            "take them"
        )

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger()


class _Sessions(WindowAssigner):
    merging = True

    def __init__(self, gap: Any = None, gap_fn: Callable[[Any], Any] | None = None) -> None:
        self.gap = None if gap is None else to_millis(gap, "session gap", allow_zero=False)
        self.gap_fn = gap_fn

    def assign_windows(self, element: Any, timestamp: int | None, now_ms: int) -> list[Any]:
        t = _time_of(self, timestamp, now_ms)
        gap = (
            self.gap
            if self.gap_fn is None
            else to_millis(self.gap_fn(element), "session gap", allow_zero=False)
        )
        assert gap is not None
        return [TimeWindow(t, t + gap)]

    @staticmethod
    def merge_windows(windows: Iterable[TimeWindow]) -> list[tuple[TimeWindow, list[TimeWindow]]]:
        """Groups of overlapping windows: ``(covering window, its members)``."""
        merged: list[tuple[TimeWindow, list[TimeWindow]]] = []
        for window in sorted(windows):
            if merged and merged[-1][0].intersects(window):
                cover, members = merged[-1]
                merged[-1] = (cover.cover(window), [*members, window])
            else:
                merged.append((window, [window]))
        return merged


class EventTimeSessionWindows(_Sessions):
    """A window per burst of activity of a key: records less than ``gap`` apart share it.

    Example: ``es.EventTimeSessionWindows.with_gap(timedelta(minutes=10))``
    """

    event_time = True

    @staticmethod
    def with_gap(gap: Any) -> EventTimeSessionWindows:
        """Sessions closed by ``gap`` (ms or timedelta) without records."""
        return EventTimeSessionWindows(gap=gap)

    @staticmethod
    def with_dynamic_gap(gap_fn: Callable[[Any], Any]) -> EventTimeSessionWindows:
        """The gap after each record is ``gap_fn(record)`` (ms or timedelta)."""
        if not callable(gap_fn):
            raise ConfigurationError("with_dynamic_gap needs a callable")
        return EventTimeSessionWindows(gap_fn=gap_fn)

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger()


class ProcessingTimeSessionWindows(_Sessions):
    """Session windows over processing time.

    Example: ``es.ProcessingTimeSessionWindows.with_gap(timedelta(seconds=30))``
    """

    event_time = False

    @staticmethod
    def with_gap(gap: Any) -> ProcessingTimeSessionWindows:
        """Sessions closed by ``gap`` (ms or timedelta) without records."""
        return ProcessingTimeSessionWindows(gap=gap)

    @staticmethod
    def with_dynamic_gap(gap_fn: Callable[[Any], Any]) -> ProcessingTimeSessionWindows:
        """The gap after each record is ``gap_fn(record)``."""
        if not callable(gap_fn):
            raise ConfigurationError("with_dynamic_gap needs a callable")
        return ProcessingTimeSessionWindows(gap_fn=gap_fn)

    def default_trigger(self) -> Trigger:
        return ProcessingTimeTrigger()


class GlobalWindows(WindowAssigner):
    """One window per key holding everything; it fires only by the trigger you set
    (``count_window(n)`` sets a purging count trigger).

    Example: ``keyed.window(es.GlobalWindows.create()).trigger(es.CountTrigger.of(3))``
    """

    event_time = False

    @staticmethod
    def create() -> GlobalWindows:
        """The assigner."""
        return GlobalWindows()

    def assign_windows(self, element: Any, timestamp: int | None, now_ms: int) -> list[Any]:
        return [_GLOBAL]

    def default_trigger(self) -> Trigger:
        return _NeverTrigger()

    def window_from(self, value: Any) -> Any:
        return _GLOBAL


_GLOBAL = GlobalWindow()


# ---------------------------------------------------------------------- functions


class ProcessWindowFunction(Function, ABC):
    """Gets all of a window's elements (or the pre-aggregated result) when it fires.

    ``ctx.window`` is the window, ``ctx.current_watermark()`` and
    ``ctx.current_processing_time()`` the operator's times, ``ctx.output(tag, v)``
    a side output. Outputs get ``ctx.window.max_timestamp()`` as their timestamp.

    Keyed state (Flink's): ``ctx.window_state()`` is state of the key *in this window*
    (``get_state``, ``get_list_state``, ``get_map_state``, ``get_reducing_state``,
    ``get_aggregating_state``), kept across the window's firings (late ones within
    the allowed lateness too) and dropped when the window is cleaned up, after
    :meth:`clear`; not available on merging (session) windows. ``ctx.global_state()``
    is state of the key shared by all its windows. Both are checkpointed and follow
    their key on rescale. Get state objects from ``ctx`` in each call.

    Example::

        class CountWindowFunction(es.ProcessWindowFunction):
            def process(self, key, ctx, elements, out):
                (count,) = elements
                firing = ctx.window_state().get_state(es.state.ValueStateDescriptor("n", default=0))
                firing.update(firing.value() + 1)   # 1 on time, 2 on the first late firing...
                out.collect((key, ctx.window.start, count, firing.value()))
    """

    @abstractmethod
    def process(self, key: Any, ctx: Any, elements: Iterable[Any], out: Collector) -> None:
        """Emit results for ``key``'s window ``ctx.window``."""

    def clear(self, ctx: Any) -> None:
        """The window is gone (its allowed lateness passed): ``ctx.window_state()`` still
        holds its per-window state here (dropped right after), e.g. to update
        ``ctx.global_state()``."""
