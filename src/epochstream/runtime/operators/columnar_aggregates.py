"""Columnar keyed aggregations: rolling per key, and per event-time window.

- :class:`ColumnarAggregateOperator`: rolling keyed ``sum``/``count``/``min``/``max``/
  ``mean`` over :class:`~epochstream.state.columnar_aggregates.ColumnarAggregates`, its
  state in a column table of the job's keyed-state backend (heap or RocksDB);
- :class:`ColumnarWindowOperator`: the same aggregations per tumbling or sliding
  event-time window, fired by the watermark.

Example::

    op = ColumnarAggregateOperator(spec, ctx)  # spec.payload = AggregateSpec("sum", "k", "v")
    op.output = ChainedOutput(sink_op, produced=op.counters, consumed=sink_op.counters)
    op.process_batch(pa.record_batch({"k": ["a", "a"], "v": [1, 2], "_kg": [3, 3]}), None)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.exceptions import DataError, StateError
from epochstream.graph.specs import AggregateSpec, WindowAggregateSpec
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.state.backends.base import (
    KeyedBackendContext,
    KeyedStateBackend,
)
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.columnar_aggregates import (
    ColumnarAggregates,
    state_file_table,
    state_of_table,
    window_of_table,
    window_table_name,
)
from epochstream.state.columnar_checks import checked_value_type, event_times
from epochstream.state.handles import OperatorRestore
from epochstream.state.key_index import checked_key_type
from epochstream.state.keygroups import key_group_range_for_operator

__all__ = [
    "ColumnarAggregateOperator",
    "ColumnarWindowAggregates",
    "ColumnarWindowOperator",
    "own_backend",
    "window_starts",
]


def window_starts(
    ts: np.ndarray, size: int, slide: int, offset: int, watermark: int
) -> tuple[int, list[tuple[int, np.ndarray]]]:
    """Rows of event times ``ts`` per tumbling/sliding window: the number of late rows
    (even their latest window fired at ``watermark``) and ``(start, row mask)`` of every
    open window a row falls in."""
    last = ts - (ts - offset) % slide
    late = int((last + size - 1 <= watermark).sum())
    windows: list[tuple[int, np.ndarray]] = []
    for j in range(-(-size // slide)):
        starts = last - j * slide
        valid = (starts > ts - size) & (starts + size - 1 > watermark)
        for start in np.unique(starts[valid]).tolist():
            windows.append((start, valid & (starts == start)))
    return late, windows


def own_backend(spec: Any, ctx: Any) -> KeyedStateBackend:
    """The keyed-state backend of a columnar operator driven without a task (tests,
    tools): a heap backend of the operator's own, as the task would give it by default.

    Example: ``self.keyed = self.keyed or own_backend(spec, ctx)``
    """
    return HeapStateBackend().create(
        KeyedBackendContext(
            operator_uid=spec.uid,
            subtask=ctx.subtask_index,
            max_parallelism=ctx.max_parallelism,
            key_group_range=key_group_range_for_operator(
                ctx.max_parallelism, ctx.parallelism, ctx.subtask_index
            ),
            clock=ctx.clock,
            local_dir="",
            storage_options=ctx.storage_options,
        )
    )


class ColumnarAggregateOperator(Operator):
    """Rolling keyed aggregation: per input batch, one row per key touched with its new
    running value (``key``, value column; ``count`` for counts).

    Its state is a column table of the job's keyed-state backend
    (``env.set_state_backend``; :meth:`KeyedStateBackend.column_table`), named after
    the aggregation (``"sum"``...), snapshotted and restored by the backend.
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        #: The key groups of this subtask (those its backend holds).
        self.key_groups = self.keyed.key_group_range
        agg: AggregateSpec = spec.payload
        self.state = ColumnarAggregates(
            agg.kind,
            key=agg.key,
            value=agg.value,
            max_parallelism=ctx.max_parallelism,
            where=ctx.task_name,
            backend=self.keyed,
        )

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        self.state.attach()

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if batch.num_rows:
            self.output.collect(self.state.update(batch), None)

    def state_table(self) -> pa.Table:
        """The state as a table (``_kg``, ``_key``, ``acc``, ``count``): tests, tools."""
        return self.state.state_table()


class ColumnarWindowAggregates(Operator):
    """What event-time and processing-time window aggregations on batches share: one
    :class:`ColumnarAggregates` per open window (by start), firing, restore.

    Each open window is a column table of the job's keyed-state backend, named
    ``<aggregation>@<start>`` (:func:`window_table_name`); a fired window's table is
    dropped. The backend snapshots and restores them.

    A fired window is one batch: the key column, ``window_start``, ``window_end``, the
    value column (``count`` for counts) and ``_ts = window_end - 1``.
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        self.key_groups = self.keyed.key_group_range
        self.agg: WindowAggregateSpec = spec.payload
        self.windows: dict[int, ColumnarAggregates] = {}
        # The key and value columns' types so far: each window checks only its own
        # rows, and a batch touching only new windows would otherwise change a type
        # unnoticed (until a snapshot failed to put the windows' tables together).
        self._key_type: pa.DataType | None = None
        self._value_type: pa.DataType | None = None

    def _check_types(self, batch: pa.RecordBatch) -> None:
        """A key or value column whose type changed between batches is refused, as a
        rolling aggregation refuses it."""
        schema = batch.schema
        key = self.agg.key
        if key in schema.names:  # else the window's own check names the missing column
            where = f"{self.ctx.task_name}: key column {key!r}"
            self._key_type = checked_key_type(self._key_type, schema.field(key).type, where)
        value = self.agg.value
        if not value or value not in schema.names:
            return  # no value column (counts), or the window's own check names it
        kind = schema.field(value).type
        self._value_type = checked_value_type(self._value_type, kind, self.ctx.task_name, value)

    def _window(self, start: int) -> ColumnarAggregates:
        window = self.windows.get(start)
        if window is None:
            agg = self.agg
            window = self.windows[start] = ColumnarAggregates(
                agg.kind,
                key=agg.key,
                value=agg.value,
                max_parallelism=self.ctx.max_parallelism,
                where=self.ctx.task_name,
                backend=self.keyed,
                name=window_table_name(agg.kind, start),
            )
        return window

    def _fire_due(self, time: int) -> None:
        """Emit and drop every window whose end - 1 ``time`` reached, oldest first."""
        size = self.agg.size
        for start in sorted(s for s in self.windows if s + size - 1 <= time):
            window = self.windows.pop(start)
            keys, values = window.result()
            assert self.keyed is not None
            self.keyed.drop_column_table(window.name)
            n = len(keys)
            self.output.collect(
                pa.record_batch(
                    [
                        keys,
                        pa.array(np.full(n, start, dtype=np.int64)),
                        pa.array(np.full(n, start + size, dtype=np.int64)),
                        values,
                        pa.array(np.full(n, start + size - 1, dtype=np.int64)),
                    ],
                    names=[
                        self.agg.key,
                        "window_start",
                        "window_end",
                        _out_name(self.agg),
                        TS_COLUMN,
                    ],
                ),
                None,
            )

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        for name in self.keyed.column_tables():
            start = window_of_table(name)
            if start is None or state_of_table(name) != self.agg.kind:
                raise StateError(
                    f"{self.ctx.task_name}: restored columnar state {name!r} is not this "
                    "window aggregation's; give the new operator another uid"
                )
            window = self._window(start)
            window.attach()
            self._value_type = self._value_type or window.value_type

    def state_table(self) -> pa.Table:
        """Every open window's state (``_kg``, ``_key``, ``acc``, ``count``,
        ``_window_start``): tests, tools."""
        tables = [(w.name, w.state_table()) for w in self.windows.values()]
        if not tables:
            return pa.table({KG_COLUMN: pa.array([], pa.int32())})
        return state_file_table(tables)


class ColumnarWindowOperator(ColumnarWindowAggregates):
    """Tumbling/sliding event-time window aggregation on record batches.

    Rows are assigned to windows with vector arithmetic on ``_ts``; a window fires when
    the watermark passes its end. Rows of windows the watermark passed already are late
    and dropped (counted in the ``late_records_dropped`` metric).
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.watermark = -(2**63)

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        if TS_COLUMN not in batch.schema.names:
            raise DataError(
                f"{self.ctx.task_name}: event-time windows need event time; give the source "
                "a watermark strategy with .with_timestamp_column(name)"
            )
        self._check_types(batch)
        agg = self.agg
        late, windows = window_starts(
            event_times(batch, self.ctx.task_name), agg.size, agg.slide, agg.offset, self.watermark
        )
        self.counters.late_records_dropped += late
        for start, rows in windows:
            self._window(start).fold(batch.filter(pa.array(rows)))

    def process_watermark(self, watermark: int) -> None:
        self.watermark = watermark
        self._fire_due(watermark)
        self.emit_watermark(watermark)


def _out_name(agg: WindowAggregateSpec) -> str:
    return "count" if agg.kind == "count" else str(agg.value)
