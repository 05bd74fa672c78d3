"""Operators of the columnar path: whole Arrow record batches in, whole batches out.

- :class:`MapBatchesOperator`: ``fn(batch) -> batch`` (``map_batches``);
- :class:`FilterBatchesOperator`: rows where an Arrow compute expression holds;
- :class:`ToRowsOperator` / :class:`ToBatchesOperator`: the explicit conversions
  between the two forms (``_ts`` <-> the row path's timestamps list);
- :class:`ColumnarAggregateOperator`: rolling keyed ``sum``/``count``/``min``/``max``/
  ``mean`` over :class:`~epochstream.state.columnar.ColumnarAggregates`, checkpointed
  as a :class:`~epochstream.state.handles.ColumnarSnapshotHandle`;
- :class:`ColumnarWindowOperator`: the same aggregations per tumbling or sliding
  event-time window, fired by the watermark.

Event time rides in the ``_ts`` column; an operator whose function drops it gets it
back when the output has the input's rows (``map_batches`` keeping rows one to one).

Example::

    op = FilterBatchesOperator(spec, ctx)      # spec.payload = pc.field("x") > 3
    op.emit = lambda batch, timestamps: print(batch.num_rows)
    op.process_batch(pa.record_batch([pa.array([1, 5])], names=["x"]), None)   # prints 1
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.arrow import is_key_group_field, plain_types, rows_of
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import ConfigurationError, DataError, UserFunctionError, short_repr
from epochstream.runtime.operators.base import Operator, SnapshotParts
from epochstream.state.backends.base import SnapshotJob, SnapshotTarget
from epochstream.state.columnar import (
    ColumnarAggregates,
    read_columnar_state,
    write_columnar_state,
)
from epochstream.state.columnar_checks import checked_value_type, event_times
from epochstream.state.handles import KeyedStateHandle, OperatorRestore
from epochstream.state.key_index import checked_key_type
from epochstream.state.keygroups import key_group_range_for_operator

__all__ = [
    "AggregateSpec",
    "ColumnarAggregateOperator",
    "ColumnarWindowOperator",
    "FilterBatchesOperator",
    "MapBatchesOperator",
    "ToBatchesOperator",
    "ToRowsOperator",
    "WindowAggregateSpec",
    "apply_batch_function",
    "window_starts",
]



def describe_batch(batch: Any) -> str:
    """A short description of a batch for errors (its schema and size, not its rows)."""
    if isinstance(batch, pa.RecordBatch):
        return f"<batch of {batch.num_rows} rows: {', '.join(batch.schema.names)}>"
    return f"<{type(batch).__name__}>"


def _need_batch(op: Operator, item: Any) -> pa.RecordBatch:
    if type(item) is not pa.RecordBatch:
        raise ConfigurationError(
            f"{op.ctx.task_name}: expects columnar batches (pyarrow.RecordBatch) but got "
            f"{type(item).__name__}; convert rows with to_batches(schema) first"
        )
    return item


def apply_batch_function(fn: Any, batch: pa.RecordBatch, where: str, what: str) -> pa.RecordBatch:
    """``fn(batch)``, checked to be a record batch; ``_ts`` is carried over when ``fn``
    drops it and keeps the rows one to one (a :class:`DataError` when it drops it and
    changes the number of rows); a ``_ts`` it returns must be integers (made int64).
    ``where`` names the operator in errors."""
    try:
        out = fn(batch)
    except Exception as exc:
        raise UserFunctionError(where, _Described(batch), exc) from exc
    if type(out) is not pa.RecordBatch:
        raise DataError(f"{where}: {what} function returned {type(out).__name__}, not a pyarrow.RecordBatch")
    if TS_COLUMN in batch.schema.names and TS_COLUMN not in out.schema.names and out.num_rows:
        if out.num_rows != batch.num_rows:
            # Whether rows could be matched to their times would depend on the data.
            raise DataError(
                f"{where}: the {what} function dropped the event-time column {TS_COLUMN!r} "
                f"and returned {out.num_rows} rows for {batch.num_rows}, so the rows' times "
                f"cannot be carried over; keep {TS_COLUMN!r} in the batch it returns"
            )
        out = out.append_column(TS_COLUMN, batch.column(TS_COLUMN))
    index = out.schema.get_field_index(TS_COLUMN)
    if index >= 0 and out.schema.field(index).type != pa.int64():
        kind = out.schema.field(index).type
        if not pa.types.is_integer(kind):
            # A float would be truncated silently into times, a string fail in a kernel.
            raise DataError(
                f"{where}: the {what} function returned the event-time column {TS_COLUMN!r} "
                f"as {kind}; event time is int64 milliseconds since the epoch"
            )
        out = out.set_column(index, TS_COLUMN, out.column(index).cast(pa.int64()))
    return plain_types(out)


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


class MapBatchesOperator(Operator):
    """``fn(batch)`` per batch; the result must be a ``pyarrow.RecordBatch``."""

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = _need_batch(self, records)
        out = apply_batch_function(self.function, batch, self.ctx.task_name, "map_batches")
        if out.num_rows:
            self.emit(out, None)


class FilterBatchesOperator(Operator):
    """The rows for which the Arrow compute expression (the payload) is true."""

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = _need_batch(self, records)
        try:
            out = batch.filter(self.function)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise DataError(
                f"{self.ctx.task_name}: filter {self.function} cannot be evaluated on "
                f"{describe_batch(batch)}: {exc}"
            ) from exc
        if out.num_rows:
            self.emit(out, None)


class ToRowsOperator(Operator):
    """Each row as a dict (internal ``_kg``/``_ts`` columns dropped; ``_ts`` becomes the
    row's timestamp)."""

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = _need_batch(self, records)
        schema = batch.schema
        ts = batch.column(TS_COLUMN).to_pylist() if TS_COLUMN in schema.names else None
        keep = [f.name for f in schema if f.name != TS_COLUMN and not is_key_group_field(f)]
        if len(keep) != len(schema):
            batch = batch.select(keep)
        self.emit(rows_of(batch), ts)


class ToBatchesOperator(Operator):
    """Rows (dicts by field name, or tuples in schema order) as batches of ``schema``."""

    def open(self) -> None:
        super().open()
        self.schema: pa.Schema = self.function
        self._fields = frozenset(self.schema.names)
        self._lossy = _lossy_fields(self.schema)

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        if type(records) is pa.RecordBatch:
            raise ConfigurationError(f"{self.ctx.task_name}: the stream is columnar already")
        if not records:
            return
        columns: list[tuple[Any, ...]] | None = None  # tuple rows: their columns
        try:
            if isinstance(records[0], dict):
                batch = pa.RecordBatch.from_pylist(records, schema=self.schema)
            else:
                # zip() would take a str or dict row apart into its characters or keys.
                odd = next((i for i, r in enumerate(records) if not isinstance(r, (tuple, list))), None)
                if odd is not None:
                    raise DataError(
                        f"{self.ctx.task_name}: record {odd} does not fit schema {self.schema.names} "
                        "(rows are dicts by field name, or tuples in schema order, not both): "
                        f"{short_repr(records[odd])}"
                    )
                columns = list(zip(*records, strict=True))
                batch = pa.RecordBatch.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(columns, self.schema, strict=True)],
                    schema=self.schema,
                )
        except (TypeError, ValueError, OverflowError, pa.ArrowException) as exc:
            raise DataError(
                f"{self.ctx.task_name}: rows do not fit schema {self.schema.names} "
                f"({_first_bad(records, self.schema)}): {exc}"
            ) from exc
        self._check_fit(records, batch)
        if self._lossy:
            self._check_lossless(records, columns)
        if timestamps is not None:
            ts = pa.array(timestamps, pa.int64())
            index = batch.schema.get_field_index(TS_COLUMN)  # a schema may name _ts itself
            batch = batch.set_column(index, TS_COLUMN, ts) if index >= 0 else batch.append_column(TS_COLUMN, ts)
        self.emit(batch, None)


    def _check_fit(self, records: list[Any], batch: pa.RecordBatch) -> None:
        """What Arrow lets through silently: a row that is not a dict among dicts, or
        has none of the fields, becomes all nulls; a dict's fields the schema does not
        have are dropped; a null in a non-nullable field. Only the rows that came out
        all null are looked at one by one for the first; a dict row that lacks a
        nullable field gets a null there, as in JSON."""
        where, names = self.ctx.task_name, self.schema.names
        if isinstance(records[0], dict) and batch.num_columns:
            self._check_dict_rows(records, batch)
        for f in self.schema:
            column = batch.column(f.name)
            if not f.nullable and column.null_count:
                first = int(pc.index(pc.is_null(column), True).as_py())
                raise DataError(
                    f"{where}: field {f.name!r} of schema {names} is not nullable, but record "
                    f"{first} has no value for it: {short_repr(records[first])}"
                )

    def _check_lossless(self, records: list[Any], columns: list[tuple[Any, ...]] | None) -> None:
        """What Arrow converts silently but not faithfully: a float into an integer or
        temporal field (1.5 becomes 1; an integral 2.0 is kept, it loses nothing) and a
        str or bytes into a list field (taken apart into its characters). Only the
        fields of such types are looked at, by the set of their values' types."""
        for index, name, kind in self._lossy:
            values = columns[index] if columns is not None else [r.get(name) for r in records]
            types = set(map(type, values))
            if kind == "list":
                if not types & {str, bytes, bytearray}:
                    continue
                row = next(i for i, v in enumerate(values) if isinstance(v, (str, bytes, bytearray)))
                why = "a string, which Arrow would take apart into its characters"
            else:
                if not any(issubclass(t, float) for t in types):
                    continue
                bad = (i for i, v in enumerate(values) if isinstance(v, float) and not v.is_integer())
                row = next(bad, -1)
                if row < 0:
                    continue
                why = f"{values[row]!r}, which its type {self.schema.field(name).type} would truncate"
            raise DataError(
                f"{self.ctx.task_name}: record {row} does not fit schema {self.schema.names}: "
                f"field {name!r} is {why}: {short_repr(records[row])}"
            )

    def _check_dict_rows(self, records: list[Any], batch: pa.RecordBatch) -> None:
        names, fields = self.schema.names, self._fields
        # A field the schema does not have would be dropped: often a misspelt one,
        # whose value then comes out as a null under the right name.
        extra = next(
            (i for i, r in enumerate(records) if isinstance(r, dict) and not r.keys() <= fields), None
        )
        if extra is not None:
            unknown = sorted(map(str, records[extra].keys() - fields))
            raise DataError(
                f"{self.ctx.task_name}: record {extra} has field(s) {', '.join(unknown)} that "
                f"schema {names} does not have (they would be dropped): "
                f"{short_repr(records[extra])}; add them to the schema or drop them first"
            )
        empty = pc.is_null(batch.column(0))
        for column in batch.columns[1:]:
            empty = pc.and_(empty, pc.is_null(column))
        for index in np.flatnonzero(empty.to_numpy(zero_copy_only=False)).tolist():
            record = records[index]
            if not isinstance(record, dict) or (record and not any(n in record for n in names)):
                raise DataError(
                    f"{self.ctx.task_name}: record {index} does not fit schema {names} (rows are "
                    f"dicts by field name, or tuples in schema order, not both): {short_repr(record)}"
                )


def _lossy_fields(schema: pa.Schema) -> list[tuple[int, str, str]]:
    """(index, name, kind) of the fields a Python value converts into with a silent loss:
    ``"float"`` for integer and temporal types, ``"list"`` for list types."""
    out = []
    for index, field in enumerate(schema):
        t = field.type
        if pa.types.is_integer(t) or pa.types.is_temporal(t):
            out.append((index, field.name, "float"))
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            out.append((index, field.name, "list"))
    return out


def _first_bad(records: list[Any], schema: pa.Schema) -> str:
    """Name the first record that does not convert on its own (off the hot path)."""
    for index, record in enumerate(records):
        try:
            if isinstance(record, dict):
                pa.RecordBatch.from_pylist([record], schema=schema)
            else:
                for value, f in zip(record, schema, strict=True):
                    pa.array([value], type=f.type)
        except Exception:  # the record we are looking for
            return f"record {index}: {short_repr(record)}"
    return "the batch as a whole"


class _Described:
    """A batch shown by its schema and size in errors (its rows could be millions)."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch

    def __repr__(self) -> str:
        return describe_batch(self.batch)


@dataclass(frozen=True)
class AggregateSpec:
    """What a columnar aggregation computes: ``kind`` of column ``value`` per ``key``.

    Example: ``AggregateSpec("sum", key="k", value="v")``
    """

    kind: str
    key: str
    value: str | None


class _StateSnapshot(SnapshotJob):
    """Writes a copy of the columnar state taken at the barrier (snapshot thread)."""

    def __init__(self, table: pa.Table, target: SnapshotTarget, key_groups: range, state: str) -> None:
        self.table = table
        self.target = target
        self.key_groups = key_groups
        self.state = state

    def run(self) -> KeyedStateHandle | None:
        target = self.target
        path = target.fs.join(target.directory, f"{target.name}.columnar.arrow")
        handle = write_columnar_state(
            target.fs, path, self.table, key_groups=self.key_groups, state=self.state
        )
        self.bytes_written = handle.size if handle is not None else 0
        return handle


class ColumnarKeyedOperator(Operator, ABC):
    """Base of columnar operators with keyed state: key-group range, restore, snapshot."""

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
            lambda path: storage_fs(path, options), restore.keyed, self.key_groups, self.ctx.task_name
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
        parts.keyed = _StateSnapshot(
            self.state_table(), target, self.key_groups, self.spec.payload.kind
        )
        return parts


class ColumnarAggregateOperator(ColumnarKeyedOperator):
    """Rolling keyed aggregation: per input batch, one row per key touched with its new
    running value (``key``, value column; ``count`` for counts)."""

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        agg: AggregateSpec = spec.payload
        self.state = ColumnarAggregates(
            agg.kind,
            key=agg.key,
            value=agg.value,
            max_parallelism=ctx.max_parallelism,
            where=ctx.task_name,
        )

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = _need_batch(self, records)
        if batch.num_rows:
            self.emit(self.state.update(batch), None)

    def restore_table(self, table: pa.Table) -> None:
        self.state.restore_rows(table)

    def state_table(self) -> pa.Table:
        return self.state.state_table()


@dataclass(frozen=True)
class WindowAggregateSpec:
    """A columnar window aggregation: ``kind`` of ``value`` per ``key`` and event-time
    window of ``size`` ms every ``slide`` ms (tumbling: ``slide == size``).

    Example: ``WindowAggregateSpec("sum", key="k", value="v", size=10_000, slide=10_000)``
    """

    kind: str
    key: str
    value: str | None
    size: int
    slide: int
    offset: int = 0


class ColumnarWindowAggregates(ColumnarKeyedOperator):
    """What event-time and processing-time window aggregations on batches share: one
    :class:`ColumnarAggregates` per open window (by start), firing, snapshots.

    A fired window is one batch: the key column, ``window_start``, ``window_end``, the
    value column (``count`` for counts) and ``_ts = window_end - 1``.
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
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
            )
        return window

    def _fire_due(self, time: int) -> None:
        """Emit and drop every window whose end - 1 ``time`` reached, oldest first."""
        size = self.agg.size
        for start in sorted(s for s in self.windows if s + size - 1 <= time):
            keys, values = self.windows.pop(start).result()
            n = len(keys)
            self.emit(
                pa.record_batch(
                    [
                        keys,
                        pa.array(np.full(n, start, dtype=np.int64)),
                        pa.array(np.full(n, start + size, dtype=np.int64)),
                        values,
                        pa.array(np.full(n, start + size - 1, dtype=np.int64)),
                    ],
                    names=[self.agg.key, "window_start", "window_end", _out_name(self.agg), TS_COLUMN],
                ),
                None,
            )

    def state_table(self) -> pa.Table:
        parts = []
        for start, window in self.windows.items():
            table = window.state_table()
            parts.append(table.append_column(_WINDOW, pa.array(np.full(table.num_rows, start))))
        if not parts:
            return pa.table({KG_COLUMN: pa.array([], pa.int32())})
        # Windows that saw integer keys of several widths hold them as int64, the others
        # in their own type: the file takes the widest.
        return pa.concat_tables(parts, promote_options="permissive")

    def restore_table(self, table: pa.Table) -> None:
        starts = table.column(_WINDOW).to_numpy()
        for start in np.unique(starts).tolist():
            rows = table.filter(pa.array(starts == start)).drop_columns([_WINDOW])
            window = self._window(start)
            window.restore_rows(rows)
            self._value_type = self._value_type or window.value_type


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
        batch = _need_batch(self, records)
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


_WINDOW = "_window_start"


def _out_name(agg: WindowAggregateSpec) -> str:
    return "count" if agg.kind == "count" else str(agg.value)
