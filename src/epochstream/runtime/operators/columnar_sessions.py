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
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.operators.columnar_aggregates import (
    ColumnarWindowAggregates,
    own_backend,
)
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.state.backends.base import RowSchema, RowTable
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.columnar_checks import (
    IntSumGuard,
    check_value_range,
    checked_value_type,
    event_times,
    require_columns,
    value_type_of,
    with_value_type,
)
from epochstream.state.handles import OperatorRestore
from epochstream.state.key_index import canonical_float_keys, checked_key_type

__all__ = [
    "ColumnarProcessingTimeWindowOperator",
    "ColumnarSessionOperator",
    "merge_sessions",
]


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


def _window_batch(
    key: str, keys: pa.Array, start: np.ndarray, end: np.ndarray, values: pa.Array, out_name: str
) -> pa.RecordBatch:
    return pa.record_batch(
        [keys, pa.array(start), pa.array(end), values, pa.array(end - 1)],
        names=[key, "window_start", "window_end", out_name, TS_COLUMN],
    )


#: The row tables of the session operator: the open sessions by key, and the keys
#: by the time their sessions are due (``end - 1`` shifted to uint64).
SESSIONS, DUE = "sessions", "sessions-due"
_KEY, _START, _END, _ACC, _COUNT, _DUE = "_key", "_start", "_end", "_acc", "_count", "_due"
#: Added to ``end - 1`` (int64) to give the due table's keys: non-negative, in order.
_SHIFT = 2**63


def _due_keys(end: np.ndarray) -> pa.Array:
    """The due table's key of sessions ending at ``end``: ``end - 1 + 2**63`` (uint64,
    ordered as the times are)."""
    return pa.array((end - 1).astype(np.int64).view(np.uint64) + np.uint64(_SHIFT))


def _new_pairs(
    slot: np.ndarray, end: np.ndarray, old_slot: np.ndarray, old_end: np.ndarray
) -> np.ndarray:
    """Which ``(slot, end)`` pairs are not among the ``(old_slot, old_end)`` pairs.

    Each pair is one int64 (``slot * span + end - low``) when the slots times the ends'
    span fit, so one ``isin`` compares them; else rows of a 2-column array are ranked
    (slower: ``unique`` sorts the rows).
    """
    if not len(old_slot):
        return np.ones(len(slot), dtype=bool)
    ends = np.concatenate([end, old_end])
    low = int(ends.min())
    span = int(ends.max()) - low + 1
    if (int(max(slot.max(initial=0), old_slot.max())) + 1) * span < 2**62:
        return ~np.isin(slot * span + (end - low), old_slot * span + (old_end - low))
    pairs = np.stack([np.concatenate([slot, old_slot]), ends], axis=1)
    _, ids = np.unique(pairs, axis=0, return_inverse=True)
    ids = ids.reshape(-1)
    return ~np.isin(ids[: len(slot)], ids[len(slot) :])


class _Sessions:
    """Sessions of a row table (``table``) as NumPy columns: each session's key (a slot
    into ``keys``, the distinct keys they were popped for), start, end, accumulator and
    value count."""

    def __init__(self, keys: pa.Array, table: pa.Table) -> None:
        self.slot = _slots(table.column(_KEY), keys)
        self.start = table.column(_START).to_numpy()
        self.end = table.column(_END).to_numpy()
        self.acc = table.column(_ACC).to_numpy()
        self.count = table.column(_COUNT).to_numpy()


def _slots(column: pa.ChunkedArray | pa.Array, keys: pa.Array) -> np.ndarray:
    """The position in ``keys`` (distinct) of every value of ``column``."""
    found = pc.index_in(column, value_set=keys, skip_nulls=False)
    if isinstance(found, pa.ChunkedArray):
        found = found.combine_chunks()
    return found.to_numpy(zero_copy_only=False).astype(np.int64)


class ColumnarSessionOperator(Operator):
    """Event-time session windows on record batches, merged and aggregated with vector
    operations (no per-row Python).

    The open sessions are a row table of the job's keyed-state backend
    (``env.set_state_backend``; :meth:`KeyedStateBackend.row_table`), ``sessions``:
    per key its sessions (``_key``, ``_start``, ``_end``, ``_acc``, ``_count``). A
    batch pops the open sessions of the keys it touches (:meth:`RowTable.pop`),
    :func:`merge_sessions` them with one interval ``[ts, ts + gap)`` per accepted row,
    and appends those keys' sessions back; the other keys' sessions are not read. A second row table,
    ``sessions-due``, files each key under the time its session is due (``end - 1``,
    shifted to a non-negative uint64), so a watermark takes out only the keys whose
    sessions may be due (:meth:`RowTable.pop_until`), pops their sessions, emits, in
    order of end, every session whose end - 1 it reached and puts the others back (a
    key filed under a session that merged into a later one since is filed under that
    end too). On RocksDB the state is bounded by the
    disk, not memory. The ``late_records_dropped`` metric counts the rows dropped
    because their session had fired.

    Example::

        op = create_operator(spec, ctx)     # kind "columnar_session_window", gap 100
        op.process_batch(pa.record_batch([pa.array(["s", "s"]), pa.array([0, 100])],
                                         names=["k", "_ts"]), None)
        op.process_watermark(199)           # emits k="s", window_start=0, window_end=200, count=2
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        #: The key groups of this subtask (those its backend holds).
        self.key_groups = self.keyed.key_group_range
        self.agg: SessionWindowSpec = spec.payload
        self.values = _WindowedValues(self.agg.kind, self.agg.key, self.agg.value, ctx.task_name)
        self.watermark = -(2**63)
        self.sums = (
            IntSumGuard(ctx.task_name, str(self.agg.value)) if self.agg.kind == "sum" else None
        )
        self._sessions: RowTable | None = None
        self._due: RowTable | None = None
        self._key_type: pa.DataType | None = None

    # ---------------------------------------------------------------- state

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        other = [n for n in self.keyed.row_tables() if n not in (SESSIONS, DUE)]
        other += self.keyed.column_tables()
        if other:
            raise StateError(
                f"{self.ctx.task_name}: restored state is not session-window state (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )
        sessions = self.keyed.row_table(SESSIONS)
        if sessions is None:
            return
        schema = sessions.schema.schema
        self._key_type = schema.field(_KEY).type
        self.values.acc_dtype = np.dtype(schema.field(_ACC).type.to_pandas_dtype())
        self.values.value_type = value_type_of(schema.empty_table())
        self._sessions = sessions
        self._due = self.keyed.row_table(DUE)

    def _tables(self) -> tuple[RowTable, RowTable]:
        """The row tables, made at the first batch (its key and value types)."""
        if self._sessions is None or self._due is None:
            assert self.keyed is not None and self._key_type is not None
            acc_type = pa.from_numpy_dtype(np.dtype(self.values.acc_dtype))
            schema = pa.schema(
                [
                    (_KEY, self._key_type),
                    (_START, pa.int64()),
                    (_END, pa.int64()),
                    (_ACC, acc_type),
                    (_COUNT, pa.int64()),
                ]
            )
            schema = with_value_type(schema.empty_table(), self.values.value_type).schema
            self._sessions = self.keyed.row_table(SESSIONS, RowSchema(schema, _KEY))
            due = pa.schema([(_DUE, pa.uint64()), (_KEY, self._key_type)])
            self._due = self.keyed.row_table(DUE, RowSchema(due, _DUE))
        assert self._sessions is not None and self._due is not None
        return self._sessions, self._due

    def _row_keys(self, batch: pa.RecordBatch) -> pa.Array:
        """The batch's keys as state holds them: equal floats alike (``-0.0``, NaN), in
        the first batch's key type (integer widths may differ)."""
        keys = canonical_float_keys(batch.column(self.agg.key))
        first = self._key_type
        if first is None:
            self._key_type = keys.type
            return keys
        if keys.type == first:
            return keys
        where = f"{self.ctx.task_name}: key column {self.agg.key!r}"
        checked_key_type(first, keys.type, where)  # raises unless both are integers
        try:
            return keys.cast(first)
        except pa.ArrowInvalid as exc:
            raise DataError(f"{where}: keys of type {keys.type} do not fit {first}: {exc}") from exc

    def _write(
        self, keys: pa.Array, merged: tuple[np.ndarray, ...], filed: tuple[np.ndarray, np.ndarray]
    ) -> None:
        """Store ``merged`` sessions (slots into ``keys``, whose sessions were popped),
        and file as due the ``(slot, end)`` pairs not ``filed`` already."""
        sessions, due = self._tables()
        slot, start, end, acc, count = merged
        max_p = self.ctx.max_parallelism
        if not len(slot):
            return
        session_keys = keys.take(pa.array(slot))
        kgs = key_groups_of_column(session_keys, max_p)
        sessions.append(
            pa.record_batch(
                [session_keys, pa.array(start), pa.array(end), pa.array(acc), pa.array(count)],
                schema=sessions.schema.schema,
            ),
            kgs,
        )
        fresh = _new_pairs(slot, end, *filed)
        if fresh.any():
            due.append(
                pa.record_batch(
                    [_due_keys(end[fresh]), session_keys.filter(pa.array(fresh))],
                    schema=due.schema.schema,
                ),
                kgs[fresh],
            )

    # ---------------------------------------------------------------- batches

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        self.values.check(batch)
        ts = event_times(batch, self.ctx.task_name)
        row_keys = self._row_keys(batch)
        acc, count = self.values.rows(batch)
        sessions, _ = self._tables()
        keys = pc.unique(row_keys)
        # The keys' sessions come out of the table and go back merged below.
        old = _Sessions(
            keys, sessions.pop(keys, key_groups_of_column(keys, self.ctx.max_parallelism))
        )
        slots = _slots(row_keys, keys)
        accepted = self._accepted(slots, ts, old, len(keys))
        if accepted is not None:
            self.counters.late_records_dropped += int(len(ts) - accepted.sum())
            slots, ts, acc, count = slots[accepted], ts[accepted], acc[accepted], count[accepted]
            if not len(ts) and not len(old.slot):
                return
        risky = (
            self.sums is not None
            and acc.dtype == np.int64
            and self.sums.risky(
                batch.column(str(self.agg.value)),
                lambda: float(np.abs(old.acc.astype(np.float64)).max()) if len(old.acc) else 0.0,
            )
        )
        parts = (
            np.concatenate([old.slot, slots]),
            np.concatenate([old.start, ts]),
            np.concatenate([old.end, ts + self.agg.gap]),
            np.concatenate([old.acc.astype(acc.dtype, copy=False), acc]),
            np.concatenate([old.count, count]),
        )
        merged = merge_sessions(*parts, self.agg.kind)
        if risky:
            assert self.sums is not None
            shadow = merge_sessions(
                *parts[:3], parts[3].astype(np.float64), parts[4], self.agg.kind
            )
            self.sums.check(merged[3], shadow[3], lambda i: keys[int(merged[0][i])].as_py())
        self._write(keys, merged, (old.slot, old.end))

    def _accepted(
        self, slots: np.ndarray, ts: np.ndarray, old: _Sessions, keys: int
    ) -> np.ndarray | None:
        """Which rows join a session (``None``: all of them).

        A row whose own window ``[ts, ts + gap)`` the watermark has passed joins only a
        session it touches that is still open when the row comes: an open session of
        its key starting by ``ts + gap``, or a session of earlier accepted rows of its
        key (those reach past the watermark too), so some start by ``ts + gap``. Rows
        accepted that way let later ones in, so the test repeats, each round on whole
        columns, until no row changes (rounds: the longest such chain, usually one).
        ``slots`` and ``old.slot`` index the batch's ``keys`` distinct keys.
        """
        gap = self.agg.gap
        late = ts + (gap - 1) <= self.watermark
        if not late.any():
            return None
        far = int(ts.max()) + gap + 1  # above every threshold ts + gap
        first_open = np.full(keys, far, dtype=np.int64)
        np.minimum.at(first_open, old.slot, old.start)
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
        if self._sessions is not None and self._due is not None:
            self._fire(watermark)
        self.emit_watermark(watermark)

    def _fire(self, watermark: int) -> None:
        """Emit, in order of end, the sessions whose end - 1 ``watermark`` reached."""
        assert self._sessions is not None and self._due is not None
        filed = self._due.pop_until(watermark + _SHIFT)
        if not filed.num_rows:
            return
        keys = pc.unique(filed.column(_KEY).combine_chunks())
        old = _Sessions(
            keys, self._sessions.pop(keys, key_groups_of_column(keys, self.ctx.max_parallelism))
        )
        due = old.end - 1 <= watermark
        order = np.flatnonzero(due)
        order = order[np.lexsort((old.start[order], old.end[order]))]
        if len(order):
            self._emit(keys, old, order)
        # The other sessions of these keys go back (filed under their own ends already).
        keep = ~due
        kept = (old.slot[keep], old.start[keep], old.end[keep], old.acc[keep], old.count[keep])
        self._write(keys, kept, (kept[0], kept[2]))

    def _emit(self, keys: pa.Array, old: _Sessions, order: np.ndarray) -> None:
        """Emit the sessions at ``order`` of ``old`` as one batch."""
        self.output.collect(
            _window_batch(
                self.agg.key,
                keys.take(pa.array(old.slot[order])),
                old.start[order],
                old.end[order],
                self.values.output(old.acc[order], old.count[order]),
                self.values.out_name,
            ),
            None,
        )

    def state_table(self) -> pa.Table:
        """The open sessions (``_kg``, ``_key``, ``_start``, ``_end``, ``_acc``,
        ``_count``): tests, tools."""
        if self._sessions is None:
            return pa.table({KG_COLUMN: pa.array([], pa.int32())})
        return self._sessions.table()


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
