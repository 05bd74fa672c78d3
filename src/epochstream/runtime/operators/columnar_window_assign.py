"""Flink SQL's window table functions without aggregation on batches: ``SELECT * FROM
TABLE(TUMBLE|HOP|CUMULATE(TABLE t, DESCRIPTOR(ts), ...))``.

Every row comes out once per window it belongs to (TUMBLE: one; HOP: about size /
slide; CUMULATE: each cumulative window of its size-aligned period whose end is past
it), with ``window_start``, ``window_end`` and ``window_time`` (``timestamp[ms]``;
``window_time = window_end - 1``) added after the input's columns. The row's own
``_ts`` is kept: Flink keeps the rowtime, and ``window_time`` is a time attribute too.
Stateless and vectorized: per batch, each row's window count and first window from
``_ts``, then ``np.repeat`` and one ``take``.

Example::

    op = ColumnarWindowAssignOperator(spec, ctx)   # spec.payload: WindowAssignSpec(WindowTvf.hop(10, 5))
    op.process_batch(pa.record_batch({"v": [1], "_ts": [7]}), None)
    # emits two rows: v=1 in [0, 10) and in [5, 15)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.exceptions import DataError
from epochstream.graph.specs import WINDOW_TVF_COLUMNS, WindowAssignSpec, WindowTvf
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.state.columnar_checks import event_times

__all__ = ["ColumnarWindowAssignOperator", "TableWindows"]

_TS_TYPE = pa.timestamp("ms")


class TableWindows:
    """The windows of a :class:`WindowTvf` that each event time belongs to.

    Example::

        rows, starts, ends = TableWindows(WindowTvf.cumulate(10, 5)).of(np.array([3, 7]))
        # rows [0, 0, 1], starts [0, 0, 0], ends [5, 10, 10]
    """

    def __init__(self, window: WindowTvf) -> None:
        self.window = window

    def of(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, starts, ends)``: per window of a row, the row's position and the
        window's bounds; a row's windows are consecutive, by end."""
        w = self.window
        if w.kind == "tumble":
            starts = ts - (ts - w.offset) % w.size
            return np.arange(len(ts)), starts, starts + w.size
        if w.kind == "hop":
            slide = int(w.slide or 0)
            last = ts - (ts - w.offset) % slide  # the latest start at or before ts
            # Starts last, last - slide, ... while the window still reaches past ts.
            counts = (last - ts + w.size - 1) // slide + 1
            first = last - (counts - 1) * slide
            rows, j = _repeat(counts)
            starts = first[rows] + j * slide
            return rows, starts, starts + w.size
        step = int(w.step or 0)
        base = ts - (ts - w.offset) % w.size  # the size-aligned start of every window
        first_k = (ts - base) // step + 1  # the first end past ts, in steps from base
        counts = w.size // step - first_k + 1
        rows, j = _repeat(counts)
        return rows, base[rows], base[rows] + (first_k[rows] + j) * step


def _repeat(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's position repeated ``counts`` times, and the repeat's index."""
    rows = np.repeat(np.arange(len(counts)), counts)
    firsts = np.cumsum(counts) - counts
    return rows, np.arange(len(rows)) - firsts[rows]


class ColumnarWindowAssignOperator(Operator):
    """Window assignment (TUMBLE, HOP, CUMULATE without aggregation) on record batches:
    see the module docstring. An input that has a window column already, or no event
    time, is a :class:`DataError` naming the operator.
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.assign: WindowAssignSpec = spec.payload
        self.windows = TableWindows(self.assign.window)

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        where = self.ctx.task_name
        names = batch.schema.names
        if TS_COLUMN not in names:
            raise DataError(
                f"{where}: window assignment needs event time; give the source a watermark "
                "strategy with .with_timestamp_column(name)"
            )
        clash = next((n for n in WINDOW_TVF_COLUMNS if n in names), None)
        if clash is not None:
            raise DataError(
                f"{where}: the input has a column {clash!r} already, which window assignment "
                "adds; rename it in map_batches first"
            )
        if not batch.num_rows:
            return
        rows, starts, ends = self.windows.of(event_times(batch, where))
        out = batch.take(pa.array(rows))
        for name, values in zip(WINDOW_TVF_COLUMNS, (starts, ends, ends - 1), strict=True):
            out = out.append_column(name, pa.array(values).cast(_TS_TYPE))
        self.output.collect(out, None)
