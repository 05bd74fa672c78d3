"""The group keys of a keyed aggregation on batches, as its row tables file them.

A SQL aggregation groups by zero or more columns. Its state is filed under one key
column: the key column itself when there is one, else ``_sa_key``, the ``encode_key``
bytes of the tuple of the key columns' values (of the empty tuple for a global
aggregation). :class:`GroupKeys` turns a batch into those keys: each row's slot into
the batch's distinct keys, each distinct key's key group (that of the hash edge that
routed the rows), and the key columns' values per distinct key (for output rows).

Example::

    keys = GroupKeys(("k1", "k2"), "agg (1/1)", 128)
    found = keys.of(batch, {"k1": pa.int64(), "k2": pa.string()})
    found.keys          # the distinct state keys (large_binary: the tuples' bytes)
    found.slots         # per row, its key's position in found.keys
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.exceptions import DataError
from epochstream.state.column_keygroups import key_groups_by_columns, tuple_keys_of_columns
from epochstream.state.key_index import canonical_float_keys
from epochstream.state.keyformat import encode_key

__all__ = ["TUPLE_KEY", "BatchKeys", "GroupKeys", "key_slots"]

#: The state key column of several key columns, or none: their tuple's ``encode_key``.
TUPLE_KEY = "_sa_key"


@dataclass
class BatchKeys:
    """A batch's group keys: ``columns`` (the key columns as state holds them, per row),
    ``keys`` (the distinct state keys), ``slots`` (per row, its key's position in
    ``keys``), ``key_groups`` (per distinct key) and ``first`` (per distinct key, the
    row it first appears in)."""

    columns: dict[str, pa.Array]
    keys: pa.Array
    slots: np.ndarray
    key_groups: np.ndarray
    first: np.ndarray


class GroupKeys:
    """The state keys of ``keys`` (column names) for batches of one operator (see the
    module docstring)."""

    def __init__(self, keys: tuple[str, ...], where: str, max_parallelism: int) -> None:
        self.names = keys
        self.where = where
        self.max_parallelism = max_parallelism
        #: The column the operator's row tables are keyed by.
        self.state_key = keys[0] if len(keys) == 1 else TUPLE_KEY

    def of(self, batch: pa.RecordBatch, types: dict[str, pa.DataType]) -> BatchKeys:
        """``batch``'s keys, its key columns cast to ``types`` (the types state holds:
        equal floats alike, integers in the first batch's widths)."""
        columns: dict[str, pa.Array] = {}
        for name in self.names:
            column = canonical_float_keys(batch.column(name))
            kind = types.get(name, column.type)
            if column.type != kind:
                try:
                    column = column.cast(kind)
                except pa.ArrowInvalid as exc:
                    raise DataError(
                        f"{self.where}: key column {name!r}: values of type {column.type} do "
                        f"not fit {kind}: {exc}"
                    ) from exc
            columns[name] = column
        n = batch.num_rows
        if len(self.names) == 1:
            state_keys = columns[self.names[0]]
        elif self.names:
            state_keys = tuple_keys_of_columns(list(columns.values()))
        else:
            state_keys = pa.array([encode_key(())] * n, pa.large_binary())
        if KG_COLUMN in batch.schema.names:  # routed by a hash edge on these keys
            row_kgs = batch.column(KG_COLUMN).to_numpy(zero_copy_only=False).astype(np.int32)
        else:
            row_kgs = key_groups_by_columns(list(columns.values()), self.max_parallelism, rows=n)
        encoded = pc.dictionary_encode(state_keys, null_encoding="encode")
        slots = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        distinct = len(encoded.dictionary)
        first = np.full(distinct, n, dtype=np.int64)
        np.minimum.at(first, slots, np.arange(n, dtype=np.int64))
        return BatchKeys(columns, encoded.dictionary, slots, row_kgs[first], first)


def key_slots(column: pa.ChunkedArray | pa.Array, keys: pa.Array) -> np.ndarray:
    """The position in ``keys`` (distinct) of every value of ``column``."""
    found = pc.index_in(column, value_set=keys, skip_nulls=False)
    if isinstance(found, pa.ChunkedArray):
        found = found.combine_chunks()
    return found.to_numpy(zero_copy_only=False).astype(np.int64)
