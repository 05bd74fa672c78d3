"""Columnar transforms: whole Arrow record batches in, whole batches out, no state.

- :class:`MapBatchesOperator`: ``fn(batch) -> batch`` (``map_batches``);
- :class:`FilterBatchesOperator`: rows where an Arrow compute expression holds;
- :class:`ToRowsOperator` / :class:`ToBatchesOperator`: the explicit conversions
  between the two forms (``_ts`` <-> the row path's timestamps list).

Event time rides in the ``_ts`` column; an operator whose function drops it gets it
back when the output has the input's rows (``map_batches`` keeping rows one to one).

Example::

    op = FilterBatchesOperator(spec, ctx)      # spec.payload = pc.field("x") > 3
    op.output = ChainedOutput(sink_op, produced=op.counters, consumed=sink_op.counters)
    op.process_batch(pa.record_batch([pa.array([1, 5])], names=["x"]), None)   # prints 1
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.arrow import is_key_group_field, plain_types, rows_of
from epochstream.exceptions import ConfigurationError, DataError, UserFunctionError, short_repr
from epochstream.runtime.operators.base import Operator

__all__ = [
    "FilterBatchesOperator",
    "MapBatchesOperator",
    "ToBatchesOperator",
    "ToRowsOperator",
    "apply_batch_function",
    "describe_batch",
    "need_batch",
]


def describe_batch(batch: Any) -> str:
    """A short description of a batch for errors (its schema and size, not its rows)."""
    if isinstance(batch, pa.RecordBatch):
        return f"<batch of {batch.num_rows} rows: {', '.join(batch.schema.names)}>"
    return f"<{type(batch).__name__}>"


def need_batch(op: Operator, item: Any) -> pa.RecordBatch:
    """``item`` if it is an Arrow record batch, else a ConfigurationError naming ``op``'s
    task (a row stream was given to a columnar operator).

    Example: ``batch = need_batch(self, records)`` at the top of ``process_batch``.
    """
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
        raise DataError(
            f"{where}: {what} function returned {type(out).__name__}, not a pyarrow.RecordBatch"
        )
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


class MapBatchesOperator(Operator):
    """``fn(batch)`` per batch; the result must be a ``pyarrow.RecordBatch``."""

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        out = apply_batch_function(self.function, batch, self.ctx.task_name, "map_batches")
        if out.num_rows:
            self.output.collect(out, None)


class FilterBatchesOperator(Operator):
    """The rows for which the Arrow compute expression (the payload) is true."""

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        try:
            out = batch.filter(self.function)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise DataError(
                f"{self.ctx.task_name}: filter {self.function} cannot be evaluated on "
                f"{describe_batch(batch)}: {exc}"
            ) from exc
        if out.num_rows:
            self.output.collect(out, None)


class ToRowsOperator(Operator):
    """Each row as a dict (internal ``_kg``/``_ts`` columns dropped; ``_ts`` becomes the
    row's timestamp)."""

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        schema = batch.schema
        ts = batch.column(TS_COLUMN).to_pylist() if TS_COLUMN in schema.names else None
        keep = [f.name for f in schema if f.name != TS_COLUMN and not is_key_group_field(f)]
        if len(keep) != len(schema):
            batch = batch.select(keep)
        self.output.collect(rows_of(batch), ts)


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
                odd = next(
                    (i for i, r in enumerate(records) if not isinstance(r, (tuple, list))), None
                )
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
            batch = (
                batch.set_column(index, TS_COLUMN, ts)
                if index >= 0
                else batch.append_column(TS_COLUMN, ts)
            )
        self.output.collect(batch, None)

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
                row = next(
                    i for i, v in enumerate(values) if isinstance(v, (str, bytes, bytearray))
                )
                why = "a string, which Arrow would take apart into its characters"
            else:
                if not any(issubclass(t, float) for t in types):
                    continue
                bad = (
                    i for i, v in enumerate(values) if isinstance(v, float) and not v.is_integer()
                )
                row = next(bad, -1)
                if row < 0:
                    continue
                why = (
                    f"{values[row]!r}, which its type {self.schema.field(name).type} would truncate"
                )
            raise DataError(
                f"{self.ctx.task_name}: record {row} does not fit schema {self.schema.names}: "
                f"field {name!r} is {why}: {short_repr(records[row])}"
            )

    def _check_dict_rows(self, records: list[Any], batch: pa.RecordBatch) -> None:
        names, fields = self.schema.names, self._fields
        # A field the schema does not have would be dropped: often a misspelt one,
        # whose value then comes out as a null under the right name.
        extra = next(
            (i for i, r in enumerate(records) if isinstance(r, dict) and not r.keys() <= fields),
            None,
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
