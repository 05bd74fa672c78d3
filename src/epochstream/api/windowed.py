"""WindowedStream: ``keyed.window(assigner)`` and what it emits per window.

Configure with ``trigger``, ``evictor``, ``allowed_lateness`` and
``side_output_late_data``, then end with a window function: ``reduce`` or
``aggregate`` (incremental: one accumulator per window, optionally handed to a
``ProcessWindowFunction`` when the window fires), ``process`` (all elements kept until
the window fires), or the shortcuts ``sum``, ``min``, ``max``, ``min_by``, ``max_by``
and ``count``. With an evictor every function keeps all elements (Flink's evicting
window operator): ``reduce``/``aggregate`` fold what is left after eviction.

Example::

    counts = (words.key_by(lambda w: w)
                .window(es.TumblingEventTimeWindows.of(timedelta(seconds=5)))
                .count())                      # (word, count) per window
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epochstream.core.functions import OutputTag, ReduceFunction
from epochstream.core.state_descriptors import AggregateFunction
from epochstream.core.time import to_millis
from epochstream.exceptions import ConfigurationError
from epochstream.graph.evictors import Evictor
from epochstream.graph.specs import WindowSpec
from epochstream.graph.triggers import Trigger
from epochstream.graph.windowing import ProcessWindowFunction, WindowAssigner

if TYPE_CHECKING:
    from epochstream.api.datastream import DataStream, KeyedStream

__all__ = ["WindowedStream"]


class WindowedStream:
    """A keyed stream cut into windows (see the module docstring).

    Example::

        keyed.window(es.SlidingEventTimeWindows.of(10_000, 5_000)).reduce(lambda a, b: a + b)
    """

    def __init__(self, keyed: KeyedStream, assigner: WindowAssigner) -> None:
        if not isinstance(assigner, WindowAssigner):
            raise ConfigurationError(
                f"window() needs a window assigner such as es.TumblingEventTimeWindows.of(...), "
                f"got {type(assigner).__name__}"
            )
        self._keyed = keyed
        self._assigner = assigner
        self._trigger: Trigger = assigner.default_trigger()
        self._lateness = 0
        self._late_tag: OutputTag | None = None
        self._evictor: Evictor | None = None

    def trigger(self, trigger: Trigger) -> WindowedStream:
        """Replace the assigner's default trigger. Example: ``.trigger(es.CountTrigger.of(10))``"""
        if not isinstance(trigger, Trigger):
            raise ConfigurationError(f"trigger() needs an es.Trigger, got {type(trigger).__name__}")
        if self._assigner.merging and not trigger.can_merge():
            raise ConfigurationError(
                f"{type(trigger).__name__} cannot be used with merging (session) windows"
            )
        self._trigger = trigger
        return self

    def evictor(self, evictor: Evictor) -> WindowedStream:
        """Remove elements from the window when it fires, before and/or after the window
        function (see :mod:`epochstream.graph.evictors`). The window then keeps all its
        elements, also for ``reduce``/``aggregate``, which fold them at each firing.

        Example: ``.trigger(es.CountTrigger.of(2)).evictor(es.CountEvictor.of(5))``
        """
        if not isinstance(evictor, Evictor):
            raise ConfigurationError(f"evictor() needs an es.Evictor, got {type(evictor).__name__}")
        self._evictor = evictor
        return self

    def allowed_lateness(self, lateness: Any) -> WindowedStream:
        """Keep each window's state ``lateness`` (ms or timedelta) past its end; late
        records within it update the window and make it fire again.

        Example: ``.allowed_lateness(timedelta(seconds=2))``
        """
        ms = to_millis(lateness, "allowed lateness")
        if ms and not self._assigner.event_time:
            raise ConfigurationError("allowed_lateness applies to event-time windows only")
        self._lateness = ms
        return self

    def side_output_late_data(self, tag: OutputTag) -> WindowedStream:
        """Send records too late for every window they belong to to ``tag`` instead of
        dropping them. Example: ``.side_output_late_data(es.OutputTag("late"))``
        """
        if not isinstance(tag, OutputTag):
            raise ConfigurationError("side_output_late_data needs an es.OutputTag")
        self._late_tag = tag
        return self

    # ------------------------------------------------------------------ functions

    def _build(
        self, kind: str, name: str, function: Any, window_function: Any = None
    ) -> DataStream:
        if window_function is not None and not isinstance(window_function, ProcessWindowFunction):
            raise ConfigurationError(
                "the window function after an incremental aggregation must be an "
                f"es.ProcessWindowFunction, got {type(window_function).__name__}"
            )
        spec = WindowSpec(
            assigner=self._assigner,
            trigger=self._trigger,
            allowed_lateness=self._lateness,
            late_tag=self._late_tag,
            kind=kind,
            function=function,
            window_function=window_function,
            evictor=self._evictor,
        )
        if self._evictor is not None:
            name = f"evicting-{name}"
        return self._keyed._then("window", name, spec)

    def reduce(
        self,
        fn: Callable[[Any, Any], Any] | ReduceFunction,
        window_function: ProcessWindowFunction | None = None,
    ) -> DataStream:
        """Combine a window's records pairwise as they arrive; emit the result (or hand
        it to ``window_function``) when the window fires.

        Example: ``.reduce(lambda a, b: (a[0], a[1] + b[1]))``
        """
        if not callable(fn) and not isinstance(fn, ReduceFunction):
            raise ConfigurationError("reduce needs a callable or an es.ReduceFunction")
        return self._build("reduce", "window-reduce", fn, window_function)

    def aggregate(
        self, fn: AggregateFunction, window_function: ProcessWindowFunction | None = None
    ) -> DataStream:
        """Fold a window's records into an accumulator (``es.AggregateFunction``); emit
        ``get_result`` (or hand it to ``window_function``) when the window fires.

        Example: ``.aggregate(CountAgg(), CountWindowFunction())``
        """
        if not isinstance(fn, AggregateFunction):
            raise ConfigurationError(
                f"aggregate needs an es.AggregateFunction, got {type(fn).__name__}"
            )
        return self._build(
            "aggregate", f"window-aggregate({type(fn).__name__})", fn, window_function
        )

    def process(self, fn: ProcessWindowFunction) -> DataStream:
        """Keep every record of a window and give them all to ``fn`` when it fires.

        Example: ``.process(TopThree())``
        """
        if not isinstance(fn, ProcessWindowFunction):
            raise ConfigurationError(
                f"process needs an es.ProcessWindowFunction, got {type(fn).__name__}"
            )
        return self._build("process", f"window-process({type(fn).__name__})", fn)

    def sum(self, position: int | None = None) -> DataStream:
        """Per window: the sum of the records, or of field ``position`` of tuple records
        (the other fields from the window's first record). Example: ``.sum(1)``
        """
        return self._build("aggregate", "window-sum", _FieldAggregate("sum", position))

    def min(self, position: int | None = None) -> DataStream:
        """Per window: the smallest record, or the smallest field ``position`` (the
        other fields from the window's first record). Example: ``.min(1)``
        """
        return self._build("aggregate", "window-min", _FieldAggregate("min", position))

    def max(self, position: int | None = None) -> DataStream:
        """Per window: the largest record, or the largest field ``position`` (the other
        fields from the window's first record). Example: ``.max(1)``
        """
        return self._build("aggregate", "window-max", _FieldAggregate("max", position))

    def min_by(self, position: int) -> DataStream:
        """Per window: the record whose field ``position`` is smallest (the first of ties)."""
        return self._build("aggregate", "window-min-by", _FieldAggregate("min_by", position))

    def max_by(self, position: int) -> DataStream:
        """Per window: the record whose field ``position`` is largest (the first of ties)."""
        return self._build("aggregate", "window-max-by", _FieldAggregate("max_by", position))

    def count(self) -> DataStream:
        """Per window: ``(key, number of records)``. Example: ``.count()``"""
        return self._build("aggregate", "window-count", _Count(), _KeyAndCount())


class _FieldAggregate(AggregateFunction):
    """sum/min/max of a tuple field (others from the first record), min_by/max_by."""

    def __init__(self, how: str, position: int | None) -> None:
        if how in ("min_by", "max_by") and position is None:
            raise ConfigurationError(f"{how} needs a field position")
        self.how = how
        self.position = position

    def create_accumulator(self) -> Any:
        return None

    def add(self, value: Any, accumulator: Any) -> Any:
        if accumulator is None:
            return value
        return self.merge(accumulator, value)

    def get_result(self, accumulator: Any) -> Any:
        return accumulator

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        p, how = self.position, self.how
        if p is None:
            if how == "sum":
                return a + b
            return min(a, b) if how == "min" else max(a, b)
        if how == "min_by":
            return b if b[p] < a[p] else a
        if how == "max_by":
            return b if b[p] > a[p] else a
        if how == "sum":
            field = a[p] + b[p]
        else:
            field = min(a[p], b[p]) if how == "min" else max(a[p], b[p])
        return (*a[:p], field, *a[p + 1 :])


class _Count(AggregateFunction):
    """``(key, count)``: the key comes from the window function context."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


class _KeyAndCount(ProcessWindowFunction):
    """Pairs a window's count with its key."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for count in elements:
            out.collect((key, count))
