"""Process functions: ``DataStream.process`` and ``KeyedStream.process``.

The operator sets the record's timestamp (``ctx.timestamp()``) and, on a keyed
stream, its key before each ``process_element``, gathers ``out.collect`` and
``ctx.output`` values, and emits them once per batch. Keyed process functions get
event- and processing-time timers (``ctx.timer_service()``); ``on_timer`` runs with
the timer's key current and ``ctx.time_domain()`` set.

Example::

    op = KeyedProcessOperator(spec, ctx)
    op.open()
    op.process_batch(records, timestamps)
    op.process_watermark(10_000)      # fires event-time timers up to 10 s
"""

from __future__ import annotations

from typing import Any

from epochstream.core.time import TimeDomain
from epochstream.exceptions import UserFunctionError
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.operators.collect import OutputBuffer, SideOutputs
from epochstream.runtime.timers import TimerService

__all__ = ["KeyedProcessOperator", "ProcessOperator", "UserTimersOperator"]


class ProcessOperator(Operator):
    """Runs a :class:`~epochstream.core.functions.ProcessFunction` (no key, no timers)."""

    def open(self) -> None:
        self._out = OutputBuffer()
        self._side = SideOutputs(self.side_outputs)
        self.ctx._side = self._side.add
        super().open()

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        out, side, ctx = self._out, self._side, self.ctx
        out.start(timed=timestamps is not None)
        collector = out.collector
        process = self.function.process_element
        x = None
        try:
            if timestamps is None:
                for x in records:
                    process(x, ctx, collector)
            else:
                for x, ts in zip(records, timestamps, strict=True):
                    ctx._timestamp = out.ts = side.ts = ts
                    process(x, ctx, collector)
                ctx._timestamp = side.ts = None
        except Exception as exc:
            raise UserFunctionError(ctx.task_name, x, exc) from exc
        out.flush(self.output)
        side.flush()


class UserTimersOperator(Operator):
    """What operators running a user's process function share: outputs gathered per
    batch, ``ctx.output`` side outputs, and (keyed) timers whose ``on_timer`` runs with
    ``ctx.timestamp()`` and ``ctx.time_domain()`` set, its output emitted after firing.

    Example: ``class KeyedProcessOperator(UserTimersOperator)``; ``open`` calls
    ``self._open_outputs(timers=True)``.
    """

    def _open_outputs(self, *, timers: bool) -> None:
        self._out = OutputBuffer()
        self._timer_out = OutputBuffer()
        self._side = SideOutputs(self.side_outputs)
        self.ctx._side = self._side.add
        if timers:
            # Before the user's open(): it may ask for the timer service.
            self.create_timer_service(self._fire)
            assert self.timers is not None
            self.ctx._timers = TimerService(self.timers)

    def _fire(self, domain: TimeDomain, timestamp: int, key: Any, namespace: Any) -> None:
        ctx = self.ctx
        ctx._timestamp = timestamp
        ctx._domain = domain
        self._timer_out.ts = self._side.ts = timestamp if domain is TimeDomain.EVENT_TIME else None
        try:
            self.function.on_timer(timestamp, ctx, self._timer_out.collector)
        except Exception as exc:
            raise UserFunctionError(f"{ctx.task_name} on_timer", timestamp, exc) from exc
        finally:
            ctx._timestamp = None
            ctx._domain = None

    def process_watermark(self, watermark: int) -> None:
        self._timer_out.start(timed=True)
        super().process_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        self._timer_out.start(timed=False)
        super().on_processing_time(now_ms)

    def flush_timer_output(self) -> None:
        self._timer_out.flush(self.output)
        self._side.flush()


class KeyedProcessOperator(UserTimersOperator):
    """Runs a KeyedProcessFunction with the record's key current, and its timers."""

    def open(self) -> None:
        assert self.keyed is not None and self.spec.key_selector is not None
        self._open_outputs(timers=True)
        super().open()

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        self.process_keyed(records, self.keys_of(records), timestamps)

    def process_keyed(
        self, records: list[Any], keys: list[Any], timestamps: list[Any] | None
    ) -> None:
        out, side, ctx = self._out, self._side, self.ctx
        out.start(timed=timestamps is not None)
        collector = out.collector
        backend = self.keyed
        assert backend is not None
        set_key = backend.set_current_key
        process = self.function.process_element
        x = None
        try:
            if timestamps is None:
                for x, k in zip(records, keys, strict=True):
                    set_key(k)
                    process(x, ctx, collector)
            else:
                for x, k, ts in zip(records, keys, timestamps, strict=True):
                    set_key(k)
                    ctx._timestamp = out.ts = side.ts = ts
                    process(x, ctx, collector)
                ctx._timestamp = side.ts = None
        except Exception as exc:
            raise UserFunctionError(ctx.task_name, x, exc) from exc
        out.flush(self.output)
        side.flush()
