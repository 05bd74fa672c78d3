"""The SQL window aggregation on batches: ``GROUP BY window_start, window_end, keys...``
over ``TABLE(TUMBLE|HOP|CUMULATE(...))`` with Flink SQL's semantics and slice sharing.

Each row goes to exactly one *slice* (``size`` wide for tumble, ``gcd(size, slide)``
for hop, ``step`` for cumulate; :class:`SliceAssigner`), so a row costs the same
whatever the window's size and slide. A batch is folded into per-(key, slice) partial
aggregates by one Arrow hash ``group_by`` (:class:`AggregateCalls` says which columns
each aggregate needs); when the watermark passes ``window_end - 1`` a window is the
merge of its slices' partials (one more ``group_by``), emitted in order of window end.
Slices no unfired window needs are dropped; rows all of whose windows fired are late
(dropped, counted in ``late_records_dropped``).

State layout: per slice, a short list of Arrow tables of partials (keys, partial
columns, ``_wa_fired``), compacted by a ``group_by`` when it grows, plus per
``COUNT(DISTINCT)`` the distinct (key, value) rows of the slice. The operator keeps
these tables itself (a ``COLUMNAR_STATE_KINDS`` kind, as the session and join
operators) rather than in a backend column table: a column table holds fixed-width
NumPy fields per single key, while a slice holds Arrow-typed partials (strings and
timestamps for MIN/MAX, nulls for SUM over NULLs), composite keys and distinct value
sets; and Arrow's ``group_by`` on these tables is the whole per-batch work, with no
per-key Python. Snapshots write every slice's tables as one columnar file, one record
batch per key group (:class:`~epochstream.state.backends.heap.snapshots.ColumnarSnapshotJob`),
so a restore at another parallelism reads its key groups, on either backend.

``_wa_fired`` is null for rows folded since the last restore, else the watermark of the
subtask that snapshotted them: a window whose end - 1 it passed was emitted already,
so the window skips them after a restore (which starts again from no watermark).

Example::

    op = ColumnarWindowAggregateOperator(spec, ctx)   # spec.payload: SliceWindowAggregateSpec
    op.process_batch(pa.record_batch({"k": ["a", "b"], "v": [1, 2], "_ts": [5, 7]}), None)
    op.process_watermark(10_000)                       # windows ending by 10 s are emitted
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import DataError, StateError
from epochstream.graph.specs import AggCall, SliceWindowAggregateSpec, WindowTvf
from epochstream.runtime.operators.base import Operator, SnapshotParts
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.state.backends.base import ColumnSchema, SnapshotTarget
from epochstream.state.backends.heap.snapshots import ColumnarSnapshotJob
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.columnar_aggregates import read_columnar_state
from epochstream.state.columnar_checks import event_times, require_columns
from epochstream.state.handles import OperatorRestore
from epochstream.state.key_index import canonical_float_keys, checked_key_type
from epochstream.state.keygroups import key_group_range_for_operator

__all__ = [
    "AggregateCalls",
    "ColumnarWindowAggregateOperator",
    "SliceAssigner",
    "SliceStore",
]

_INT64_MIN = -(2**63)
#: State columns: a row's slice end, its part (-1: partials, i: distinct values of
#: aggregate i), and the watermark it was snapshotted under.
SLICE, PART, FIRED = "_wa_slice", "_wa_part", "_wa_fired"
_ROWS = "_wa_rows"  # rows per group: a group exists once a row of it came
_MAIN = -1
# A slice's list of tables is merged into one past this many (amortized compaction).
_COMPACT_AT = 16
_TS_TYPE = pa.timestamp("ms")


class SliceAssigner:
    """The slices and windows of a :class:`WindowTvf`: one slice per row, each window
    the slices ending in ``(start, end]``.

    Example::

        hop = SliceAssigner(WindowTvf.hop(10, 4))        # slices of 2 ms
        hop.slice_ends(np.array([5])).tolist() == [6]
        hop.windows_ending(np.array([6]), -100, 100)[1].tolist() == [6, 10, 14]
    """

    def __init__(self, window: WindowTvf) -> None:
        self.kind = window.kind
        self.size = window.size
        self.width = window.slice_width
        self.period = window.period  # between window starts
        self.offset = window.offset
        # Between window ends: every step of a cumulate window ends one.
        self.end_step = self.width if self.kind == "cumulate" else self.period

    def slice_ends(self, ts: np.ndarray) -> np.ndarray:
        """The end of the slice of each event time."""
        return ts - (ts - self.offset) % self.width + self.width

    def last_window_end(self, slice_ends: np.ndarray) -> np.ndarray:
        """The end of the last window each slice (by its end) belongs to."""
        starts = slice_ends - self.width
        return starts - (starts - self.offset) % self.period + self.size

    def window_starts(self, ends: np.ndarray) -> np.ndarray:
        """The start of the window of each end (one per end, for every kind)."""
        if self.kind != "cumulate":
            return ends - self.size
        first = ends - self.width  # the last slice's start: in the window
        return first - (first - self.offset) % self.size

    def windows_ending(
        self, slice_ends: np.ndarray, after: int, upto: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` of the windows with ``after < end <= upto`` holding at least
        one of ``slice_ends`` (sorted), by end."""
        if not len(slice_ends):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        low = max(after + 1, int(slice_ends[0]))
        high = min(upto, int(slice_ends[-1]) + self.size)
        if low > high:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        phase = (self.offset + self.size) % self.end_step  # window ends are = phase mod step
        first = low + (phase - low) % self.end_step
        ends = np.arange(first, high + 1, self.end_step, dtype=np.int64)
        starts = self.window_starts(ends)
        inside = np.searchsorted(slice_ends, ends, "right") - np.searchsorted(
            slice_ends, starts, "right"
        )
        return starts[inside > 0], ends[inside > 0]


@dataclass(frozen=True)
class _Partial:
    """One partial column: ``name`` is ``batch_fn`` of ``source`` per (key, slice) in a
    batch, and ``merge_fn`` of itself across batches and slices."""

    name: str
    source: str
    batch_fn: str
    merge_fn: str


class AggregateCalls:
    """What the aggregates of a window aggregation compute: the columns each derives from
    a batch, its partials (Arrow hash aggregates), and its value from merged partials.

    Example::

        calls = AggregateCalls((AggCall("sum", "v", "total"),), float_columns={"v"})
        [p.name for p in calls.partials] == ["_wa_rows", "_wa0_s"]
    """

    def __init__(self, aggs: tuple[AggCall, ...], float_columns: set[str]) -> None:
        self.aggs = aggs
        self.floats = float_columns
        self.partials: list[_Partial] = [_Partial(_ROWS, _ROWS, "count_all", "sum")]
        for i, agg in enumerate(aggs):
            self.partials += self._partials_of(i, agg)
        #: The aggregates that keep distinct values (their index and value column).
        self.distinct = [(i, f"_wa{i}_d") for i, a in enumerate(aggs) if a.distinct]

    def _partials_of(self, i: int, agg: AggCall) -> list[_Partial]:
        p = f"_wa{i}"
        if agg.distinct:
            return []
        if agg.kind == "count_star":
            if agg.filter is None:
                return []  # the group's row count
            return [_Partial(f"{p}_n", f"{p}_c", "sum", "sum")]
        if agg.kind == "count":
            return [_Partial(f"{p}_n", f"{p}_v", "count", "sum")]
        parts = []
        if agg.kind in ("sum", "avg"):
            parts.append(_Partial(f"{p}_s", f"{p}_v", "sum", "sum"))
            if agg.column not in self.floats:  # the int64 sum's overflow check
                parts.append(_Partial(f"{p}_f", f"{p}_f", "sum", "sum"))
            if agg.kind == "avg":
                parts.append(_Partial(f"{p}_n", f"{p}_v", "count", "sum"))
            return parts
        parts.append(_Partial(f"{p}_m", f"{p}_v", agg.kind, agg.kind))
        if agg.column in self.floats:  # NaN is SQL's largest value: counted apart
            parts.append(_Partial(f"{p}_z", f"{p}_z", "sum", "sum"))
        return parts

    # ------------------------------------------------------------ batch side
    def derived(self, batch: pa.RecordBatch) -> dict[str, pa.Array]:
        """The columns the partials aggregate, derived from ``batch``."""
        out: dict[str, pa.Array] = {}
        for i, agg in enumerate(self.aggs):
            p = f"_wa{i}"
            mask = None
            if agg.filter is not None:
                mask = pc.fill_null(batch.column(agg.filter), False)
            if agg.kind == "count_star":
                if mask is not None:
                    out[f"{p}_c"] = mask.cast(pa.int64())
                continue
            value = batch.column(agg.column)
            if mask is not None:
                value = pc.if_else(mask, value, pa.scalar(None, value.type))
            floating = agg.column in self.floats
            if agg.distinct:
                out[f"{p}_d"] = canonical_float_keys(value) if floating else value
            elif agg.kind in ("sum", "avg"):
                if floating:
                    out[f"{p}_v"] = value.cast(pa.float64())
                else:
                    out[f"{p}_v"] = value.cast(pa.int64())
                    out[f"{p}_f"] = value.cast(pa.float64())
            elif agg.kind in ("min", "max") and floating:
                nan = pc.is_nan(value)
                out[f"{p}_v"] = pc.if_else(nan, pa.scalar(None, value.type), value)
                out[f"{p}_z"] = nan.cast(pa.int64())
            else:
                out[f"{p}_v"] = value
        return out

    def batch_aggregations(self) -> list[tuple[Any, str]]:
        """The hash aggregates of a batch's group_by (``count_all`` takes no column)."""
        return [([] if p.batch_fn == "count_all" else p.source, p.batch_fn) for p in self.partials]

    @staticmethod
    def _named(grouped: pa.Table, names: Iterable[tuple[str, str]], keys: list[str]) -> pa.Table:
        columns = {k: grouped.column(k) for k in keys}
        for name, arrow_name in names:
            columns[name] = grouped.column(arrow_name)
        return pa.table(columns)

    def batch_partials(self, grouped: pa.Table, keys: list[str]) -> pa.Table:
        """A batch's group_by result with the partials under their own names."""
        names = [
            (p.name, "count_all" if p.batch_fn == "count_all" else f"{p.source}_{p.batch_fn}")
            for p in self.partials
        ]
        return self._named(grouped, names, keys)

    def merge(self, table: pa.Table, keys: list[str], distinct: bool = False) -> pa.Table:
        """``table``'s partials (and distinct values) merged per ``keys``."""
        aggregations: list[tuple[Any, ...]] = [(p.name, p.merge_fn) for p in self.partials]
        names = [(p.name, f"{p.name}_{p.merge_fn}") for p in self.partials]
        if distinct:
            for _, column in self.distinct:
                aggregations.append((column, "count_distinct"))
                names.append((column, f"{column}_count_distinct"))
        grouped = table.group_by(keys, use_threads=False).aggregate(aggregations)
        return self._named(grouped, names, keys)

    # ------------------------------------------------------------ results
    def values(self, merged: pa.Table, where: str) -> list[pa.Array]:
        """Each aggregate's result column from a window's merged partials."""
        return [self._value(i, agg, merged, where) for i, agg in enumerate(self.aggs)]

    def _value(self, i: int, agg: AggCall, merged: pa.Table, where: str) -> pa.Array:
        p = f"_wa{i}"

        def col(name: str) -> pa.Array:
            return merged.column(name).combine_chunks()

        if agg.distinct:
            return pc.fill_null(col(f"{p}_d"), 0)
        if agg.kind == "count_star":
            return col(_ROWS) if agg.filter is None else pc.fill_null(col(f"{p}_n"), 0)
        if agg.kind == "count":
            return pc.fill_null(col(f"{p}_n"), 0)
        if agg.kind in ("min", "max"):
            value = col(f"{p}_m")
            if agg.column not in self.floats:
                return value
            nan = pc.greater(pc.fill_null(col(f"{p}_z"), 0), 0)
            if agg.kind == "min":  # NaN only when every non-null value is NaN
                nan = pc.and_(nan, pc.is_null(value))
            return pc.if_else(nan, pa.scalar(float("nan"), value.type), value)
        total = col(f"{p}_s")
        if agg.column not in self.floats:
            top = pc.max(pc.abs(col(f"{p}_f"))).as_py()
            if top is not None and top >= 2.0**63:
                raise DataError(
                    f"{where}: {agg.kind.upper()}({agg.column}) for {agg.output!r} leaves the "
                    "int64 range; cast the column to float64 in map_batches first"
                )
        if agg.kind == "sum":
            return total
        count = col(f"{p}_n")
        if agg.column in self.floats:
            return pc.divide(total, count)
        # AVG of integers is an integer, truncated toward zero (Flink's, DuckDB's trunc).
        valid = pc.is_valid(total).to_numpy(zero_copy_only=False)
        sums = pc.fill_null(total, 0).to_numpy(zero_copy_only=False)
        counts = np.maximum(pc.fill_null(count, 1).to_numpy(zero_copy_only=False), 1)
        quotient = np.abs(sums) // counts * np.sign(sums)
        return pa.array(quotient, pa.int64(), mask=~valid)


class SliceStore:
    """The open slices: per slice end, per part (``-1`` partials, ``i`` the distinct
    values of aggregate ``i``), a list of tables, compacted as it grows.

    Example: ``store.add(6_000, -1, partials); store.tables([6_000], -1)``
    """

    def __init__(self) -> None:
        self.slices: dict[int, dict[int, list[pa.Table]]] = {}
        #: Per part, how to merge its tables into one (set once the aggregates are known).
        self.compaction: dict[int, Any] = {}

    def add(self, end: int, part: int, table: pa.Table) -> None:
        """Keep ``table`` (rows of slice ``end``) in ``part``."""
        tables = self.slices.setdefault(end, {}).setdefault(part, [])
        tables.append(table)
        if len(tables) >= _COMPACT_AT:
            tables[:] = [self.compaction[part](_concat(tables))]

    def tables(self, ends: Iterable[int], part: int) -> list[pa.Table]:
        """The tables of ``part`` in slices ``ends`` (those open)."""
        found: list[pa.Table] = []
        for end in ends:
            found += self.slices.get(end, {}).get(part, [])
        return found

    def ends(self) -> np.ndarray:
        """The open slices' ends, sorted."""
        return np.array(sorted(self.slices), dtype=np.int64)

    def drop(self, ends: Iterable[int]) -> None:
        """Forget slices ``ends``."""
        for end in ends:
            self.slices.pop(end, None)


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")


class _OwnStateOperator(Operator, ABC):
    """Key-group range, restore and snapshot of state this operator keeps itself (as a
    table with a ``_kg`` column, written with the heap backend's snapshot job)."""

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.key_groups = key_group_range_for_operator(
            ctx.max_parallelism, ctx.parallelism, ctx.subtask_index
        )

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        if restore is None or not restore.keyed:
            return
        options = self.ctx.storage_options
        table = read_columnar_state(
            lambda path: storage_fs(path, options),
            restore.keyed,
            self.key_groups,
            self.ctx.task_name,
        )
        if table is not None:
            self.restore_table(table)

    @abstractmethod
    def restore_table(self, table: pa.Table) -> None:
        """Add restored state rows (those of this subtask's key groups)."""

    @abstractmethod
    def state_table(self) -> pa.Table:
        """A copy of the state with a ``_kg`` column, for the snapshot thread to write."""

    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        parts = super().snapshot(target)
        parts.keyed = ColumnarSnapshotJob(
            self.state_table(),
            target,
            self.key_groups,
            self.spec.payload.kind,
            ColumnSchema((), None),  # typed partials: no value column to cast
        )
        return parts


class ColumnarWindowAggregateOperator(_OwnStateOperator):
    """SQL window aggregation (tumble, hop, cumulate) on record batches, fired by the
    watermark (see the module docstring for slices, state and restore).

    Output batches: the key columns, ``window_start``, ``window_end``
    (``timestamp[ms]``), each aggregate's ``output`` column, ``_ts = window_end - 1``.
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.agg: SliceWindowAggregateSpec = spec.payload
        self.keys = list(self.agg.keys)
        self.assigner = SliceAssigner(self.agg.window)
        self.watermark = _INT64_MIN
        self.store = SliceStore()
        self._calls: AggregateCalls | None = None  # once the first batch tells float columns
        self._types: dict[str, pa.DataType] = {}
        self._where = ctx.task_name

    # ------------------------------------------------------------ input
    def _columns(self) -> tuple[str, ...]:
        used = [a.column for a in self.agg.aggs] + [a.filter for a in self.agg.aggs]
        return (*self.keys, *(c for c in used if c), TS_COLUMN)

    def _check(self, batch: pa.RecordBatch) -> None:
        require_columns(batch.schema, self._columns(), self._where)
        schema = batch.schema
        for name in self._columns():
            kind = schema.field(name).type
            where = f"{self._where}: column {name!r}"
            self._types[name] = checked_key_type(self._types.get(name), kind, where)
        for agg in self.agg.aggs:
            if agg.filter is not None and not pa.types.is_boolean(schema.field(agg.filter).type):
                raise DataError(
                    f"{self._where}: the filter column {agg.filter!r} of {agg.output!r} is "
                    f"{schema.field(agg.filter).type}, not boolean"
                )
        if self._calls is None:
            floats = {
                a.column
                for a in self.agg.aggs
                if a.column and pa.types.is_floating(schema.field(a.column).type)
            }
            self._use_calls(AggregateCalls(self.agg.aggs, floats))

    def _use_calls(self, calls: AggregateCalls) -> None:
        self._calls = calls
        keys = [*self.keys, FIRED]
        compact: dict[int, Any] = {_MAIN: lambda t: calls.merge(t, keys)}
        for i, column in calls.distinct:
            compact[i] = lambda t, c=column: _distinct_rows(t, [*keys, c])
        self.store.compaction = compact

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        if TS_COLUMN not in batch.schema.names:
            raise DataError(
                f"{self._where}: window aggregations need event time; give the source a "
                "watermark strategy with .with_timestamp_column(name)"
            )
        self._check(batch)
        calls = self._calls
        assert calls is not None
        ends = self.assigner.slice_ends(event_times(batch, self._where))
        late = self.assigner.last_window_end(ends) - 1 <= self.watermark
        if late.any():
            self.counters.late_records_dropped += int(late.sum())
            batch = batch.filter(pa.array(~late))
            ends = ends[~late]
            if not batch.num_rows:
                return
        columns = {k: canonical_float_keys(batch.column(k)) for k in self.keys}
        columns[SLICE] = pa.array(ends)
        columns.update(calls.derived(batch))
        table = pa.table(columns)
        group = [*self.keys, SLICE]
        grouped = table.group_by(group, use_threads=False).aggregate(calls.batch_aggregations())
        self._keep(_MAIN, calls.batch_partials(grouped, group))
        for i, column in calls.distinct:
            values = table.select([*group, column])
            values = values.filter(pc.is_valid(values.column(column)))
            self._keep(i, _distinct_rows(values, [*group, column]))

    def _keep(self, part: int, rows: pa.Table) -> None:
        """Add a batch's ``rows`` (with a ``_wa_slice`` column) to their slices' ``part``."""
        rows = rows.append_column(FIRED, pa.nulls(rows.num_rows, pa.int64()))
        for end, slice_rows in _per_slice(rows):
            self.store.add(end, part, slice_rows)

    # ------------------------------------------------------------ firing
    def process_watermark(self, watermark: int) -> None:
        if watermark > self.watermark:
            self._fire(self.watermark, watermark)
            self.watermark = watermark
            ends = self.store.ends()
            done = self.assigner.last_window_end(ends) - 1 <= watermark
            self.store.drop(ends[done].tolist())
        self.emit_watermark(watermark)

    def _fire(self, before: int, watermark: int) -> None:
        """Emit the windows whose end - 1 is in ``(before, watermark]``, by end."""
        if self._calls is None:
            return
        slices = self.store.ends()
        starts, ends = self.assigner.windows_ending(slices, before + 1, watermark + 1)
        out = [
            result
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True)
            if (result := self._window(start, end)) is not None
        ]
        if out:
            self.output.collect(pa.concat_batches(out), None)

    def _window(self, start: int, end: int) -> pa.RecordBatch | None:
        """The result of window ``[start, end)``: its slices' partials merged per key."""
        calls = self._calls
        assert calls is not None
        inside = range(start + self.assigner.width, end + 1, self.assigner.width)
        tables = self.store.tables(inside, _MAIN)
        if not tables:
            return None
        for i, _ in calls.distinct:
            tables += self.store.tables(inside, i)
        rows = _concat(tables)
        fired = rows.column(FIRED)
        if fired.null_count < len(fired):  # restored rows this window was emitted with
            rows = rows.filter(pc.invert(pc.fill_null(pc.greater_equal(fired, end - 1), False)))
            if not pc.any(pc.is_valid(rows.column(_ROWS))).as_py():
                return None
        for i, column in calls.distinct:
            if column not in rows.schema.names:  # no value in this window's slices
                kind = self._types.get(str(self.agg.aggs[i].column), pa.null())
                rows = rows.append_column(column, pa.nulls(rows.num_rows, kind))
        merged = calls.merge(rows, self.keys, distinct=True)
        n = merged.num_rows
        columns = [merged.column(k).combine_chunks() for k in self.keys]
        columns += [
            pa.array(np.full(n, start, dtype=np.int64)).cast(_TS_TYPE),
            pa.array(np.full(n, end, dtype=np.int64)).cast(_TS_TYPE),
            *calls.values(merged, self._where),
            pa.array(np.full(n, end - 1, dtype=np.int64)),
        ]
        names = [*self.keys, "window_start", "window_end"]
        names += [a.output for a in self.agg.aggs] + [TS_COLUMN]
        return pa.record_batch(columns, names=names)

    # ------------------------------------------------------------ snapshots
    def state_table(self) -> pa.Table:
        """Every open slice's tables as one table (``_kg``, ``_wa_slice``, ``_wa_part``,
        ``_wa_fired``, keys, partials): the snapshot's rows, tests."""
        parts = []
        for end, by_part in self.store.slices.items():
            for part, tables in by_part.items():
                for table in tables:
                    n = table.num_rows
                    table = table.append_column(SLICE, pa.array(np.full(n, end, np.int64)))
                    table = table.append_column(PART, pa.array(np.full(n, part, np.int16)))
                    parts.append(table)
        if not parts:
            return pa.table({KG_COLUMN: pa.array([], pa.int32())})
        state = pa.concat_tables(parts, promote_options="permissive")
        fired = pc.max_element_wise(
            pc.fill_null(state.column(FIRED), self.watermark), pa.scalar(self.watermark)
        )
        state = state.set_column(state.schema.get_field_index(FIRED), FIRED, fired)
        keys = [state.column(k) for k in self.keys]
        groups = key_groups_by_columns(keys, self.ctx.max_parallelism, rows=state.num_rows)
        return state.append_column(KG_COLUMN, pa.array(groups, pa.int32()))

    def restore_table(self, table: pa.Table) -> None:
        names = table.schema.names
        if PART not in names or SLICE not in names:
            raise StateError(
                f"{self._where}: restored state is not a SQL window aggregation's; give the "
                "new operator another uid"
            )
        missing = [k for k in self.keys if k not in names]
        if missing:
            raise StateError(
                f"{self._where}: restored state has no key column {missing[0]!r}: it was "
                "written by another query; give the new operator another uid"
            )
        self._restore_calls(table)
        calls = self._calls
        assert calls is not None
        columns = {_MAIN: [*self.keys, *(p.name for p in calls.partials), FIRED]}
        for i, column in calls.distinct:
            columns[i] = [*self.keys, column, FIRED]
        parts = table.column(PART).to_numpy()
        for part in np.unique(parts).tolist():
            if part not in columns or any(c not in names for c in columns[part]):
                raise StateError(
                    f"{self._where}: restored state does not hold this query's aggregates; "
                    "give the new operator another uid"
                )
            rows = table.filter(pa.array(parts == part)).select([*columns[part], SLICE])
            for end, slice_rows in _per_slice(rows):
                self.store.add(end, part, slice_rows)

    def _restore_calls(self, table: pa.Table) -> None:
        """The aggregates' float columns from the restored partials' types."""
        if self._calls is not None:
            return
        floats = set()
        for i, agg in enumerate(self.agg.aggs):
            if agg.kind in ("sum", "avg") and f"_wa{i}_f" not in table.schema.names:
                floats.add(agg.column)
            if agg.kind in ("min", "max") and f"_wa{i}_z" in table.schema.names:
                floats.add(agg.column)
            if agg.column and agg.kind in ("min", "max") and f"_wa{i}_m" in table.schema.names:
                self._types.setdefault(agg.column, table.schema.field(f"_wa{i}_m").type)
        self._use_calls(AggregateCalls(self.agg.aggs, {c for c in floats if c}))


def _distinct_rows(table: pa.Table, columns: list[str]) -> pa.Table:
    """The distinct rows of ``table`` by ``columns``."""
    return table.group_by(columns, use_threads=False).aggregate([]).select(columns)


def _per_slice(rows: pa.Table) -> Iterable[tuple[int, pa.Table]]:
    """``rows``' slice ends (column ``_wa_slice``), each with its rows (without it)."""
    if not rows.num_rows:
        return
    ends = rows.column(SLICE).to_numpy()
    order = np.argsort(ends, kind="stable")
    rows = rows.take(pa.array(order)).drop_columns([SLICE])
    ends = ends[order]
    bounds = np.flatnonzero(np.diff(ends)) + 1
    starts = [0, *bounds.tolist()]
    stops = [*bounds.tolist(), len(ends)]
    for start, stop in zip(starts, stops, strict=True):
        yield int(ends[start]), rows.slice(start, stop - start)
