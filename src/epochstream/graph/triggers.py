"""Triggers: when a window emits (Flink's Trigger, TriggerResult and built-in triggers).

A trigger sees each record added to a window and the timers it registered through its
context, and answers with a :class:`TriggerResult`: fire (emit the window's contents),
purge (drop them), both, or neither. Per-window trigger state lives in keyed state
through ``ctx.get_partitioned_state(descriptor)``, so it is checkpointed with the window.

Example::

    keyed.window(es.GlobalWindows.create()).trigger(es.CountTrigger.of(100)).sum(1)
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import Any

from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.core.time import to_millis
from epochstream.exceptions import ConfigurationError

__all__ = [
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "CountTrigger",
    "EventTimeTrigger",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "Trigger",
    "TriggerResult",
]


class TriggerResult(enum.Enum):
    """What a trigger decides: emit the window (fire), drop its contents (purge), both, or neither.

    Example: ``return es.TriggerResult.FIRE``
    """

    CONTINUE = (False, False)
    FIRE = (True, False)
    PURGE = (False, True)
    FIRE_AND_PURGE = (True, True)

    @property
    def fire(self) -> bool:
        """True when the window's contents are emitted."""
        return self.value[0]

    @property
    def purge(self) -> bool:
        """True when the window's contents are cleared."""
        return self.value[1]


class Trigger(ABC):
    """Decides when a window emits. ``ctx`` registers timers and keeps per-window state
    (``ctx.get_partitioned_state(ValueStateDescriptor(...))``).

    Example::

        class EveryTen(es.Trigger):
            def on_element(self, element, timestamp, window, ctx):
                n = ctx.get_partitioned_state(es.state.ValueStateDescriptor("n", default=0))
                n.update(n.value() + 1)
                return es.TriggerResult.FIRE if n.value() % 10 == 0 else es.TriggerResult.CONTINUE
    """

    @abstractmethod
    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: Any
    ) -> TriggerResult:
        """A record was added to ``window``."""

    def on_event_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        """An event-time timer this trigger registered fired."""
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        """A processing-time timer this trigger registered fired."""
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        """True if the trigger works with merging (session) windows."""
        return False

    def on_merge(self, window: Any, ctx: Any) -> None:  # noqa: B027 - optional hook
        """Windows were merged into ``window`` (re-register timers, merge state)."""

    def clear(self, window: Any, ctx: Any) -> None:  # noqa: B027 - optional hook
        """The window is gone: delete this trigger's timers and state for it."""


class EventTimeTrigger(Trigger):
    """Fires when the watermark passes the window's end (and again for each late record
    within the allowed lateness). The default of event-time windows.

    Example: ``.trigger(es.EventTimeTrigger.create())``
    """

    @staticmethod
    def create() -> EventTimeTrigger:
        """The trigger."""
        return EventTimeTrigger()

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: Any
    ) -> TriggerResult:
        if window.max_timestamp() <= ctx.current_watermark():
            return TriggerResult.FIRE  # a late record within the allowed lateness
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        return TriggerResult.FIRE if time == window.max_timestamp() else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: Any) -> None:
        if window.max_timestamp() > ctx.current_watermark():
            ctx.register_event_time_timer(window.max_timestamp())

    def clear(self, window: Any, ctx: Any) -> None:
        ctx.delete_event_time_timer(window.max_timestamp())


class ProcessingTimeTrigger(Trigger):
    """Fires when processing time passes the window's end. The default of processing-time windows.

    Example: ``.trigger(es.ProcessingTimeTrigger.create())``
    """

    @staticmethod
    def create() -> ProcessingTimeTrigger:
        """The trigger."""
        return ProcessingTimeTrigger()

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: Any
    ) -> TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        return TriggerResult.FIRE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: Any) -> None:
        if window.max_timestamp() > ctx.current_processing_time():
            ctx.register_processing_time_timer(window.max_timestamp())

    def clear(self, window: Any, ctx: Any) -> None:
        ctx.delete_processing_time_timer(window.max_timestamp())


class CountTrigger(Trigger):
    """Fires every ``count`` records of a window (the count restarts after each firing).

    Example: ``.trigger(es.CountTrigger.of(100))``
    """

    def __init__(self, count: int) -> None:
        if not isinstance(count, int) or count < 1:
            raise ConfigurationError(f"CountTrigger needs a count >= 1, got {count!r}")
        self.count = count

    @staticmethod
    def of(count: int) -> CountTrigger:
        """Fire every ``count`` records."""
        return CountTrigger(count)

    def _state(self, ctx: Any) -> Any:

        return ctx.get_partitioned_state(ValueStateDescriptor("__count", default=0))

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: Any
    ) -> TriggerResult:
        state = self._state(ctx)
        seen = state.value() + 1
        if seen >= self.count:
            state.clear()
            return TriggerResult.FIRE
        state.update(seen)
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: Any) -> None:
        ctx.merge_partitioned_state("__count", lambda a, b: a + b)

    def clear(self, window: Any, ctx: Any) -> None:
        self._state(ctx).clear()


class _Continuous(Trigger):
    """Fires every ``interval`` ms of one time domain while a window is open."""

    event_time: bool

    def __init__(self, interval: Any) -> None:
        self.interval = to_millis(interval, "trigger interval", allow_zero=False)

    def _state(self, ctx: Any) -> Any:

        return ctx.get_partitioned_state(ValueStateDescriptor("__next_fire"))

    def _now(self, ctx: Any) -> int:
        return int(ctx.current_watermark() if self.event_time else ctx.current_processing_time())

    def _register(self, ctx: Any, time: int) -> None:
        if self.event_time:
            ctx.register_event_time_timer(time)
        else:
            ctx.register_processing_time_timer(time)

    def _schedule(self, ctx: Any, window: Any, time: int) -> None:
        # Flink clamps every firing to the window's last timestamp: with allowed lateness
        # the window outlives its end, and a firing past it would be one Flink never does.
        self._state(ctx).update(time)
        self._register(ctx, time)

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: Any
    ) -> TriggerResult:
        if self.event_time:
            if window.max_timestamp() <= ctx.current_watermark():
                return TriggerResult.FIRE
            ctx.register_event_time_timer(window.max_timestamp())
            start = timestamp if timestamp is not None else window.start
        else:
            start = ctx.current_processing_time()
        if self._state(ctx).value() is None:
            first = start - start % self.interval + self.interval
            self._schedule(ctx, window, min(first, window.max_timestamp()))
        return TriggerResult.CONTINUE

    def _on_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        if self.event_time and time == window.max_timestamp():
            return TriggerResult.FIRE
        state = self._state(ctx)
        if state.value() == time:
            nxt = min(time + self.interval, window.max_timestamp())
            if nxt > time:
                self._schedule(ctx, window, nxt)
            else:  # a processing-time window's last firing: it is cleaned up at this time
                state.clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        return self._on_time(time, window, ctx) if self.event_time else TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        return TriggerResult.CONTINUE if self.event_time else self._on_time(time, window, ctx)

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: Any) -> None:
        ctx.merge_partitioned_state("__next_fire", min)
        nxt = self._state(ctx).value()
        if nxt is not None:
            self._register(ctx, nxt)
        if self.event_time and window.max_timestamp() > ctx.current_watermark():
            ctx.register_event_time_timer(window.max_timestamp())

    def clear(self, window: Any, ctx: Any) -> None:
        state = self._state(ctx)
        nxt = state.value()
        if nxt is not None:
            if self.event_time:
                ctx.delete_event_time_timer(nxt)
            else:
                ctx.delete_processing_time_timer(nxt)
        state.clear()


class ContinuousEventTimeTrigger(_Continuous):
    """Fires every ``interval`` of event time while the window is open, and at its end.

    As in Flink, firings are clamped to the window's last timestamp: with allowed
    lateness the trigger does not keep firing after the window's end (a late record
    within the lateness still fires it once).

    Example: ``.trigger(es.ContinuousEventTimeTrigger.of(timedelta(seconds=1)))``
    """

    event_time = True

    @staticmethod
    def of(interval: Any) -> ContinuousEventTimeTrigger:
        """Fire every ``interval`` (ms or timedelta) of event time."""
        return ContinuousEventTimeTrigger(interval)


class ContinuousProcessingTimeTrigger(_Continuous):
    """Fires every ``interval`` of processing time while the window has records.

    Example: ``.trigger(es.ContinuousProcessingTimeTrigger.of(timedelta(seconds=1)))``
    """

    event_time = False

    @staticmethod
    def of(interval: Any) -> ContinuousProcessingTimeTrigger:
        """Fire every ``interval`` (ms or timedelta) of processing time."""
        return ContinuousProcessingTimeTrigger(interval)


class PurgingTrigger(Trigger):
    """Makes every firing of ``trigger`` also purge the window's contents.

    Example: ``.trigger(es.PurgingTrigger.of(es.CountTrigger.of(10)))``
    """

    def __init__(self, trigger: Trigger) -> None:
        if not isinstance(trigger, Trigger):
            raise ConfigurationError("PurgingTrigger.of needs an es.Trigger")
        self.trigger = trigger

    @staticmethod
    def of(trigger: Trigger) -> PurgingTrigger:
        """``trigger``, purging on fire."""
        return PurgingTrigger(trigger)

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.fire else result

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: Any
    ) -> TriggerResult:
        return self._purging(self.trigger.on_element(element, timestamp, window, ctx))

    def on_event_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        return self._purging(self.trigger.on_event_time(time, window, ctx))

    def on_processing_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        return self._purging(self.trigger.on_processing_time(time, window, ctx))

    def can_merge(self) -> bool:
        return self.trigger.can_merge()

    def on_merge(self, window: Any, ctx: Any) -> None:
        self.trigger.on_merge(window, ctx)

    def clear(self, window: Any, ctx: Any) -> None:
        self.trigger.clear(window, ctx)


class _NeverTrigger(Trigger):
    """The default of global windows: they fire only through a trigger you set."""

    def on_element(
        self, element: Any, timestamp: int | None, window: Any, ctx: Any
    ) -> TriggerResult:
        return TriggerResult.CONTINUE
