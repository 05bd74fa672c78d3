"""Columnar tumbling and sliding processing-time windows (Arrow record batches): a
whole batch goes into the window(s) of the operator clock's time when it arrives; a
window fires when the clock passes its end, and every open window fires at the end of a
bounded input (the final watermark). Output and state as
:class:`~epochstream.runtime.operators.columnar_aggregates.ColumnarWindowOperator`'s.

Example::

    op = ColumnarProcessingTimeWindowOperator(spec, ctx)   # WindowAggregateSpec, size 10 s
    op.process_batch(batch, None)
    op.on_processing_time(op.next_processing_time())
"""

from __future__ import annotations

from typing import Any

from epochstream.core.events import MAX_WATERMARK
from epochstream.graph.specs import WindowAggregateSpec
from epochstream.runtime.operators.columnar_aggregates import ColumnarWindowAggregates
from epochstream.runtime.operators.columnar_transforms import need_batch

__all__ = ["ColumnarProcessingTimeWindowOperator"]


class ColumnarProcessingTimeWindowOperator(ColumnarWindowAggregates):
    """Tumbling/sliding processing-time windows on record batches.

    A batch goes whole into the windows of ``ctx.clock_ms()`` when it arrives (the
    payload is a :class:`~epochstream.runtime.operators.columnar_aggregates.WindowAggregateSpec`).
    A window fires when the clock reaches its end - 1 (the task calls
    :meth:`on_processing_time` by :meth:`next_processing_time`, which follows the open
    windows, so restored windows are timed again without timer state). At the end of a
    bounded input (the final watermark) every open window fires, so nothing accepted is
    lost; Flink drops them there.

    Example::

        op = create_operator(spec, ctx)     # kind "columnar_processing_window", size 10 s
        op.process_batch(batch, None)       # at 12:00:03 on ctx.clock: window [12:00:00, 12:00:10)
        op.on_processing_time(op.next_processing_time())   # emits the window's rows
    """

    agg: WindowAggregateSpec

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        self._check_types(batch)
        now = self.ctx.clock_ms()
        agg = self.agg
        last = now - (now - agg.offset) % agg.slide
        for start in range(last, now - agg.size, -agg.slide):
            self._window(start).fold(batch)

    def process_watermark(self, watermark: int) -> None:
        if watermark >= MAX_WATERMARK:
            self._fire_due(MAX_WATERMARK)
        self.emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        self._fire_due(now_ms)

    def next_processing_time(self) -> int | None:
        if not self.windows:
            return None
        return min(self.windows) + self.agg.size - 1
