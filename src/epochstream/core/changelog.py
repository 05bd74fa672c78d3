"""Changelog batches: Flink's row kinds on the columnar path.

An updating result (a ``GROUP BY`` without a window, later joins and Top-N over such
results) is a stream of changes: each row is an insert (``+I``), the old value of an
update (``-U``), its new value (``+U``) or a delete (``-D``). On the columnar path a
batch carries them in one int8 column, ``_op``, holding Flink's ``RowKind`` byte values;
a batch without it is all inserts (an append-only stream). Like ``_ts`` and ``_kg`` the
name is reserved.

Example::

    batch = with_kinds(pa.record_batch({"k": ["a", "a"]}), [RowKind.INSERT, RowKind.DELETE])
    weights(batch).tolist() == [1, -1]
    kind_names(batch.column(OP)).to_pylist() == ["+I", "-D"]
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.exceptions import DataError

__all__ = [
    "OP",
    "KindsFromColumn",
    "KindsToColumn",
    "RowKind",
    "is_changelog",
    "kind_names",
    "weights",
    "with_kinds",
]

#: The row kind column of a changelog batch (int8, :class:`RowKind` values).
OP = "_op"


class RowKind(IntEnum):
    """The kind of change a row is, with Flink's ``RowKind`` byte values.

    Example: ``RowKind.UPDATE_AFTER.short == "+U"``
    """

    INSERT = 0
    UPDATE_BEFORE = 1
    UPDATE_AFTER = 2
    DELETE = 3

    @property
    def short(self) -> str:
        """Flink's short string: ``+I``, ``-U``, ``+U`` or ``-D``."""
        return _SHORT[self.value]

    @property
    def adds(self) -> bool:
        """Whether the row adds its value (``+I``, ``+U``) rather than retracts it."""
        return self in (RowKind.INSERT, RowKind.UPDATE_AFTER)


_SHORT = ("+I", "-U", "+U", "-D")


def is_changelog(schema: pa.Schema) -> bool:
    """Whether batches of ``schema`` carry row kinds (an ``_op`` column)."""
    return OP in schema.names


def weights(batch: pa.RecordBatch | pa.Table) -> np.ndarray:
    """Each row's signed weight (int64): +1 for ``+I``/``+U`` (and every row of a batch
    without ``_op``), -1 for ``-U``/``-D``."""
    if OP not in batch.schema.names:
        return np.ones(batch.num_rows, dtype=np.int64)
    kinds = np.asarray(pc.fill_null(batch.column(OP), 0).to_numpy(zero_copy_only=False))
    return np.where((kinds == RowKind.INSERT) | (kinds == RowKind.UPDATE_AFTER), 1, -1).astype(
        np.int64
    )


def with_kinds(batch: pa.RecordBatch, kinds: Sequence[int] | np.ndarray) -> pa.RecordBatch:
    """``batch`` with its ``_op`` column set to ``kinds`` (appended last, or replaced)."""
    column = pa.array(np.asarray(kinds, dtype=np.int8), pa.int8())
    if OP in batch.schema.names:
        return batch.set_column(batch.schema.get_field_index(OP), OP, column)
    return batch.append_column(OP, column)


def kind_names(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The short strings (``+I``...) of an ``_op`` column."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return pa.array(_SHORT, pa.string()).take(column.cast(pa.int32()))


class KindsToColumn:
    """A batch's row kinds as a string column ``column`` (``+I``, ``-U``, ``+U``,
    ``-D``; every row ``+I`` in a batch without ``_op``), first, in place of ``_op``:
    a changelog as plain data (``DataStream.to_changelog``). Picklable.

    Example: ``KindsToColumn("op")(batch).column("op").to_pylist() == ["+I", "-D"]``
    """

    def __init__(self, column: str) -> None:
        self.column = column

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if OP in batch.schema.names:
            kinds = kind_names(batch.column(OP))
            batch = batch.drop_columns([OP])
        else:
            kinds = pa.array(["+I"] * batch.num_rows, pa.string())
        if self.column in batch.schema.names:
            raise DataError(
                f"to_changelog: the batch has a column {self.column!r} already; name the "
                "kinds' column otherwise (to_changelog(column=...))"
            )
        return pa.RecordBatch.from_arrays(
            [kinds, *batch.columns], names=[self.column, *batch.schema.names]
        )


class KindsFromColumn:
    """The row kinds of a string column ``column`` (``+I``, ``-U``, ``+U``, ``-D``) as
    the batch's ``_op``, the column dropped: plain data as a changelog
    (``DataStream.from_changelog``). A missing column or another value is a
    :class:`DataError` naming it and its row. Picklable.

    Example: ``KindsFromColumn("op")(batch).column("_op").to_pylist() == [0, 3]``
    """

    def __init__(self, column: str) -> None:
        self.column = column

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.column not in batch.schema.names:
            raise DataError(
                f"from_changelog: the batch has no column {self.column!r} (columns: "
                f"{', '.join(batch.schema.names)})"
            )
        names = batch.column(self.column)
        kinds = pc.index_in(names, value_set=pa.array(_SHORT))
        if kinds.null_count:
            bad = pc.index(pc.is_null(kinds), True).as_py()
            raise DataError(
                f"from_changelog: row {bad} of the batch has {self.column!r} = "
                f"{names[bad].as_py()!r}, not one of {', '.join(_SHORT)}"
            )
        batch = batch.drop_columns([self.column])
        return with_kinds(batch, kinds.to_numpy(zero_copy_only=False))
