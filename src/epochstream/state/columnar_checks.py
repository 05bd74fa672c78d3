"""Checks of columnar input that Arrow and NumPy would let through silently: null event
times, uint64 values beyond the int64 accumulators, and int64 sums that wrap around.
Each raises :class:`~epochstream.exceptions.DataError` naming the operator, so the job
fails once instead of restarting into the same data.

Example::

    ts = event_times(batch, "window (1/2)")        # int64 array, or DataError on a null
    check_value_range(batch["v"], "sum(v) (1/2)", "v")
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import TS, shown_columns
from epochstream.exceptions import ConfigurationError, DataError, short_repr

__all__ = [
    "IntSumGuard",
    "check_value_range",
    "checked_value_type",
    "event_times",
    "require_columns",
    "value_type_of",
    "with_value_type",
]


def require_columns(schema: pa.Schema, columns: tuple[str | None, ...], where: str) -> None:
    """A :class:`ConfigurationError` naming ``where`` and the first of ``columns`` (None
    entries skipped) that ``schema`` lacks; retrying cannot add a column.

    Example: ``require_columns(batch.schema, ("k", "v"), "sum(v) (1/2)")``
    """
    names = schema.names
    for column in columns:
        if column and column not in names:
            raise ConfigurationError(
                f"{where}: the batch has no column {column!r} (columns: {shown_columns(schema)})"
            )


def event_times(batch: pa.RecordBatch, where: str) -> np.ndarray:
    """The ``_ts`` column of ``batch`` as int64 milliseconds; a null event time (a
    ``map_batches`` or ``to_batches`` that left one out) is a :class:`DataError` naming
    ``where``, not a time of -2**63.

    Example: ``event_times(pa.record_batch([pa.array([5])], names=["_ts"]), "op").tolist() == [5]``
    """
    column = batch.column(TS)
    if column.null_count:
        raise DataError(
            f"{where}: {column.null_count} of {batch.num_rows} rows have no event time (null "
            f"{TS}); give every row a timestamp (columns: {shown_columns(batch.schema)})"
        )
    return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def checked_value_type(
    first: pa.DataType | None, kind: pa.DataType, where: str, column: str
) -> pa.DataType:
    """The value column's type to keep: ``kind`` on the first batch (integer or floating
    point only), ``first`` after it. A column that turns from integer to floating point
    or back, or to anything else, between batches is a :class:`DataError`; integer
    widths may differ.

    Example: ``kind = checked_value_type(kind, batch.schema.field("v").type, "sum(v) (1/2)", "v")``
    """
    if first is None:
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise ConfigurationError(
                f"{where}: column {column!r} is {kind}; columnar aggregations take integer "
                "or floating-point columns"
            )
        return kind
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if not numeric or pa.types.is_floating(kind) != pa.types.is_floating(first):
        raise DataError(
            f"{where}: column {column!r} changed type from {first} to {kind} between "
            "batches; keep one type (cast in map_batches)"
        )
    return first


def check_value_range(column: pa.Array | pa.ChunkedArray, where: str, name: str) -> None:
    """Accumulators are int64: a uint64 value above 2**63 - 1 is a :class:`DataError`
    naming ``where`` and column ``name`` (NumPy would wrap it to a negative number).

    Example: ``check_value_range(pa.array([1], pa.uint64()), "sum(v) (1/1)", "v")``
    """
    if column.type != pa.uint64() or column.null_count == len(column):
        return
    top = pc.max(column).as_py()
    if top > 2**63 - 1:
        raise DataError(
            f"{where}: column {name!r} holds {top}, above the int64 range the aggregations "
            "compute in; cast it to float64 in map_batches"
        )


class IntSumGuard:
    """Fails an int64 sum that would wrap around, as NumPy and Arrow sums do silently
    (the row path's Python ints never wrap).

    Cheap per batch: a running bound of every sum's magnitude grows by the batch's
    largest magnitude times its values (one ``min_max``). Only when the bound passes
    2**62 is it reset to the largest sum held, and if it is still that high the batch is
    :meth:`risky`: the caller folds it and :meth:`check` compares the int64 results with
    float64 ones, which differ by about 2**64 where a sum wrapped.

    Example::

        guard = IntSumGuard("sum(v) (1/1)", "v")
        guard.risky(pa.array([1, 2]), held=lambda: 0.0)   # False: nothing near 2**63
    """

    _LIMIT = 2.0**62

    def __init__(self, where: str, column: str) -> None:
        self.where = where
        self.column = column
        self.bound = 0.0

    def risky(self, values: pa.Array | pa.ChunkedArray, held: Any) -> bool:
        """Whether folding ``values`` might wrap a sum; ``held()`` is the largest
        magnitude of the sums held now (asked only when the bound is high)."""
        low, high = pc.min_max(values).values()
        if low.as_py() is None:
            return False
        step = float(max(abs(low.as_py()), abs(high.as_py()))) * (len(values) - values.null_count)
        self.bound += step
        if self.bound < self._LIMIT:
            return False
        self.bound = float(held()) + step
        return self.bound >= self._LIMIT

    def check(self, sums: np.ndarray, estimates: np.ndarray, keys: Any) -> None:
        """Raise :class:`DataError` naming the first key whose int64 sum wrapped
        (``estimates``: the same sums in float64; ``keys(i)``: the i-th key)."""
        wrapped = np.flatnonzero(np.abs(sums.astype(np.float64) - estimates) > 2.0**62)
        if len(wrapped):
            raise DataError(
                f"{self.where}: the sum of column {self.column!r} overflows int64 for key "
                f"{short_repr(keys(int(wrapped[0])))} (about {estimates[wrapped[0]]:.3g}); cast "
                "the column to float64 in map_batches"
            )


_VALUE_TYPE = b"epochstream.value_type"


def with_value_type(table: pa.Table, kind: pa.DataType | None) -> pa.Table:
    """``table`` (a state table) noting the aggregated column's type in its schema
    metadata, so a restore puts out min/max in that type before any new batch.

    Example: ``value_type_of(with_value_type(table, pa.int32())) == pa.int32()``
    """
    if kind is None:
        return table
    serialized = pa.schema([pa.field("value", kind)]).serialize().to_pybytes()
    return table.replace_schema_metadata({_VALUE_TYPE: serialized})


def value_type_of(table: pa.Table) -> pa.DataType | None:
    """The type :func:`with_value_type` noted in ``table``, or None (older state)."""
    metadata = table.schema.metadata or {}
    serialized = metadata.get(_VALUE_TYPE)
    if serialized is None:
        return None
    return pa.ipc.read_schema(pa.py_buffer(serialized)).field("value").type
