"""The heap backend's columnar state: a :class:`KeyIndex` gives every key a dense slot,
and each accumulator field is one NumPy array indexed by slot.

Columnar operators on the heap backend update the arrays in place (``index``,
``kg`` and ``arrays`` are theirs to use, see
:class:`~epochstream.state.columnar_aggregates.ColumnarAggregates`): a batch costs a
few vectorized steps and no per-key copy. :meth:`HeapColumnTable.read` and
:meth:`HeapColumnTable.write` give the same state through the backend-neutral
interface.

Snapshots write :meth:`HeapColumnTable.table` as the columnar Arrow file
(:class:`~epochstream.state.handles.ColumnarSnapshotHandle`, one record batch per key
group): the format columnar state had before it moved behind the backend, so those
checkpoints restore unchanged.

Example::

    table = HeapColumnTable("sum", ColumnSchema((("acc", "int64", 0), ("count", "int64", 0))))
    table.write(pa.array(["a"]), np.array([7]), {"acc": np.array([5]), "count": np.array([1])})
    table.read(pa.array(["a", "b"]), np.array([7, 9]))["acc"].tolist() == [5, 0]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from epochstream.core.arrow import KG
from epochstream.exceptions import StateError
from epochstream.state.backends.base import COLUMN_KEY, ColumnSchema, ColumnTable
from epochstream.state.key_index import KeyIndex

__all__ = ["COLUMNAR", "HeapColumnTable"]

#: The state kind of columnar state in canonical savepoints (a RocksDB backend's).
COLUMNAR = "columnar"


class HeapColumnTable(ColumnTable):
    """One columnar state in memory: slots by :class:`KeyIndex`, fields in NumPy arrays.

    Example: ``HeapColumnTable("count", schema).slots_of(keys, kgs)`` gives each key's
    slot, making slots (at the identities) for new keys.
    """

    def __init__(self, name: str, schema: ColumnSchema, where: str = "") -> None:
        self.name = name
        self._schema = schema
        self.index = KeyIndex(where or f"columnar state {name!r}")
        self.kg = np.empty(0, dtype=np.int32)
        self.arrays = {f: np.empty(0, dtype=kind) for f, kind, _ in schema.fields}

    @property
    def schema(self) -> ColumnSchema:
        return self._schema

    def set_schema(self, schema: ColumnSchema) -> None:
        if schema.names != self._schema.names:
            raise StateError(
                f"columnar state {self.name!r} holds fields {self._schema.names}, "
                f"not {schema.names}"
            )
        # A restored file may hold int64 accumulators where the operator now keeps
        # float64 (or the reverse): the values convert, as the file's type did before.
        for name, kind, _ in schema.fields:
            self.arrays[name] = self.arrays[name].astype(kind, copy=False)
        self._schema = schema

    def __len__(self) -> int:
        return self.index.size

    def grow(self, size: int) -> None:
        """Room for ``size`` slots (capacity doubles: amortized growth)."""
        if size <= len(self.kg):
            return
        capacity = max(size, 2 * len(self.kg), 1024)
        self.kg = np.resize(self.kg, capacity)
        for name in self.arrays:
            self.arrays[name] = np.resize(self.arrays[name], capacity)

    def init_slots(self, slots: np.ndarray, key_groups: np.ndarray) -> None:
        """New slots: their key groups, fields at the identities."""
        self.kg[slots] = key_groups
        for name, _kind, identity in self._schema.fields:
            self.arrays[name][slots] = identity

    def slots_of(self, keys: pa.Array, key_groups: np.ndarray) -> np.ndarray:
        """The slot of each of ``keys`` (distinct); new keys get slots at the identities."""
        slots, new = self.index.slots(keys)
        self.grow(self.index.size)
        if new.any():
            self.init_slots(slots[new], np.asarray(key_groups)[new])
        return slots

    def read(self, keys: pa.Array, key_groups: np.ndarray) -> dict[str, np.ndarray]:
        # A key read gets its slot (at the identities) at once: columnar operators
        # write back every key they read, so it never stays an empty entry.
        slots = self.slots_of(keys, key_groups)
        return {name: array[slots] for name, array in self.arrays.items()}

    def write(self, keys: pa.Array, key_groups: np.ndarray, values: dict[str, np.ndarray]) -> None:
        slots = self.slots_of(keys, key_groups)
        for name, array in self.arrays.items():
            array[slots] = values[name]

    def table(self) -> pa.Table:
        n = self.index.size
        columns = {KG: pa.array(self.kg[:n].copy())}
        columns[COLUMN_KEY] = self.index.keys_at(np.arange(n, dtype=np.int64))
        for name, array in self.arrays.items():
            columns[name] = pa.array(array[:n].copy())
        return pa.table(columns)

    def load(self, table: pa.Table, keys: pa.Array) -> None:
        """Add the entries of a state file's rows (``keys``: their key column)."""
        if table.num_rows == 0:
            return
        slots, new = self.index.slots(keys)
        if not new.all():
            raise StateError(f"{self.index.name}: restored state holds a key twice")
        self.grow(self.index.size)
        self.kg[slots] = table.column(KG).to_numpy()
        for name in self.arrays:
            values = table.column(name).to_numpy()
            if self.index.size == len(slots) and values.dtype != self.arrays[name].dtype:
                self.arrays[name] = self.arrays[name].astype(values.dtype)
            self.arrays[name][slots] = values
