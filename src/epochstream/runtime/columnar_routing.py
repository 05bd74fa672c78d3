"""Routing columnar batches: the columnar half of a record writer.

:class:`ColumnarRouter` routes whole ``pyarrow.RecordBatch`` es (hash edges: one
vectorized key-group computation and one ``take`` per batch, then a zero-copy slice per
channel) and buffers small slices until ``batch_size`` rows; :func:`with_key_groups`
adds the ``_kg`` column a hash edge routes by. The batch helpers every layer shares
(IPC frames, reserved column names, rows) are in :mod:`epochstream.core.arrow`.

Example::

    batch = with_key_groups(batch, ColumnKey("user"), max_parallelism=128)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from epochstream.core.arrow import (
    KG,
    KG_FIELD,
    concat,
    is_key_group_field,
    schema_difference,
    shown_columns,
)
from epochstream.exceptions import ConfigurationError, DataError
from epochstream.graph.transformations import ColumnKey, ColumnKeys
from epochstream.state.column_keygroups import key_groups_of_column, key_groups_of_columns

__all__ = ["ColumnarRouter", "with_key_groups"]


def with_key_groups(
    batch: pa.RecordBatch, key: ColumnKey | ColumnKeys, max_parallelism: int
) -> pa.RecordBatch:
    """``batch`` with its ``_kg`` column computed from column ``key.column`` (or the
    tuples of ``key.columns``), replacing the one an earlier hash edge added, which a
    keyed stream's ``map_batches`` carries.

    Raises :class:`ConfigurationError` naming the column and the schema when the column
    is missing or nested, and :class:`DataError` when the batch has a ``_kg`` column of
    the user's (overwriting it would lose its values)."""
    schema = batch.schema
    names = (key.column,) if isinstance(key, ColumnKey) else key.columns
    shown = repr(names[0]) if isinstance(key, ColumnKey) else repr(list(names))
    existing = schema.get_field_index(KG)
    if existing >= 0 and not is_key_group_field(schema.field(existing)):
        raise DataError(
            f"key_by({shown}): the batch has a column named {KG!r}, the name "
            "epochstream keeps the key groups of keyed batches under; rename it (in "
            f"map_batches, the source's files or the to_batches schema) (columns: {', '.join(schema.names)})"
        )
    for name in names:
        index = schema.get_field_index(name)
        if index < 0:
            raise ConfigurationError(
                f"key_by({shown}): the batch has no column {name!r} "
                f"(columns: {shown_columns(schema)})"
            )
        kind = schema.field(index).type
        if pa.types.is_nested(kind):
            # Arrow can neither hash-group nor join such keys (and a struct's dicts have no
            # stable key group); refuse them here, naming the column, not in a kernel.
            raise ConfigurationError(
                f"key_by({shown}): column {name!r} is {kind}; columnar keys are "
                "scalars (integers, strings, binary, floats, dates...): combine the parts into "
                "one column in map_batches, or call to_rows() to key rows by a tuple"
            )
    columns = [batch.column(name) for name in names]
    if isinstance(key, ColumnKey):
        kgs = key_groups_of_column(columns[0], max_parallelism)
    else:
        kgs = key_groups_of_columns(columns, max_parallelism, rows=batch.num_rows)
    groups = pa.array(kgs, pa.int32())
    if existing >= 0:
        return batch.set_column(existing, KG_FIELD, groups)
    return batch.append_column(KG_FIELD, groups)


def _in_first_order(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``batches`` with their columns in the first one's order when they have the same
    names in another order (a union of streams that built their columns differently):
    whether such batches met in one buffer must not decide whether the job fails."""
    names = batches[0].schema.names
    return [
        b.select(names)
        if b.schema.names != names and sorted(b.schema.names) == sorted(names)
        else b
        for b in batches
    ]


def _widened(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch] | None:
    """``batches`` cast to one schema when they differ only in integer widths (int64
    then, as the aggregations hold such keys) or in nullability; None when they differ
    otherwise, or a value does not fit int64 (a uint64 above 2**63 - 1)."""
    ordered = _in_first_order(batches)
    first = ordered[0].schema
    if any(b.schema.names != first.names for b in ordered):
        return None
    fields = []
    for i, name in enumerate(first.names):
        types = {b.schema.field(i).type for b in ordered}
        if len(types) > 1 and not all(pa.types.is_integer(t) for t in types):
            return None
        kind = types.pop() if len(types) == 1 else pa.int64()
        fields.append(pa.field(name, kind, any(b.schema.field(i).nullable for b in ordered)))
    target = pa.schema(fields, metadata=first.metadata)
    try:
        return [b.cast(target) for b in ordered]
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


class ColumnarRouter:
    """Routes columnar batches of one writer to its channels; buffers small parts.

    ``ship(channel, batch)`` sends a batch; ``kind`` is the edge's partitioning. A
    rebalance edge sends whole batches round-robin (slicing a batch row-wise would only
    make smaller batches).
    """

    def __init__(
        self,
        n: int,
        *,
        kind: str,
        key: Any,
        max_parallelism: int,
        batch_size: int,
        subtask_index: int,
        ship: Callable[[int, pa.RecordBatch], None],
        edge: str,
    ) -> None:
        if kind == "hash" and not isinstance(key, ColumnKey | ColumnKeys):
            raise ConfigurationError(
                f"edge {edge}: a columnar stream is keyed by a column name "
                "(key_by('column')), not by a function; call to_rows() first to key rows"
            )
        self._n = n
        self._kind = kind
        self._key: ColumnKey | ColumnKeys | None = key if kind == "hash" else None
        self._max_parallelism = max_parallelism
        self._batch_size = batch_size
        self._subtask = subtask_index
        self._next = subtask_index % max(n, 1)
        self._ship_one = ship
        self._edge = edge
        self._pending: list[list[pa.RecordBatch]] = [[] for _ in range(n)]
        self._rows = [0] * n

    def write(self, batch: pa.RecordBatch) -> None:
        """Route ``batch``: whole, or per channel by key group on a hash edge."""
        if self._kind == "hash":
            assert self._key is not None
            batch = with_key_groups(batch, self._key, self._max_parallelism)
            if self._n == 1:
                self._add(0, batch)
                return
            groups = batch.column(KG).to_numpy()
            # int16 channels: NumPy's stable sort of 16-bit ints is a radix sort, O(rows).
            channels = ((groups.astype(np.int32) * self._n) // self._max_parallelism).astype(
                np.int16
            )
            order = np.argsort(channels, kind="stable")
            counts = np.bincount(channels, minlength=self._n)
            ordered = batch.take(pa.array(order))
            start = 0
            for ch, count in enumerate(counts.tolist()):
                if count:
                    self._add(ch, ordered.slice(start, count))
                start += count
        elif self._kind == "forward":
            self._add(self._subtask, batch)
        elif self._kind == "broadcast":
            for ch in range(self._n):
                self._add(ch, batch)
        else:
            self._add(self._next, batch)
            self._next = (self._next + 1) % self._n

    def _add(self, ch: int, batch: pa.RecordBatch) -> None:
        self._pending[ch].append(batch)
        self._rows[ch] += batch.num_rows
        if self._rows[ch] >= self._batch_size:
            self.flush_channel(ch)

    def flush_channel(self, ch: int) -> None:
        """Send what channel ``ch`` buffered, as one batch."""
        pending = self._pending[ch]
        if pending:
            self._pending[ch] = []
            self._rows[ch] = 0
            try:
                batch = concat(_in_first_order(pending))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                widened = _widened(pending)
                if widened is None:
                    raise DataError(
                        f"edge {self._edge}: batches of one stream must share a schema (integer "
                        f"widths, nullability and column order may differ): "
                        f"{schema_difference([b.schema for b in pending]) or exc}"
                    ) from exc
                batch = concat(widened)
            self._ship_one(ch, batch)
