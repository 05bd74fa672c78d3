"""Watermark strategies: where records get their event timestamps and how event time
advances (Flink's ``WatermarkStrategy``).

A strategy is attached to a source (``env.from_source(src, watermark_strategy=s)``)
or to any stream (``stream.assign_timestamps_and_watermarks(s)``). It names:

- a **timestamp assigner** ``fn(record, previous_timestamp) -> int`` (milliseconds
  since the epoch; ``previous_timestamp`` is the record's current timestamp or
  ``None``);
- a **watermark generator**, created per source split (or per subtask of
  ``assign_timestamps_and_watermarks``), which sees every timestamp and says how far
  event time has come: ``bounded_out_of_orderness(d)`` trails the largest timestamp
  seen by ``d`` (its watermark is ``max - d - 1``), ``monotonous_timestamps()`` by
  nothing, ``no_watermarks()`` never advances;
- an optional **idleness** timeout: a split without records for that long stops
  holding back the watermark until it has records again.

Example::

    strategy = (es.WatermarkStrategy.bounded_out_of_orderness(timedelta(seconds=3))
                  .with_timestamp_assigner(lambda e, ts: e["ts"])
                  .with_idleness(timedelta(seconds=10)))
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from epochstream.core.events import MAX_WATERMARK, MIN_WATERMARK
from epochstream.core.time import to_millis
from epochstream.exceptions import ConfigurationError

__all__ = [
    "BoundedOutOfOrdernessWatermarks",
    "NoWatermarksGenerator",
    "WatermarkGenerator",
    "WatermarkStrategy",
]


class WatermarkGenerator(ABC):
    """Tracks the timestamps of one split and says how far event time has come.

    ``on_event`` sees every record with its timestamp; ``current_watermark`` is read
    after records (it must never go backwards). Subclass it for a punctuated or
    custom generator and pass ``WatermarkStrategy.for_generator(MyGenerator)``.

    Example::

        class EveryTenSeconds(es.WatermarkGenerator):
            def __init__(self):
                self.max = None
            def on_event(self, event, timestamp):
                self.max = timestamp if self.max is None else max(self.max, timestamp)
            def current_watermark(self):
                return self.MIN_WATERMARK if self.max is None else self.max // 10_000 * 10_000 - 1
    """

    #: The watermark before any record (no event time has passed yet).
    MIN_WATERMARK = MIN_WATERMARK
    #: The watermark of an input that has ended: every event-time timer and window fires.
    MAX_WATERMARK = MAX_WATERMARK

    @abstractmethod
    def on_event(self, event: Any, timestamp: int) -> None:
        """One record and its timestamp (in the order the split produced them)."""

    @abstractmethod
    def current_watermark(self) -> int:
        """The watermark so far (``MIN_WATERMARK`` before any)."""

    def on_batch(self, events: list[Any], timestamps: list[int]) -> list[tuple[int, int]]:
        """Feed a batch; return ``(i, watermark)`` for each record ``i`` at or below the
        watermark reached just before it (a late record: the watermark must travel
        ahead of it, so every operator downstream sees it as late).

        The default calls ``on_event`` and ``current_watermark`` per record; the
        built-in generators do the same work in one loop.
        """
        late: list[tuple[int, int]] = []
        current = self.current_watermark()
        for i, (event, ts) in enumerate(zip(events, timestamps, strict=True)):
            if ts <= current:
                late.append((i, current))
            self.on_event(event, ts)
            current = max(current, self.current_watermark())
        return late


class BoundedOutOfOrdernessWatermarks(WatermarkGenerator):
    """Watermark = largest timestamp seen - ``bound_ms`` - 1 (Flink's generator).

    Example: ``g = BoundedOutOfOrdernessWatermarks(3000); g.on_event(x, 10_000)``
    then ``g.current_watermark() == 6_999``.
    """

    __slots__ = ("_lag", "_max")

    def __init__(self, bound_ms: int) -> None:
        self._lag = bound_ms + 1
        self._max: int | None = None

    def on_event(self, event: Any, timestamp: int) -> None:
        if self._max is None or timestamp > self._max:
            self._max = timestamp

    def current_watermark(self) -> int:
        return MIN_WATERMARK if self._max is None else self._max - self._lag

    def on_batch(self, events: list[Any], timestamps: list[int]) -> list[tuple[int, int]]:
        if not timestamps:
            return []
        lag = self._lag
        mx = self._max
        if mx is None:
            mx = timestamps[0]
        late: list[tuple[int, int]] = []
        for i, ts in enumerate(timestamps):
            if ts > mx:
                mx = ts
            elif ts <= mx - lag:
                late.append((i, mx - lag))
        self._max = mx
        return late


class NoWatermarksGenerator(WatermarkGenerator):
    """Never advances event time (timestamps only; windows fire at end of input).

    Example: ``WatermarkStrategy.no_watermarks().with_timestamp_assigner(f)``
    """

    def on_event(self, event: Any, timestamp: int) -> None:
        """Timestamps do not move this generator."""

    def current_watermark(self) -> int:
        return MIN_WATERMARK

    def on_batch(self, events: list[Any], timestamps: list[int]) -> list[tuple[int, int]]:
        return []


class _Bounded:
    """Picklable factory of bounded-out-of-orderness generators."""

    def __init__(self, bound_ms: int) -> None:
        self.bound_ms = bound_ms

    def __call__(self) -> WatermarkGenerator:
        return BoundedOutOfOrdernessWatermarks(self.bound_ms)

    def __repr__(self) -> str:
        return f"bounded_out_of_orderness({self.bound_ms} ms)"


def _no_watermarks() -> WatermarkGenerator:
    return NoWatermarksGenerator()


def _two_args(fn: Callable[..., Any]) -> Callable[[Any, Any], Any]:
    """Accept ``fn(record)`` as well as Flink's ``fn(record, previous_timestamp)``."""
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        varargs = any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: call as Flink does
        return fn
    if len(params) == 1 and not varargs:
        return _OneArg(fn)
    return fn


class _OneArg:
    """Picklable adapter calling a one-argument timestamp function."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, record: Any, previous: Any) -> Any:
        return self.fn(record)


@dataclass(frozen=True)
class WatermarkStrategy:
    """How records get timestamps and how event time advances (see the module docstring).

    Example::

        es.WatermarkStrategy.bounded_out_of_orderness(timedelta(seconds=3)) \\
            .with_timestamp_assigner(lambda e, ts: e["ts"])
    """

    generator_factory: Callable[[], WatermarkGenerator]
    timestamp_assigner: Callable[[Any, Any], Any] | None = None
    idle_timeout_ms: int | None = None
    #: Columnar streams: the int64 millisecond column holding each row's event time.
    timestamp_column: str | None = None

    # -------------------------------------------------------------- constructors

    @staticmethod
    def bounded_out_of_orderness(max_out_of_orderness: Any) -> WatermarkStrategy:
        """Records may arrive up to ``max_out_of_orderness`` (ms or timedelta) late.

        Example: ``WatermarkStrategy.bounded_out_of_orderness(timedelta(seconds=3))``
        """
        return WatermarkStrategy(
            _Bounded(to_millis(max_out_of_orderness, "out-of-orderness bound"))
        )

    for_bounded_out_of_orderness = bounded_out_of_orderness

    @staticmethod
    def monotonous_timestamps() -> WatermarkStrategy:
        """Timestamps never go down: the watermark follows the largest one seen (minus 1 ms).

        Example: ``WatermarkStrategy.monotonous_timestamps().with_timestamp_assigner(f)``
        """
        return WatermarkStrategy(_Bounded(0))

    for_monotonous_timestamps = monotonous_timestamps

    @staticmethod
    def no_watermarks() -> WatermarkStrategy:
        """Timestamps without watermarks: event time advances only when the input ends.

        Example: ``WatermarkStrategy.no_watermarks().with_timestamp_assigner(f)``
        """
        return WatermarkStrategy(_no_watermarks)

    @staticmethod
    def for_generator(factory: Callable[[], WatermarkGenerator]) -> WatermarkStrategy:
        """A custom generator; ``factory()`` makes one per split (a class works).

        Example: ``WatermarkStrategy.for_generator(EveryTenSeconds)``
        """
        if not callable(factory):
            raise ConfigurationError(
                "for_generator needs a callable returning a WatermarkGenerator"
            )
        return WatermarkStrategy(factory)

    # -------------------------------------------------------------- options

    def with_timestamp_assigner(self, assigner: Callable[..., Any]) -> WatermarkStrategy:
        """Take each record's timestamp (int ms) from ``assigner(record, previous_ts)``.

        Example: ``strategy.with_timestamp_assigner(lambda e, ts: e["ts"])``
        """
        if not callable(assigner):
            raise ConfigurationError("with_timestamp_assigner needs a callable")
        return replace(self, timestamp_assigner=_two_args(assigner))

    def with_timestamp_column(self, column: str) -> WatermarkStrategy:
        """Columnar sources: take each row's timestamp from ``column`` (int milliseconds,
        or an Arrow timestamp); it is copied to the ``_ts`` event-time column.

        Example: ``strategy.with_timestamp_column("date_time")``
        """
        if not isinstance(column, str) or not column:
            raise ConfigurationError("with_timestamp_column needs a column name")
        return replace(self, timestamp_column=column)

    def with_idleness(self, timeout: Any) -> WatermarkStrategy:
        """A split without records for ``timeout`` (ms or timedelta) stops holding back
        the watermark until records come again.

        Example: ``strategy.with_idleness(timedelta(seconds=10))``
        """
        return replace(
            self, idle_timeout_ms=to_millis(timeout, "idleness timeout", allow_zero=False)
        )

    def create_generator(self) -> WatermarkGenerator:
        """A fresh generator (one per split)."""
        generator = self.generator_factory()
        if not isinstance(generator, WatermarkGenerator):
            raise ConfigurationError(
                f"the watermark generator factory returned {type(generator).__name__}, "
                "not an es.WatermarkGenerator"
            )
        return generator
