"""Columnar session windows and processing-time windows (Arrow record batches).

- :class:`ColumnarSessionOperator`: event-time session windows (``EventTimeSessionWindows
  .with_gap``) with the semantics of the row path's window operator: a row opens the
  window ``[ts, ts + gap)``; windows of a key that overlap or touch merge; a session
  fires when the watermark reaches its end - 1; a row is late (dropped, counted in the
  ``late_records_dropped`` metric) when the session it would join has fired already.
- :class:`ColumnarProcessingTimeWindowOperator`: tumbling/sliding processing-time
  windows: a whole batch goes into the window(s) of the operator clock's time when it
  arrives; a window fires when the clock passes its end, and every open window fires at
  the end of a bounded input (the final watermark).

Both emit batches of the key column, ``window_start``, ``window_end``, the value column
(``count`` for counts) and ``_ts = window_end - 1``, and checkpoint their open windows
per key group (``_kg``) like :class:`~epochstream.runtime.operators.columnar_aggregates.ColumnarWindowOperator`.

Example::

    op = ColumnarSessionOperator(spec, ctx)   # spec.payload = SessionWindowSpec("count", "k", None, 10_000)
    op.process_batch(batch, None)              # columns k, _ts
    op.process_watermark(60_000)               # sessions ending by 60 s are emitted
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.events import MAX_WATERMARK
from epochstream.exceptions import DataError, StateError
from epochstream.graph.specs import SessionWindowSpec, WindowAggregateSpec
from epochstream.runtime.operators.columnar_aggregates import (
    ColumnarKeyedOperator,
    ColumnarWindowAggregates,
)
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.columnar_aggregates import STATE_KEY, state_keys
from epochstream.state.columnar_checks import (
    IntSumGuard,
    check_value_range,
    checked_value_type,
    event_times,
    require_columns,
    value_type_of,
    with_value_type,
)
from epochstream.state.key_index import KeyIndex

__all__ = [
    "ColumnarProcessingTimeWindowOperator",
    "ColumnarSessionOperator",
    "merge_sessions",
]

_WINDOW_START = "_window_start"
_WINDOW_END = "_window_end"


def _segment_cummax(values: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` restarting at every ``segment`` (non-decreasing ids).

    Each segment is lifted above the ones before it, so one ``maximum.accumulate``
    never carries a maximum across segments. When times span too far for that (the
    lift would overflow int64) their ranks, which span at most ``len(values)``, stand in.
    """
    if not len(values):
        return values.copy()
    low = int(values.min())
    span = int(values.max()) - low + 1
    if int(segment[-1] + 1) * span < 2**62:
        lift = segment.astype(np.int64) * span
        return np.maximum.accumulate(values - low + lift) - lift + low
    distinct, rank = np.unique(values, return_inverse=True)
    lift = segment.astype(np.int64) * len(distinct)
    return distinct[np.maximum.accumulate(rank.reshape(-1) + lift) - lift]


def merge_sessions(
    slot: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    acc: np.ndarray,
    count: np.ndarray,
    kind: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge the intervals ``[start, end)`` of each key ``slot`` that overlap or touch.

    Sorted by (slot, start), an interval opens a new session when its key changes or it
    starts after every end before it in its key (a running maximum); the sessions'
    ends, accumulators (``kind``: add, min or max) and value counts are ``reduceat``
    over those bounds. Returns ``(slot, start, end, acc, count)`` of the sessions.

    Example::

        merge_sessions(np.array([0, 0, 0]), np.array([0, 10, 30]), np.array([10, 20, 40]),
                       np.array([1, 1, 1]), np.array([1, 1, 1]), "count")
        # -> slots [0, 0], starts [0, 30], ends [20, 40], accs [2, 1], counts [2, 1]
    """
    order = np.lexsort((start, slot))
    slot, start, end = slot[order], start[order], end[order]
    n = len(slot)
    new_key = np.empty(n, dtype=bool)
    new_key[:1] = True
    np.not_equal(slot[1:], slot[:-1], out=new_key[1:])
    reach = _segment_cummax(end, np.cumsum(new_key) - 1)
    opens = new_key.copy()
    opens[1:] |= start[1:] > reach[:-1]
    bounds = np.flatnonzero(opens)
    if kind == "min":
        merged = np.minimum.reduceat(acc[order], bounds)
    elif kind == "max":
        merged = np.maximum.reduceat(acc[order], bounds)
    else:
        merged = np.add.reduceat(acc[order], bounds)
    return (
        slot[bounds],
        start[bounds],
        np.maximum.reduceat(end, bounds),
        merged,
        np.add.reduceat(count[order], bounds),
    )


class _WindowedValues:
    """Per-row contributions of the value column and the windows' output values."""

    def __init__(self, kind: str, key: str, value: str | None, where: str) -> None:
        self.kind, self.key, self.value, self.where = kind, key, value, where
        self.out_name = "count" if kind == "count" else str(value)
        self.value_type: pa.DataType | None = None
        self.acc_dtype: Any = np.float64 if kind == "mean" else np.int64

    def check(self, batch: pa.RecordBatch) -> None:
        names = batch.schema.names
        require_columns(batch.schema, (self.key, self.value), self.where)
        if TS_COLUMN not in names:
            raise DataError(
                f"{self.where}: event-time session windows need event time; give the "
                "source a watermark strategy with .with_timestamp_column(name)"
            )
        if not self.value:
            return
        check_value_range(batch.column(self.value), self.where, self.value)
        first = self.value_type
        kind = batch.schema.field(self.value).type
        self.value_type = checked_value_type(first, kind, self.where, self.value)
        if first is None and pa.types.is_floating(kind):
            self.acc_dtype = np.float64

    def identity(self) -> Any:
        if self.kind not in ("min", "max"):
            return 0
        if self.acc_dtype == np.float64:
            return np.inf if self.kind == "min" else -np.inf
        info = np.iinfo(np.int64)
        return info.max if self.kind == "min" else info.min

    def rows(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        """Each row's accumulator contribution and value count (0 for a null value)."""
        n = batch.num_rows
        if self.kind == "count":
            ones = np.ones(n, dtype=np.int64)
            return ones, ones
        column = batch.column(self.value)
        if column.null_count:
            valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
            column = pc.fill_null(column, 0)
        else:
            valid = np.ones(n, dtype=bool)
        acc = column.to_numpy(zero_copy_only=False).astype(self.acc_dtype, copy=False)
        if not valid.all():
            acc = np.where(valid, acc, np.array(self.identity(), dtype=self.acc_dtype))
        return acc, valid.astype(np.int64)

    def output(self, acc: np.ndarray, count: np.ndarray) -> pa.Array:
        """The windows' values (null where a window saw only null values)."""
        if self.kind == "count":
            return pa.array(acc)
        if self.kind == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                values = acc / count
        else:
            values = acc
        array = pa.array(values, mask=count == 0)
        if self.kind in ("min", "max") and self.value_type is not None:
            return array.cast(self.value_type)
        return array


class _KeySlots:
    """Dense slots of the keys (a :class:`KeyIndex`) and each slot's key group."""

    def __init__(self, max_parallelism: int, name: str) -> None:
        self.index = KeyIndex(name)
        self.max_parallelism = max_parallelism
        self.key_group = np.empty(0, dtype=np.int32)

    def of_rows(self, keys: pa.Array) -> np.ndarray:
        """The slot of every row's key (repeats allowed); new keys get slots."""
        rows = self.index.row_slots(keys)
        if rows is not None:
            slots, fresh = rows
        else:
            encoded = keys.dictionary_encode(null_encoding="encode")
            distinct, new = self.index.slots(encoded.dictionary)
            slots = distinct[encoded.indices.to_numpy(zero_copy_only=False)]
            fresh = distinct[new]
        if len(fresh):
            if len(self.key_group) < self.index.size:  # doubling: O(1) amortized per key
                self.key_group = np.resize(
                    self.key_group, max(self.index.size, 2 * len(self.key_group))
                )
            self.key_group[fresh] = key_groups_of_column(
                self.index.keys_at(fresh), self.max_parallelism
            )
        return slots.astype(np.int64, copy=False)


def _window_batch(
    key: str, keys: pa.Array, start: np.ndarray, end: np.ndarray, values: pa.Array, out_name: str
) -> pa.RecordBatch:
    return pa.record_batch(
        [keys, pa.array(start), pa.array(end), values, pa.array(end - 1)],
        names=[key, "window_start", "window_end", out_name, TS_COLUMN],
    )


class ColumnarSessionOperator(ColumnarKeyedOperator):
    """Event-time session windows on record batches, merged and aggregated with vector
    operations (no per-row Python).

    Open sessions are five parallel arrays (key slot, start, end, accumulator, value
    count). A batch takes the open sessions of the keys it touches plus one interval
    ``[ts, ts + gap)`` per accepted row and :func:`merge_sessions` them; the other keys'
    sessions stay as they are. A watermark emits, in order of end, every session whose
    end - 1 it reached. The ``late_records_dropped`` metric counts the rows dropped
    because their session had fired.

    Example::

        op = create_operator(spec, ctx)     # kind "columnar_session_window", gap 100
        op.process_batch(pa.record_batch([pa.array(["s", "s"]), pa.array([0, 100])],
                                         names=["k", "_ts"]), None)
        op.process_watermark(199)           # emits k="s", window_start=0, window_end=200, count=2
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.agg: SessionWindowSpec = spec.payload
        self.values = _WindowedValues(self.agg.kind, self.agg.key, self.agg.value, ctx.task_name)
        self.keys = _KeySlots(ctx.max_parallelism, f"{ctx.task_name}: key column {self.agg.key!r}")
        self.slot = np.empty(0, dtype=np.int64)
        self.start = np.empty(0, dtype=np.int64)
        self.end = np.empty(0, dtype=np.int64)
        self.acc = np.empty(0, dtype=self.values.acc_dtype)
        self.count = np.empty(0, dtype=np.int64)
        self.watermark = -(2**63)
        self.sums = (
            IntSumGuard(ctx.task_name, str(self.agg.value)) if self.agg.kind == "sum" else None
        )

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        self.values.check(batch)
        ts = event_times(batch, self.ctx.task_name)
        slots = self.keys.of_rows(batch.column(self.agg.key))
        acc, count = self.values.rows(batch)
        accepted = self._accepted(slots, ts)
        if accepted is not None:
            self.counters.late_records_dropped += int(len(ts) - accepted.sum())
            slots, ts, acc, count = slots[accepted], ts[accepted], acc[accepted], count[accepted]
            if not len(ts):
                return
        if self.acc.dtype != acc.dtype:
            self.acc = self.acc.astype(acc.dtype)
        risky = (
            self.sums is not None
            and acc.dtype == np.int64
            and self.sums.risky(batch.column(str(self.agg.value)), self._held)
        )
        touched = np.zeros(self.keys.index.size, dtype=bool)
        touched[slots] = True
        involved = touched[self.slot]
        kept = ~involved
        parts = (
            np.concatenate([self.slot[involved], slots]),
            np.concatenate([self.start[involved], ts]),
            np.concatenate([self.end[involved], ts + self.agg.gap]),
            np.concatenate([self.acc[involved], acc]),
            np.concatenate([self.count[involved], count]),
        )
        merged = merge_sessions(*parts, self.agg.kind)
        if risky:
            assert self.sums is not None
            shadow = merge_sessions(
                *parts[:3], parts[3].astype(np.float64), parts[4], self.agg.kind
            )
            self.sums.check(
                merged[3],
                shadow[3],
                lambda i: self.keys.index.keys_at(merged[0][i : i + 1])[0].as_py(),
            )
        self._set(
            *(
                np.concatenate([old[kept], new])
                for old, new in zip(
                    (self.slot, self.start, self.end, self.acc, self.count), merged, strict=True
                )
            )
        )

    def _held(self) -> float:
        return float(np.abs(self.acc.astype(np.float64)).max()) if len(self.acc) else 0.0

    def _set(
        self,
        slot: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        acc: np.ndarray,
        count: np.ndarray,
    ) -> None:
        self.slot, self.start, self.end, self.acc, self.count = slot, start, end, acc, count

    def _accepted(self, slots: np.ndarray, ts: np.ndarray) -> np.ndarray | None:
        """Which rows join a session (``None``: all of them).

        A row whose own window ``[ts, ts + gap)`` the watermark has passed joins only a
        session it touches that is still open when the row comes: an open session of
        its key starting by ``ts + gap``, or a session of earlier accepted rows of its
        key (those reach past the watermark too), so some start by ``ts + gap``. Rows
        accepted that way let later ones in, so the test repeats, each round on whole
        columns, until no row changes (rounds: the longest such chain, usually one).
        """
        gap = self.agg.gap
        late = ts + (gap - 1) <= self.watermark
        if not late.any():
            return None
        far = int(ts.max()) + gap + 1  # above every threshold ts + gap
        first_open = np.full(self.keys.index.size, far, dtype=np.int64)
        np.minimum.at(first_open, self.slot, self.start)
        order = np.argsort(slots, kind="stable")  # by key, in arrival order within a key
        slots_o, ts_o, late_o = slots[order], ts[order], late[order]
        first = np.empty(len(order), dtype=bool)
        first[:1] = True
        np.not_equal(slots_o[1:], slots_o[:-1], out=first[1:])
        segment = np.cumsum(first) - 1
        bound = first_open[slots_o]
        accepted = ~late_o
        while True:
            # The earliest start among accepted rows before each row of its key.
            starts = np.where(accepted, ts_o, far)
            earliest = -_segment_cummax(-starts, segment)
            before = np.empty(len(order), dtype=np.int64)
            before[:1] = far
            before[1:] = earliest[:-1]
            before[first] = far
            now = accepted | (np.minimum(bound, before) <= ts_o + gap)
            if np.array_equal(now, accepted):
                break
            accepted = now
        result = np.empty(len(order), dtype=bool)
        result[order] = accepted
        return result

    def process_watermark(self, watermark: int) -> None:
        self.watermark = watermark
        due = self.end - 1 <= watermark
        if due.any():
            order = np.flatnonzero(due)
            order = order[np.lexsort((self.start[order], self.end[order]))]
            values = self.values.output(self.acc[order], self.count[order])
            self.output.collect(
                _window_batch(
                    self.agg.key,
                    self.keys.index.keys_at(self.slot[order]),
                    self.start[order],
                    self.end[order],
                    values,
                    self.values.out_name,
                ),
                None,
            )
            keep = ~due
            self._set(
                self.slot[keep], self.start[keep], self.end[keep], self.acc[keep], self.count[keep]
            )
        self.emit_watermark(watermark)

    def state_table(self) -> pa.Table:
        return with_value_type(self._state_columns(), self.values.value_type)

    def _state_columns(self) -> pa.Table:
        return pa.table(
            {
                KG_COLUMN: pa.array(self.keys.key_group[self.slot]),
                STATE_KEY: self.keys.index.keys_at(self.slot),
                "acc": pa.array(self.acc.copy()),
                "count": pa.array(self.count.copy()),
                _WINDOW_START: pa.array(self.start.copy()),
                _WINDOW_END: pa.array(self.end.copy()),
            }
        )

    def restore_table(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        missing = {"acc", "count", _WINDOW_START, _WINDOW_END} - set(table.column_names)
        if missing:
            raise StateError(
                f"{self.ctx.task_name}: restored state is not session-window state (no "
                f"{', '.join(sorted(missing))}); give the new operator another uid"
            )
        slots = self.keys.of_rows(state_keys(table, self.ctx.task_name).combine_chunks())
        acc = table.column("acc").to_numpy()
        self.values.acc_dtype = acc.dtype
        if self.values.value_type is None:
            self.values.value_type = value_type_of(table)
        self._set(
            np.concatenate([self.slot, slots]),
            np.concatenate([self.start, table.column(_WINDOW_START).to_numpy()]),
            np.concatenate([self.end, table.column(_WINDOW_END).to_numpy()]),
            np.concatenate([self.acc.astype(acc.dtype), acc]),
            np.concatenate([self.count, table.column("count").to_numpy()]),
        )


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
