"""Columnar session windows (Arrow record batches).

- :class:`ColumnarSessionOperator`: event-time session windows (``EventTimeSessionWindows
  .with_gap``) with the semantics of the row path's window operator: a row opens the
  window ``[ts, ts + gap)``; windows of a key that overlap or touch merge; a session
  fires when the watermark reaches its end - 1; a row is late (dropped, counted in the
  ``late_records_dropped`` metric) when the session it would join has fired already.
- :class:`ColumnarSessionAggregateOperator`: the same sessions with any keys and SQL
  aggregates (SESSION window aggregation).

The single-aggregate operator emits batches of the key column, ``window_start``, ``window_end``, the value column
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
from epochstream.core.arrow import table_batch
from epochstream.exceptions import DataError, StateError
from epochstream.graph.specs import SessionAggregateSpec, SessionWindowSpec
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.operators.columnar_aggregates import (
    own_backend,
)
from epochstream.runtime.operators.columnar_group_keys import TUPLE_KEY, GroupKeys, key_slots
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.runtime.operators.columnar_window_aggregates import (
    AggregateCalls,
    check_aggregate_input,
)
from epochstream.state.backends.base import RowSchema, RowTable
from epochstream.state.column_keygroups import (
    key_groups_of_column,
)
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
    "ColumnarSessionAggregateOperator",
    "ColumnarSessionOperator",
    "accepted_rows",
    "merge_sessions",
    "session_runs",
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


def session_runs(
    slot: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The merged sessions of intervals ``[start, end)`` per key ``slot``: ``(order,
    bounds)``, ``order`` sorting the intervals by (slot, start) and ``bounds`` the
    positions in that order where a session opens (its key changes, or it starts after
    every end before it in its key: a running maximum). Intervals that overlap or touch
    are one session.

    Example::

        order, bounds = session_runs(np.array([0, 0, 0]), np.array([30, 0, 10]),
                                     np.array([40, 10, 20]))
        # order [1, 2, 0]: sessions open at positions [0, 2] (intervals 1+2, and 0)
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
    return order, np.flatnonzero(opens)


def merge_sessions(
    slot: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    acc: np.ndarray,
    count: np.ndarray,
    kind: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge the intervals ``[start, end)`` of each key ``slot`` that overlap or touch
    (:func:`session_runs`); the sessions' ends, accumulators (``kind``: add, min or max)
    and value counts are ``reduceat`` over their runs. Returns ``(slot, start, end, acc,
    count)`` of the sessions.

    Example::

        merge_sessions(np.array([0, 0, 0]), np.array([0, 10, 30]), np.array([10, 20, 40]),
                       np.array([1, 1, 1]), np.array([1, 1, 1]), "count")
        # -> slots [0, 0], starts [0, 30], ends [20, 40], accs [2, 1], counts [2, 1]
    """
    order, bounds = session_runs(slot, start, end)
    if kind == "min":
        merged = np.minimum.reduceat(acc[order], bounds)
    elif kind == "max":
        merged = np.maximum.reduceat(acc[order], bounds)
    else:
        merged = np.add.reduceat(acc[order], bounds)
    return (
        slot[order][bounds],
        start[order][bounds],
        np.maximum.reduceat(end[order], bounds),
        merged,
        np.add.reduceat(count[order], bounds),
    )


def accepted_rows(
    slots: np.ndarray,
    ts: np.ndarray,
    open_slot: np.ndarray,
    open_start: np.ndarray,
    keys: int,
    gap: int,
    watermark: int,
) -> np.ndarray | None:
    """Which rows join a session (``None``: all of them).

    A row whose own window ``[ts, ts + gap)`` the watermark has passed joins only a
    session it touches that is still open when the row comes: an open session of its
    key starting by ``ts + gap`` (``open_slot``, ``open_start``), or a session of
    earlier accepted rows of its key (those reach past the watermark too), so some start
    by ``ts + gap``. Rows accepted that way let later ones in, so the test repeats, each
    round on whole columns, until no row changes (rounds: the longest such chain,
    usually one). ``slots`` and ``open_slot`` index ``keys`` distinct keys.

    Example: ``accepted_rows(np.array([0]), np.array([5]), np.array([0]), np.array([9]),
    1, 10, 100)`` is ``[True]`` (the late row touches the open session at 9).
    """
    late = ts + (gap - 1) <= watermark
    if not late.any():
        return None
    far = int(ts.max()) + gap + 1  # above every threshold ts + gap
    first_open = np.full(keys, far, dtype=np.int64)
    np.minimum.at(first_open, open_slot, open_start)
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
        self.slot = key_slots(table.column(_KEY), keys)
        self.start = table.column(_START).to_numpy()
        self.end = table.column(_END).to_numpy()
        self.acc = table.column(_ACC).to_numpy()
        self.count = table.column(_COUNT).to_numpy()


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
        slots = key_slots(row_keys, keys)
        accepted = accepted_rows(
            slots, ts, old.slot, old.start, len(keys), self.agg.gap, self.watermark
        )
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


#: The session aggregation's row tables: per key its open sessions (``sessions``) and
#: the distinct values of each ``COUNT(DISTINCT)`` aggregate ``i`` per session
#: (``distinct<i>``), and the keys by due time (``sessions-due``, as above).
_DISTINCT = "distinct"
#: A session's key group in the due table (the key's: to pop the key's rows again).
_DUE_KG = "_sa_kg"
#: A session's number within one batch or firing (the partials' group_by key).
_ID = "_sa_id"
_TS_TYPE = pa.timestamp("ms")


class _Open:
    """The open sessions of some keys, popped from the state: the rows of ``sessions``
    (``table``) with each one's key as a slot into those keys (``slot``), ``start``
    and ``end``, and per ``COUNT(DISTINCT)`` aggregate the rows of its distinct values
    (``distinct[i]``: key, ``_start``, value)."""

    def __init__(self, keys: pa.Array, table: pa.Table, distinct: dict[int, pa.Table]) -> None:
        self.table = table
        self.key = table.schema.names[0]
        self.slot = key_slots(table.column(self.key), keys)
        self.start = table.column(_START).to_numpy()
        self.end = table.column(_END).to_numpy()
        self.distinct = distinct

    def distinct_of(self, i: int, keys: pa.Array) -> tuple[pa.Array, np.ndarray]:
        """Aggregate ``i``'s distinct values and, per value, the index of its session
        among these (``keys``: the distinct keys ``slot`` points into)."""
        rows = self.distinct.get(i)
        if rows is None:  # no table restored (it was empty)
            return pa.array([], pa.null()), np.empty(0, np.int64)
        sessions = pa.table({"slot": self.slot, _START: self.start, _ID: np.arange(len(self.slot))})
        found = pa.table(
            {
                "slot": key_slots(rows.column(self.key), keys),
                _START: rows.column(_START),
                "value": rows.column(2),
            }
        ).join(sessions, ["slot", _START], join_type="inner", use_threads=False)
        return found.column("value").combine_chunks(), found.column(_ID).to_numpy()


class ColumnarSessionAggregateOperator(Operator):
    """Flink SQL's session window aggregation on record batches: any number of keys and
    aggregates (``COUNT``, ``COUNT(DISTINCT)``, ``SUM``, ``MIN``, ``MAX``, ``AVG``, with
    ``FILTER``) per session of event time, the sessions as :class:`ColumnarSessionOperator`
    cuts them (a row opens ``[ts, ts + gap)``; a key's overlapping or touching sessions
    merge; a session fires when the watermark reaches its end - 1; rows whose session
    fired are late: dropped, counted in ``late_records_dropped``).

    State, in row tables of the job's keyed-state backend, keyed by the group key (the
    key column, or the ``encode_key`` bytes of several or none, ``_sa_key``):
    ``sessions`` holds per key its open sessions (the key columns, ``_start``, ``_end``
    and the partial aggregates of :class:`AggregateCalls`), ``distinct<i>`` the distinct
    values of ``COUNT(DISTINCT)`` aggregate ``i`` per session (key, ``_start``, value)
    and ``sessions-due`` the keys by the time their sessions are due. A batch pops the
    open sessions (and distinct values) of the keys it touches, merges them with one
    interval per row (:func:`session_runs`), folds the rows into per-session partials
    with one Arrow ``group_by`` and merges those with the open sessions' by a second,
    and appends the keys' sessions back; a watermark pops only the keys filed as due.
    Partials rather than rows: a session costs its aggregates' size, not its rows'.

    Output batches: the key columns, ``window_start``, ``window_end``
    (``timestamp[ms]``), each aggregate's ``output`` column and ``_ts = window_end - 1``,
    in order of end per watermark.

    Example::

        op = create_operator(spec, ctx)   # payload SessionAggregateSpec(("k",), 100, aggs)
        op.process_batch(pa.record_batch({"k": ["s", "s"], "_ts": [0, 100]}), None)
        op.process_watermark(199)         # emits k="s", [0, 200), the aggregates
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        self.agg: SessionAggregateSpec = spec.payload
        self.keys = list(self.agg.keys)
        self.watermark = -(2**63)
        self._where = ctx.task_name
        self._keys = GroupKeys(self.agg.keys, self._where, ctx.max_parallelism)
        self._state_key = self._keys.state_key
        self._types: dict[str, pa.DataType] = {}
        self._calls: AggregateCalls | None = None  # once the first batch tells float columns
        self._sessions: RowTable | None = None
        self._due: RowTable | None = None
        self._distinct: dict[int, RowTable] = {}

    # ---------------------------------------------------------------- state

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        names = self.keyed.row_tables()
        other = [n for n in names if n not in (SESSIONS, DUE) and not _is_distinct_table(n)]
        other += self.keyed.column_tables()
        if other:
            raise StateError(
                f"{self._where}: restored state is not a session window aggregation's (it "
                f"holds {', '.join(sorted(other))}); give the new operator another uid"
            )
        sessions = self.keyed.row_table(SESSIONS)
        if sessions is None:
            return
        schema = sessions.schema.schema
        calls = AggregateCalls.restored(self.agg.aggs, schema, self._types)
        needed = {*self._bound_columns(), *(p.name for p in calls.partials)}
        distinct = {f"{_DISTINCT}{i}" for i, _ in calls.distinct}
        # Empty tables may not be restored (the backend keeps rows): a subset is fine.
        if (
            set(schema.names) != needed
            or not {n for n in names if _is_distinct_table(n)} <= distinct
        ):
            raise StateError(
                f"{self._where}: restored state does not hold this query's keys and "
                "aggregates (it was written by another query); give the new operator "
                "another uid"
            )
        for name in self.keys:  # later batches' keys are cast to the restored types
            self._types.setdefault(name, schema.field(name).type)
        self._calls = calls
        self._sessions = sessions
        self._due = self.keyed.row_table(DUE)
        for i, _ in calls.distinct:
            table = self.keyed.row_table(f"{_DISTINCT}{i}")
            if table is not None:
                self._distinct[i] = table

    def _tables(self, partials: pa.Schema, values: dict[int, pa.DataType]) -> RowTable:
        """The sessions table, and the due and distinct tables: made with the first
        batch's key, partial and value types, or restored (empty ones made again)."""
        assert self.keyed is not None
        if self._sessions is None:
            self._sessions = self.keyed.row_table(
                SESSIONS, RowSchema(_nullable(partials), self._state_key)
            )
        assert self._sessions is not None
        key_type = self._sessions.schema.schema.field(self._state_key).type
        if self._due is None:
            due = pa.schema([(_DUE, pa.uint64()), (_KEY, key_type), (_DUE_KG, pa.int32())])
            self._due = self.keyed.row_table(DUE, RowSchema(due, _DUE))
        for i, kind in values.items():
            if i not in self._distinct:
                schema = pa.schema(
                    [(self._state_key, key_type), (_START, pa.int64()), (f"_wa{i}_d", kind)]
                )
                table = self.keyed.row_table(
                    f"{_DISTINCT}{i}", RowSchema(_nullable(schema), self._state_key)
                )
                assert table is not None
                self._distinct[i] = table
        return self._sessions

    def _pop(self, keys: pa.Array, kgs: np.ndarray) -> _Open:
        """The open sessions of ``keys`` (their key groups ``kgs``), out of the state."""
        assert self._sessions is not None
        table = self._sessions.pop(keys, kgs)
        distinct = {i: t.pop(keys, kgs) for i, t in self._distinct.items()}
        return _Open(keys, table, distinct)

    # ---------------------------------------------------------------- batches

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        if TS_COLUMN not in batch.schema.names:
            raise DataError(
                f"{self._where}: session windows need event time; give the source a "
                "watermark strategy with .with_timestamp_column(name)"
            )
        calls = check_aggregate_input(batch, self.keys, self.agg.aggs, self._types, self._where)
        if self._calls is None:
            self._calls = calls
        calls = self._calls
        ts = event_times(batch, self._where)
        found = self._keys.of(batch, self._types)
        columns, keys, slots, kgs = found.columns, found.keys, found.slots, found.key_groups
        derived = calls.derived(batch)
        old = self._pop(keys, kgs) if self._sessions is not None else None
        open_slot = old.slot if old is not None else np.empty(0, np.int64)
        open_start = old.start if old is not None else np.empty(0, np.int64)
        accepted = accepted_rows(
            slots, ts, open_slot, open_start, len(keys), self.agg.gap, self.watermark
        )
        if accepted is not None:
            self.counters.late_records_dropped += int(len(ts) - accepted.sum())
            keep = pa.array(accepted)
            slots, ts = slots[accepted], ts[accepted]
            columns = {k: c.filter(keep) for k, c in columns.items()}
            derived = {k: c.filter(keep) for k, c in derived.items()}
        if not len(ts) and (old is None or not len(old.slot)):
            return
        self._merge(calls, keys, kgs, old, slots, ts, columns, derived)

    def _merge(
        self,
        calls: AggregateCalls,
        keys: pa.Array,
        kgs: np.ndarray,
        old: _Open | None,
        slots: np.ndarray,
        ts: np.ndarray,
        columns: dict[str, pa.Array],
        derived: dict[str, pa.Array],
    ) -> None:
        """Merge the accepted rows (``slots`` into ``keys``, times ``ts``) with the open
        sessions ``old`` of their keys, and put the keys' sessions back."""
        n_old = len(old.slot) if old is not None else 0
        gap = self.agg.gap
        slot = np.concatenate([old.slot, slots]) if old is not None else slots
        start = np.concatenate([old.start, ts]) if old is not None else ts
        end = np.concatenate([old.end, ts + gap]) if old is not None else ts + gap
        order, bounds = session_runs(slot, start, end)
        opens = np.zeros(len(order), dtype=np.int64)
        opens[bounds] = 1
        ids = np.empty(len(order), dtype=np.int64)
        ids[order] = np.cumsum(opens) - 1
        s_slot = slot[order][bounds]
        s_start = start[order][bounds]
        s_end = np.maximum.reduceat(end[order], bounds)

        rows = pa.table({_ID: ids[n_old:], **derived})
        grouped = rows.group_by([_ID], use_threads=False).aggregate(calls.batch_aggregations())
        parts = [calls.batch_partials(grouped, [_ID])]
        if old is not None and n_old:
            held = old.table.drop_columns(self._bound_columns())
            parts.insert(0, held.add_column(0, _ID, pa.array(ids[:n_old])))
        merged = calls.merge(pa.concat_tables(parts, promote_options="permissive"), [_ID])
        merged = merged.take(pc.sort_indices(merged.column(_ID)))
        # Every session holds a row (an old session or an accepted row): ids are 0..n-1.
        key_rows = pa.array(s_slot)
        first_row = np.full(len(keys), -1, dtype=np.int64)
        first_row[slots[::-1]] = np.arange(len(slots))[::-1]
        stored = self._stored(keys, key_rows, s_start, s_end, merged, old, columns, first_row)
        sessions = self._tables(stored.schema, self._distinct_types(calls))
        sessions.append(table_batch(stored), kgs[s_slot])
        self._keep_distinct(calls, keys, kgs, old, ids, n_old, s_slot, s_start, derived)
        filed = (old.slot, old.end) if old is not None else (np.empty(0, np.int64),) * 2
        self._file(keys, kgs, s_slot, s_end, filed)

    def _stored(
        self,
        keys: pa.Array,
        key_rows: pa.Array,
        s_start: np.ndarray,
        s_end: np.ndarray,
        merged: pa.Table,
        old: _Open | None,
        columns: dict[str, pa.Array],
        first_row: np.ndarray,
    ) -> pa.Table:
        """The sessions as ``sessions`` keeps them: state key, key columns, bounds,
        partials."""
        out: dict[str, Any] = {self._state_key: keys.take(key_rows)}
        if self._state_key == TUPLE_KEY:
            # The key columns' values per key: from a row of the batch, else an old session.
            slots = key_rows.to_numpy()
            for name in self.keys:
                values = columns[name]
                if old is not None and len(old.slot):
                    held = old.table.column(name).combine_chunks()
                    values = pa.concat_arrays([values, held.cast(values.type)])
                    fallback = np.full(len(keys), -1, dtype=np.int64)
                    fallback[old.slot[::-1]] = np.arange(len(old.slot))[::-1]
                    pick = np.where(first_row >= 0, first_row, len(columns[name]) + fallback)
                else:
                    pick = first_row
                out[name] = values.take(pa.array(pick[slots]))
        out[_START] = pa.array(s_start)
        out[_END] = pa.array(s_end)
        for name in merged.schema.names:
            if name != _ID:
                out[name] = merged.column(name)
        return pa.table(out)

    def _bound_columns(self) -> list[str]:
        """The columns of ``sessions`` other than the partials."""
        return list(dict.fromkeys([self._state_key, *self.keys, _START, _END]))

    def _distinct_types(self, calls: AggregateCalls) -> dict[int, pa.DataType]:
        """The value type of each ``COUNT(DISTINCT)`` aggregate's table."""
        return {i: self._types[str(self.agg.aggs[i].column)] for i, _ in calls.distinct}

    def _keep_distinct(
        self,
        calls: AggregateCalls,
        keys: pa.Array,
        kgs: np.ndarray,
        old: _Open | None,
        ids: np.ndarray,
        n_old: int,
        s_slot: np.ndarray,
        s_start: np.ndarray,
        derived: dict[str, pa.Array],
    ) -> None:
        """Append each session's distinct values (the old sessions' relabelled to the
        sessions they merged into, and the accepted rows')."""
        for i, column in calls.distinct:
            values = [derived[column]]
            owners = [ids[n_old:]]
            if old is not None:
                held, held_at = old.distinct_of(i, keys)
                values.insert(0, held.cast(derived[column].type))
                owners.insert(0, ids[:n_old][held_at])
            table = pa.table({_ID: np.concatenate(owners), column: pa.concat_arrays(values)})
            table = table.filter(pc.is_valid(table.column(column)))
            table = table.group_by([_ID, column], use_threads=False).aggregate([])
            owner = table.column(_ID).to_numpy()
            rows = pa.table(
                {
                    self._state_key: keys.take(pa.array(s_slot[owner])),
                    _START: pa.array(s_start[owner]),
                    column: table.column(column),
                }
            )
            if rows.num_rows:
                self._distinct[i].append(table_batch(rows), kgs[s_slot[owner]])

    def _file(
        self,
        keys: pa.Array,
        kgs: np.ndarray,
        slot: np.ndarray,
        end: np.ndarray,
        filed: tuple[np.ndarray, np.ndarray],
    ) -> None:
        """File as due the sessions ``(slot, end)`` not ``filed`` already."""
        assert self._due is not None
        fresh = _new_pairs(slot, end, *filed)
        if fresh.any():
            rows = pa.record_batch(
                [
                    _due_keys(end[fresh]),
                    keys.take(pa.array(slot[fresh])),
                    pa.array(kgs[slot[fresh]], pa.int32()),
                ],
                schema=self._due.schema.schema,
            )
            self._due.append(rows, kgs[slot[fresh]])

    # ---------------------------------------------------------------- firing

    def process_watermark(self, watermark: int) -> None:
        self.watermark = watermark
        if self._due is not None:
            self._fire(watermark)
        self.emit_watermark(watermark)

    def _fire(self, watermark: int) -> None:
        """Emit, in order of end, the sessions whose end - 1 ``watermark`` reached; the
        other sessions of their keys go back."""
        assert self._due is not None and self._sessions is not None and self._calls
        filed = self._due.pop_until(watermark + _SHIFT)
        if not filed.num_rows:
            return
        encoded = pc.dictionary_encode(filed.column(_KEY).combine_chunks(), null_encoding="encode")
        keys = encoded.dictionary
        kgs = np.empty(len(keys), dtype=np.int32)
        kgs[encoded.indices.to_numpy(zero_copy_only=False)] = filed.column(_DUE_KG).to_numpy()
        old = self._pop(keys, kgs)
        due = old.end - 1 <= watermark
        order = np.flatnonzero(due)
        order = order[np.lexsort((old.start[order], old.end[order]))]
        ids = np.full(len(old.slot), -1, dtype=np.int64)
        ids[order] = np.arange(len(order))
        distinct = {i: old.distinct_of(i, keys) for i in self._distinct}
        if len(order):
            self.output.collect(self._results(keys, old, order, ids, distinct), None)
        keep = np.flatnonzero(~due)
        if len(keep):
            self._sessions.append(table_batch(old.table.take(pa.array(keep))), kgs[old.slot[keep]])
        for i, (values, at) in distinct.items():
            back = ~due[at]
            if back.any():
                at = at[back]
                rows = pa.table(
                    {
                        self._state_key: keys.take(pa.array(old.slot[at])),
                        _START: pa.array(old.start[at]),
                        f"_wa{i}_d": values.filter(pa.array(back)),
                    }
                )
                self._distinct[i].append(table_batch(rows), kgs[old.slot[at]])

    def _results(
        self,
        keys: pa.Array,
        old: _Open,
        order: np.ndarray,
        ids: np.ndarray,
        distinct: dict[int, tuple[pa.Array, np.ndarray]],
    ) -> pa.RecordBatch:
        """The output rows of the sessions at ``order`` of ``old`` (``ids``: each open
        session's output row, -1 for those not firing)."""
        calls = self._calls
        assert calls is not None
        fired = old.table.take(pa.array(order))
        merged = fired.drop_columns(self._bound_columns())
        for i, column in calls.distinct:
            _, at = distinct[i]
            owners = ids[at]
            counts = np.bincount(owners[owners >= 0], minlength=len(order))
            merged = merged.append_column(column, pa.array(counts.astype(np.int64)))
        start, end = old.start[order], old.end[order]
        columns = [fired.column(k).combine_chunks() for k in self.keys]
        columns += [
            pa.array(start).cast(_TS_TYPE),
            pa.array(end).cast(_TS_TYPE),
            *calls.values(merged, self._where),
            pa.array(end - 1),
        ]
        names = [*self.keys, "window_start", "window_end"]
        names += [a.output for a in self.agg.aggs] + [TS_COLUMN]
        return pa.record_batch(columns, names=names)

    def state_table(self) -> pa.Table:
        """The open sessions (``_kg``, the state key, key columns, ``_start``, ``_end``,
        partials): tests, tools."""
        if self._sessions is None:
            return pa.table({KG_COLUMN: pa.array([], pa.int32())})
        return self._sessions.table()


def _is_distinct_table(name: str) -> bool:
    return name.startswith(_DISTINCT) and name[len(_DISTINCT) :].isdigit()


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])
