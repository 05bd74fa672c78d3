"""``assign_timestamps_and_watermarks``: timestamps and watermarks mid-pipeline.

The operator gives each record the timestamp of the strategy's assigner (which sees
the record's previous timestamp, if any) and generates watermarks over everything
its subtask sees (one generator: the subtask is its "split"). Watermarks from
upstream are dropped, except the final one (an input that ended), as in Flink.

Example::

    op = TimestampsOperator(spec, ctx)   # spec.payload is a WatermarkStrategy
    op.open()
    op.process_batch([{"ts": 5}], None)
"""

from __future__ import annotations

from typing import Any

from epochstream.core.events import MAX_WATERMARK
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.watermarks import TimestampsAndWatermarks

__all__ = ["TimestampsOperator"]

_SPLIT = "subtask"


class TimestampsOperator(Operator):
    """Assigns timestamps and generates watermarks (see the module docstring)."""

    def open(self) -> None:
        super().open()
        self._tw = TimestampsAndWatermarks(
            self.function,
            f"assign_timestamps_and_watermarks ({self.ctx.task_name})",
            lambda records, timestamps: self.output.collect(records, timestamps),
            self.emit_watermark,
            self.emit_status,
            now_ms=self.ctx.clock_ms,
            interval_ms=self.ctx.watermark_interval_ms,
        )
        self._tw.add_split(_SPLIT)

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        self._tw.process(_SPLIT, records, timestamps)

    def process_watermark(self, watermark: int) -> None:
        if watermark == MAX_WATERMARK:
            self._tw.end_of_input()

    def process_status(self, idle: bool) -> None:
        """Upstream idleness does not matter: this operator judges its own input."""

    def on_processing_time(self, now_ms: int) -> None:
        self._tw.on_processing_time(now_ms)
