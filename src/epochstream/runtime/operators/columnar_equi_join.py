"""The columnar inner equi-join SQL's interval and window joins plan onto (kind
``columnar_equi_join``, payload :class:`~epochstream.graph.specs.EquiJoinSpec` with a
``retention``). Regular joins (no retention) are
:mod:`~epochstream.runtime.operators.columnar_regular_join`'s, which shares this
module's :class:`JoinSides` (what a side keeps) and :class:`JoinPairs` (the hash join).

Both inputs arrive hash-partitioned by the key group of their key columns (the tuple of
them when there are several: ``key_by([...])``), so equal keys meet in one subtask. Each
arriving batch is joined at once with the rows the other side keeps under the batch's
keys (Arrow's hash join on the key columns), then kept itself. Candidate pairs are
filtered by the interval (interval joins) and by the spec's ``condition``, and come out
as the ``left_output`` columns, the ``right_output`` columns and ``_ts``. Both inputs
are append-only (a changelog input is refused by the planner, as Flink does).

How long rows are kept is the spec's ``retention``:

- :class:`~epochstream.graph.specs.IntervalBounds` (interval join; ``lower <= l._ts -
  r._ts <= upper``): a left row can meet right rows of ``[l._ts - upper, l._ts -
  lower]``; a right row left rows of ``[r._ts + lower, r._ts + upper]``. With the
  watermark ``W`` (the minimum of both inputs'), a row whose range's end is at most
  ``W`` is late: dropped, counted in ``late_records_dropped``. A kept row is needed
  while a row that is not late may still arrive and meet it, that is while
  ``_ts + (upper - lower) > W`` (for a left row: its partners have ``r._ts <= l._ts -
  lower`` and a right row that is not late has ``r._ts > W - upper``; the same for a
  right row), so every pair of rows that are not late is emitted exactly once,
  whatever the arrival order. Flink's ``TimeIntervalJoin`` expires its cache sooner
  (at ``W > l.t - lower``) and joins late rows with what is left of it, so its result
  for late rows depends on timing; ours costs one interval width more of state.
  Rows are kept per time bucket of :func:`bucket_width` ms, ``left@<start>`` and
  ``right@<start>``: a batch reads the other side's buckets its rows' ranges overlap
  (for the batch's keys only), and the watermark drops whole buckets, without a scan.
  ``_ts`` is the later of the pair's times. The output watermark is held back by
  ``max(-lower, upper)``: a pair's ``_ts`` is above ``W + lower`` (left row arriving)
  or ``W - upper`` (right row), never late downstream (Flink's SQL planner holds the
  interval join's watermark back by ``RowTimeIntervalJoin.getMaxOutputDelay()`` =
  ``max(leftRelativeSize, rightRelativeSize)`` with ``leftRelativeSize = -lower``,
  ``rightRelativeSize = upper``, through ``KeyedCoProcessOperatorWithWatermarkDelay``);
  the end of input, ``MAX_WATERMARK``, is passed on as it is.
- :class:`~epochstream.graph.specs.WindowEnd` (window join of two window
  aggregations' outputs, their window in the keys): rows are kept per window end, in
  ``left@<end>`` and ``right@<end>``, dropped once the watermark reaches ``end - 1``
  (all rows of a window arrive before it); a row arriving after that is late. ``_ts``
  is ``end - 1``. Pairs are emitted on arrival, the same pairs Flink's window join
  emits at the window's end.

State lives in the job's keyed-state backend's row tables, filed under the key column
(one key) or ``_join_key``, the tuple's ``encode_key`` bytes (several keys); only the
columns the join needs are kept (keys, output columns, ``_ts``, the window end). The
backend snapshots them and restores them by key group, at any parallelism.

Example::

    op = create_operator(spec, ctx)   # spec.payload = EquiJoinSpec(("a", "b"), ("x", "y"), ...)
    op.process_input(1, right, None)  # kept
    op.process_input(0, left, None)   # emits its pairs with the kept right rows
    op.process_watermark(10_000)      # drops what can no longer join; emits the watermark
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.events import MAX_WATERMARK, MIN_WATERMARK
from epochstream.exceptions import ConfigurationError, DataError, StateError, UserFunctionError
from epochstream.graph.specs import EquiJoinSpec, IntervalBounds, WindowEnd
from epochstream.runtime.operators.columnar_aggregates import own_backend
from epochstream.runtime.operators.columnar_joins import JoinInputs, distinct_keys
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.runtime.operators.twoinput import TwoInputOperator
from epochstream.state.backends.base import RowSchema, RowTable
from epochstream.state.column_keygroups import tuple_keys_of_columns
from epochstream.state.columnar_checks import event_times
from epochstream.state.handles import OperatorRestore

__all__ = [
    "JOIN_KEY_COLUMN",
    "ColumnarEquiJoinOperator",
    "JoinPairs",
    "JoinSides",
    "Matched",
    "bucket_width",
]

#: The state's key column when a join has several keys: the tuple's ``encode_key`` bytes.
JOIN_KEY_COLUMN = "_join_key"
_SIDES = ("left", "right")
#: Between a side's name and its bucket's start (or window's end) in a row table name.
_AT = "@"
#: The narrowest time bucket of an interval join's state (ms).
MIN_BUCKET_MS = 1_000
_LEFT_ROW, _RIGHT_ROW = "_left_row", "_right_row"


def bucket_width(bounds: IntervalBounds) -> int:
    """The width (ms) of an interval join's time buckets: the interval's width, at least
    :data:`MIN_BUCKET_MS` (a batch then reads two or three buckets of the other side,
    and a bucket is dropped at most one width after its last row could join).

    Example: ``bucket_width(IntervalBounds(-5_000, 5_000)) == 10_000``
    """
    return max(bounds.upper - bounds.lower, MIN_BUCKET_MS)


def _table_name(side: str, at: int) -> str:
    """``_table_name("left", 0) == "left@0"``"""
    return f"{side}{_AT}{at}"


def _parse_table_name(name: str) -> tuple[int, int] | None:
    """``(side index, bucket or window end)`` of one of this join's row table names,
    else ``None``."""
    side, sep, at = name.partition(_AT)
    if side not in _SIDES or not sep:
        return None
    try:
        return _SIDES.index(side), int(at)
    except ValueError:
        return None


class JoinSides:
    """What each side keeps: the stored columns (keys, output columns, ``_ts``, window
    end, ``_join_key``) and the row table schema, fixed by the side's first batch or a
    restored table."""

    def __init__(self, spec: EquiJoinSpec) -> None:
        self.keys = (spec.left_keys, spec.right_keys)
        self.composite = len(spec.left_keys) > 1
        ends = (
            (spec.retention.left_column, spec.retention.right_column)
            if isinstance(spec.retention, WindowEnd)
            else (None, None)
        )
        outputs = (spec.left_output, spec.right_output)
        self.needed: tuple[list[str], list[str]] = ([], [])
        for index in (0, 1):
            wanted = [*self.keys[index], *(c for c, _ in outputs[index])]
            if ends[index] is not None:
                wanted.append(str(ends[index]))
            # Each column once, in the order first named.
            self.needed[index].extend(dict.fromkeys(wanted))
        self.ends = ends
        self.schemas: list[RowSchema | None] = [None, None]

    @property
    def key_column(self) -> tuple[str, str]:
        """The row tables' key column of each side."""
        if self.composite:
            return JOIN_KEY_COLUMN, JOIN_KEY_COLUMN
        return self.keys[0][0], self.keys[1][0]

    def stored(
        self,
        index: int,
        batch: pa.RecordBatch,
        where: str,
        extra: dict[str, pa.Array] | None = None,
    ) -> pa.RecordBatch:
        """The columns of a prepared batch the side keeps (``_kg`` dropped), then
        ``extra`` ones (the regular join's write times)."""
        names = batch.schema.names
        missing = [c for c in self.needed[index] if c not in names]
        if missing:
            raise DataError(
                f"{where}: the {_SIDES[index]} input has no column {missing[0]!r}, which the "
                f"join emits or keeps (columns: {', '.join(n for n in names if n != KG_COLUMN)})"
            )
        columns = list(self.needed[index])
        if TS_COLUMN in names:
            columns.append(TS_COLUMN)
        rows = batch.select(columns)
        if self.composite:
            keys = tuple_keys_of_columns([rows.column(k) for k in self.keys[index]])
            rows = rows.append_column(JOIN_KEY_COLUMN, keys)
        for name, column in (extra or {}).items():
            rows = rows.append_column(name, column)
        schema = self.schemas[index]
        if schema is None:
            fields = [f.with_nullable(True) for f in rows.schema]
            schema = self.schemas[index] = RowSchema(pa.schema(fields), self.key_column[index])
        return schema.conform(rows)


@dataclass(frozen=True)
class Matched:
    """The pairs of one :meth:`JoinPairs.match`: the output ``batch`` and, per pair,
    its row number on the left and on the right.

    Example: ``matched.left.to_pylist() == [0, 0, 2]`` (left row 0 met two right rows)
    """

    batch: pa.RecordBatch
    left: pa.Array
    right: pa.Array


class JoinPairs:
    """Joins arriving rows with kept rows of the other side: Arrow's hash join on the
    key columns and row numbers only, then the interval filter on the pairs' times,
    the output columns taken from both sides, ``_ts``, and the condition."""

    def __init__(self, spec: EquiJoinSpec, where: str) -> None:
        self.spec = spec
        self.where = where
        self.keys = (spec.left_keys, spec.right_keys)
        self.outputs = (spec.left_output, spec.right_output)

    def _numbered(self, rows: pa.Table, index: int, name: str) -> pa.Table:
        """``rows``' key columns under common names, and the row numbers as ``name``."""
        columns = {f"_k{i}": rows.column(k) for i, k in enumerate(self.keys[index])}
        columns[name] = pa.array(np.arange(rows.num_rows, dtype=np.int64))
        return pa.table(columns)

    def join(self, left: pa.Table, right: pa.Table) -> pa.RecordBatch | None:
        """The output batch of ``left`` x ``right``'s pairs, or None when there is none."""
        matched = self.match(left, right)
        return None if matched is None else matched.batch

    def match(self, left: pa.Table, right: pa.Table) -> Matched | None:
        """``left`` x ``right``'s pairs (the output batch and each pair's row numbers on
        both sides), or None when there is none."""
        numbered = (self._numbered(left, 0, _LEFT_ROW), self._numbered(right, 1, _RIGHT_ROW))
        # Acero builds its hash table on the table of the call's right: the smaller one.
        probe, build = numbered if right.num_rows <= left.num_rows else numbered[::-1]
        matched = probe.join(
            build,
            keys=[f"_k{i}" for i in range(len(self.keys[0]))],
            join_type="inner",
            use_threads=False,
        )
        if not matched.num_rows:
            return None
        rows = (
            matched.column(_LEFT_ROW).combine_chunks(),
            matched.column(_RIGHT_ROW).combine_chunks(),
        )
        times = self._times(left, right, rows)
        if isinstance(self.spec.retention, IntervalBounds):
            assert times is not None
            bounds = self.spec.retention
            gap = pc.subtract(times[0], times[1])
            inside = pc.and_(pc.greater_equal(gap, bounds.lower), pc.less_equal(gap, bounds.upper))
            rows = (rows[0].filter(inside), rows[1].filter(inside))
            times = (times[0].filter(inside), times[1].filter(inside))
            if not len(rows[0]):
                return None
        columns: dict[str, Any] = {}
        for index, (side, picked) in enumerate(zip((left, right), rows, strict=True)):
            taken = side.select([c for c, _ in self.outputs[index]]).take(picked)
            for (_, out), column in zip(self.outputs[index], taken.columns, strict=True):
                columns[out] = column.combine_chunks()
        stamps = self._stamps(left, right, rows, times)
        if stamps is not None:
            columns[TS_COLUMN] = stamps
        batch = pa.RecordBatch.from_pydict(columns)
        mask = self._mask(batch)
        if mask is None:
            return Matched(batch, rows[0], rows[1])
        kept = batch.filter(mask, null_selection_behavior="drop")
        if not kept.num_rows:
            return None
        keep = pc.fill_null(mask, False)
        return Matched(kept, rows[0].filter(keep), rows[1].filter(keep))

    @staticmethod
    def _times(
        left: pa.Table, right: pa.Table, rows: tuple[pa.Array, pa.Array]
    ) -> tuple[pa.Array, pa.Array] | None:
        """The pairs' left and right event times, when both sides have them."""
        if TS_COLUMN not in left.schema.names or TS_COLUMN not in right.schema.names:
            return None
        return (
            left.column(TS_COLUMN).take(rows[0]).combine_chunks(),
            right.column(TS_COLUMN).take(rows[1]).combine_chunks(),
        )

    def _stamps(
        self,
        left: pa.Table,
        right: pa.Table,
        rows: tuple[pa.Array, pa.Array],
        times: tuple[pa.Array, pa.Array] | None,
    ) -> pa.Array | None:
        """The pairs' ``_ts``: ``end - 1`` of their window (window joins), else the later
        of both times (or the one side's that has them; none when neither has)."""
        retention = self.spec.retention
        if isinstance(retention, WindowEnd):
            ends = _end_times(left.column(retention.left_column).take(rows[0]))
            return pa.array(ends - 1)
        if times is not None:
            return pc.max_element_wise(times[0], times[1])
        for side, picked in zip((left, right), rows, strict=True):
            if TS_COLUMN in side.schema.names:
                return side.column(TS_COLUMN).take(picked).combine_chunks()
        return None

    def _mask(self, batch: pa.RecordBatch) -> pa.Array | pa.ChunkedArray | None:
        """The condition on ``batch`` (TRUE: kept; null: dropped), None without one."""
        condition = self.spec.condition
        if condition is None:
            return None
        try:
            mask = condition(batch)
        except Exception as exc:
            raise UserFunctionError(
                f"{self.where} join condition", f"batch of {batch.num_rows} rows", exc
            ) from exc
        if not isinstance(mask, pa.Array | pa.ChunkedArray) or not pa.types.is_boolean(mask.type):
            raise DataError(
                f"{self.where}: the join condition returned {type(mask).__name__} "
                f"({getattr(mask, 'type', '')}), not a boolean array"
            )
        return mask


def _end_times(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A window end column as int64 ms (timestamps of any unit, or integers)."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", column.type.tz)).cast(pa.int64())
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


class ColumnarEquiJoinOperator(TwoInputOperator):
    """Inner equi-join on composite keys with an output mapping, a residual condition,
    and an interval or window-end retention (see the module docstring).

    Example::

        op = create_operator(spec, ctx)    # kind "columnar_equi_join"
        op.process_input(0, left, None)
        op.process_input(1, right, None)   # emits the pairs
        op.process_watermark(5_000)        # emits 5_000 - spec.retention.delay (interval)
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        #: The key groups of this subtask (those its backend holds).
        self.key_groups = self.keyed.key_group_range
        self.join: EquiJoinSpec = spec.payload
        if self.join.retention is None:
            raise ConfigurationError(
                f"{ctx.task_name}: a join without retention is a regular join, operator "
                "kind 'columnar_regular_join'"
            )
        reserved = {JOIN_KEY_COLUMN: "which the join keeps its composite keys under"}
        self.inputs = JoinInputs(
            (self.join.left_keys, self.join.right_keys),
            reserved,
            ctx.task_name,
            ctx.max_parallelism,
        )
        self.sides = JoinSides(self.join)
        self.pairs = JoinPairs(self.join, ctx.task_name)
        #: Each side's bucket starts (interval) or window ends (window-end) with a table.
        self.tables: tuple[set[int], set[int]] = (set(), set())
        self.watermark = MIN_WATERMARK
        retention = self.join.retention
        self.bucket = bucket_width(retention) if isinstance(retention, IntervalBounds) else 0

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        other = list(self.keyed.column_tables())
        for name in self.keyed.row_tables():
            parsed = _parse_table_name(name)
            if parsed is None:
                other.append(name)
                continue
            index, at = parsed
            self.tables[index].add(at)
            table = self.keyed.row_table(name)
            assert table is not None
            self._adopt(index, table.schema)
        if other:
            raise StateError(
                f"{self.ctx.task_name}: restored state is not this join's (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )

    def _adopt(self, index: int, schema: RowSchema) -> None:
        """Take up a restored side's row schema and key types."""
        if self.sides.schemas[index] is None:
            self.sides.schemas[index] = schema
            kinds = tuple(schema.schema.field(k).type for k in self.sides.keys[index])
            self.inputs.key_types[index] = kinds

    def _table(self, index: int, at: int, *, create: bool = False) -> RowTable | None:
        assert self.keyed is not None
        name = _table_name(_SIDES[index], at)
        return self.keyed.row_table(name, self.sides.schemas[index] if create else None)

    def process_input(self, index: int, records: Any, timestamps: list[Any] | None) -> None:
        batch = self.inputs.prepare(index, need_batch(self, records))
        if not batch.num_rows:
            return
        kgs = batch.column(KG_COLUMN).to_numpy(zero_copy_only=False)
        rows = self.sides.stored(index, batch, self.ctx.task_name)
        retention = self.join.retention
        if isinstance(retention, IntervalBounds):
            self._interval(index, rows, kgs, retention)
        else:
            self._windowed(index, rows, kgs)

    def _interval(
        self, index: int, rows: pa.RecordBatch, kgs: np.ndarray, bounds: IntervalBounds
    ) -> None:
        times = self._event_times(index, rows)
        # The other side's times this row can meet: [t - upper, t - lower] for a left
        # row, [t + lower, t + upper] for a right one.
        low, high = (-bounds.upper, -bounds.lower) if index == 0 else (bounds.lower, bounds.upper)
        live = times + high > self.watermark
        if not live.all():
            self.counters.late_records_dropped += int((~live).sum())
            rows, kgs, times = rows.filter(pa.array(live)), kgs[live], times[live]
            if not rows.num_rows:
                return
        first, last = int(times.min()) + low, int(times.max()) + high
        other = sorted(b for b in self.tables[1 - index] if b <= last and b + self.bucket > first)
        self._meet(index, rows, kgs, other)
        buckets = times - times % self.bucket
        for start in np.unique(buckets).tolist():
            mask = buckets == start
            self._append(index, start, rows.filter(pa.array(mask)), kgs[mask])

    def _windowed(self, index: int, rows: pa.RecordBatch, kgs: np.ndarray) -> None:
        column = self.sides.ends[index]
        assert column is not None
        ends = _end_times(rows.column(column))
        live = ends - 1 > self.watermark
        if not live.all():
            self.counters.late_records_dropped += int((~live).sum())
        for end in np.unique(ends[live]).tolist():
            mask = ends == end
            part, part_kgs = rows.filter(pa.array(mask)), kgs[mask]
            if end in self.tables[1 - index]:
                self._meet(index, part, part_kgs, [end])
            self._append(index, end, part, part_kgs)

    def _event_times(self, index: int, rows: pa.RecordBatch) -> np.ndarray:
        if TS_COLUMN not in rows.schema.names:
            raise DataError(
                f"{self.ctx.task_name}: an interval join needs event time on both inputs; "
                f"give the {_SIDES[index]} source a watermark strategy with "
                ".with_timestamp_column(name)"
            )
        return event_times(rows, self.ctx.task_name)

    def _append(self, index: int, at: int, rows: pa.RecordBatch, kgs: np.ndarray) -> None:
        self.tables[index].add(at)
        table = self._table(index, at, create=True)
        assert table is not None
        table.append(rows, kgs)

    def _meet(
        self, index: int, rows: pa.RecordBatch, kgs: np.ndarray, others: Sequence[int]
    ) -> None:
        """Join ``rows`` of side ``index`` with the other side's rows of their keys in the
        tables ``others`` (bucket starts, window ends)."""
        if not others:
            return
        keys, key_groups = distinct_keys(rows.column(self.sides.key_column[index]), kgs)
        kept = []
        for at in others:
            table = self._table(1 - index, at)
            if table is not None:
                found = table.read(keys, key_groups)
                if found.num_rows:
                    kept.append(found)
        if not kept:
            return
        arriving = pa.Table.from_batches([rows])
        stored = pa.concat_tables(kept)
        left, right = (arriving, stored) if index == 0 else (stored, arriving)
        joined = self.pairs.join(left, right)
        if joined is not None:
            self.output.collect(joined, None)

    def process_watermark(self, watermark: int) -> None:
        self.watermark = watermark
        retention = self.join.retention
        assert self.keyed is not None
        if isinstance(retention, IntervalBounds):
            # A bucket's last row (start + bucket - 1) is needed while
            # t + (upper - lower) > W (see the module docstring).
            width = retention.upper - retention.lower
            self._drop(lambda start: start + self.bucket - 1 + width <= watermark)
            # The end of input (MAX_WATERMARK) passes as it is: downstream operators
            # flush on it (global windows, sessions).
            held = watermark if watermark >= MAX_WATERMARK else watermark - retention.delay
            self.emit_watermark(max(held, MIN_WATERMARK))
            return
        self._drop(lambda end: end - 1 <= watermark)
        self.emit_watermark(watermark)

    def _drop(self, expired: Callable[[int], bool]) -> None:
        assert self.keyed is not None
        for index, side in enumerate(_SIDES):
            for at in sorted(a for a in self.tables[index] if expired(a)):
                self.tables[index].discard(at)
                self.keyed.drop_row_table(_table_name(side, at))
