"""The values a ``COUNT(DISTINCT)`` of an unwindowed GROUP BY has seen per group, over
an append-only input.

State is a row table of the keyed-state backend keyed by the group's state key, one row
per (group, value) seen: snapshots, restores and rescaling go by key group as for every
row table, on heap and RocksDB alike. A batch appends only the values its groups had not
seen, so its cost does not grow with the groups' sets:

- on the **heap** backend the values are indexed in memory, per group a Python ``set``
  (rebuilt from the row table on restore): a batch checks its distinct (group, value)
  pairs against them, one hash lookup each (Flink's ``MapState`` per distinct value);
- on **RocksDB** (whose state need not fit in memory) a batch reads its groups' values
  and finds its new pairs with one Arrow hash join (the batch's pairs hashed, the stored
  ones probed): one pass over the groups' values, nothing rewritten.

Example::

    values = DistinctValues(table, "_sa_key", "bidder", indexed=True)
    before, after = values.update(found, batch_values)   # each group's count, then and now
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import table_batch
from epochstream.runtime.operators.columnar_group_keys import BatchKeys, key_slots
from epochstream.state.backends.base import RowTable
from epochstream.state.keyformat import canonical_nan

__all__ = ["DistinctValues"]

#: A pair's group: its position among the batch's distinct keys.
_ID = "_dv_id"


class DistinctValues:
    """One ``COUNT(DISTINCT)`` aggregate's values per group (see the module docstring).

    Example::

        values = DistinctValues(table, "k", "v", indexed=False)
        values.update(found, pa.array([1, 1, 2]))   # (array([0]), array([2])) for one group
    """

    def __init__(self, table: RowTable, state_key: str, column: str, *, indexed: bool) -> None:
        self.table = table
        self.state_key = state_key
        self.column = column
        #: Heap: per group (its state key's Python value) the values seen.
        self._index: dict[Any, set[Any]] | None = {} if indexed else None
        if self._index is not None:
            stored = table.table()
            if stored.num_rows:
                index = self._index
                canonical = _canonical(stored.column(column).type)
                keys = stored.column(state_key).to_pylist()
                for key, value in zip(keys, stored.column(column).to_pylist(), strict=True):
                    index.setdefault(key, set()).add(canonical(value))

    def drop(self, keys: pa.Array, key_groups: np.ndarray) -> None:
        """Forget the values of the groups ``keys`` (expired: such a group starts over)."""
        if not len(keys):
            return
        self.table.pop(keys, key_groups)
        if self._index is not None:
            for key in keys.to_pylist():
                self._index.pop(key, None)

    def update(self, found: BatchKeys, values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Add a batch's ``values`` (per row, the group ``found.slots``); each of the
        batch's groups' distinct count before and after it (nulls are not counted)."""
        n = len(found.keys)
        pairs = pa.table({_ID: found.slots, self.column: values})
        pairs = pairs.filter(pc.is_valid(values))
        pairs = pairs.group_by([_ID, self.column], use_threads=False).aggregate([])
        if self._index is not None:
            before, after, new = self._indexed(found, pairs, n)
        else:
            before, after, new = self._read(found, pairs, n)
        if new.num_rows:
            ids = new.column(_ID).to_numpy()
            stored = pa.table(
                {
                    self.state_key: found.keys.take(pa.array(ids)),
                    self.column: new.column(self.column),
                }
            )
            self.table.append(table_batch(stored), found.key_groups[ids])
        return before, after

    def _indexed(
        self, found: BatchKeys, pairs: pa.Table, n: int
    ) -> tuple[np.ndarray, np.ndarray, pa.Table]:
        assert self._index is not None
        index = self._index
        groups = [index.setdefault(key, set()) for key in found.keys.to_pylist()]
        before = np.fromiter(map(len, groups), dtype=np.int64, count=n)
        values = pairs.column(self.column)
        canonical = _canonical(values.type)
        new = np.zeros(pairs.num_rows, dtype=bool)
        ids = pairs.column(_ID).to_numpy().tolist()
        for row, (slot, value) in enumerate(zip(ids, values.to_pylist(), strict=True)):
            seen = groups[slot]
            value = canonical(value)
            if value not in seen:
                seen.add(value)
                new[row] = True
        after = np.fromiter(map(len, groups), dtype=np.int64, count=n)
        return before, after, pairs.filter(pa.array(new))

    def _read(
        self, found: BatchKeys, pairs: pa.Table, n: int
    ) -> tuple[np.ndarray, np.ndarray, pa.Table]:
        stored = self.table.read(found.keys, found.key_groups)
        stored_at = key_slots(stored.column(self.state_key), found.keys)
        before = np.bincount(stored_at, minlength=n).astype(np.int64)
        new = pairs
        if stored.num_rows and pairs.num_rows:
            value_type = pairs.column(1).type
            seen = pa.table(
                {_ID: stored_at, self.column: stored.column(self.column).cast(value_type)}
            )
            # The batch's pairs (few) are hashed, the stored ones (many) probed.
            new = seen.join(
                pairs, keys=[_ID, self.column], join_type="right anti", use_threads=False
            ).select([_ID, self.column])
        ids = new.column(_ID).to_numpy()
        return before, before + np.bincount(ids, minlength=n).astype(np.int64), new


def _canonical(value_type: pa.DataType) -> Any:
    """How a value enters a Python set: floats' NaNs as one NaN (Arrow's group_by and
    hash join take every NaN as one value, Python's set would not)."""
    if pa.types.is_floating(value_type):
        return canonical_nan
    return _same


def _same(value: Any) -> Any:
    return value
