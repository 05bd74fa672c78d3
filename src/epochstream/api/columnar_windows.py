"""Event-time windows on a columnar keyed stream, aggregated with vectorized kernels.

Example::

    (batches.key_by("auction")
        .window(es.SlidingEventTimeWindows.of(10_000, 2_000))
        .count())             # columns auction, window_start, window_end, count
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epochstream.api.columnar import ColumnarAggregations
from epochstream.api.datastream import DataStream
from epochstream.api.windowing import (
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from epochstream.exceptions import ConfigurationError

if TYPE_CHECKING:
    from epochstream.api.columnar import ColumnarKeyedStream

__all__ = ["ColumnarWindowedStream"]


class ColumnarWindowedStream(ColumnarAggregations):
    """Tumbling or sliding event-time windows of a :class:`ColumnarKeyedStream`.

    Each aggregation fires once per key and window when the watermark passes the
    window's end; output batches hold the key column, ``window_start``,
    ``window_end`` (ms), the value column (``count`` for counts) and ``_ts``.

    Example::

        keyed.window(es.TumblingEventTimeWindows.of(10_000)).max("price")
    """

    def __init__(self, keyed: ColumnarKeyedStream, assigner: WindowAssigner) -> None:
        if isinstance(assigner, TumblingEventTimeWindows):
            size = slide = assigner.size
        elif isinstance(assigner, SlidingEventTimeWindows):
            size, slide = assigner.size, assigner.slide
        else:
            raise ConfigurationError(
                f"columnar windows are tumbling or sliding event-time windows, got "
                f"{type(assigner).__name__}: call to_rows() before key_by() for the others"
            )
        self._keyed = keyed
        self._size, self._slide, self._offset = size, slide, assigner.offset

    def _aggregate(self, kind: str, column: str | None) -> DataStream:
        from epochstream.runtime.operators.columnar import WindowAggregateSpec

        spec = WindowAggregateSpec(
            kind, self._keyed.key_column, column, self._size, self._slide, self._offset
        )
        return self._keyed._then("columnar_window", f"window {kind}({column or ''})", spec)
