"""Dense slots for the keys of columnar state, found with vector operations.

:class:`KeyIndex` gives each distinct key a slot ``0..size-1`` in order of arrival:
the accumulators of a columnar aggregation (``state/columnar_aggregates.py``) and a session
window operator live in NumPy arrays indexed by those slots. Keys equal in Python are
one key, as their key groups are: ``-0.0`` and ``0.0``, and every NaN
(:func:`canonical_float_keys` makes Arrow's ``group_by`` see them so too).

Example::

    index = KeyIndex()
    index.slots(pa.array([7, 3]))[0].tolist() == [0, 1]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.exceptions import DataError
from epochstream.state.column_keygroups import DENSE_LIMIT
from epochstream.state.keyformat import canonical_nan

__all__ = ["KeyIndex", "canonical_float_keys", "checked_key_type"]


def canonical_float_keys(keys: pa.Array) -> pa.Array:
    """Floating-point keys with ``-0.0`` as ``0.0`` and every NaN one NaN: the keys that
    are equal (and share a key group) must fall in one group of Arrow's ``group_by``,
    which tells them apart.

    Example: ``canonical_float_keys(pa.array([-0.0])).to_pylist() == [0.0]``
    """
    if not pa.types.is_floating(keys.type):
        return keys
    if keys.type == pa.float16():  # Arrow's arithmetic has no half-float kernels
        return canonical_float_keys(keys.cast(pa.float32())).cast(pa.float16())
    keys = pc.add(keys, pa.scalar(0.0, keys.type))  # -0.0 + 0.0 is 0.0
    nan = pc.is_nan(keys)
    if pc.any(nan).as_py():
        keys = pc.if_else(nan, pa.scalar(float("nan"), keys.type), keys)
    return keys


def checked_key_type(first: pa.DataType | None, kind: pa.DataType, name: str) -> pa.DataType:
    """The key type to keep after a batch of keys of type ``kind``: ``kind`` at first,
    int64 once integer widths differ (the slots hold int64, and a key of the wider type
    would not fit the first batch's type); any other change is a :class:`DataError`
    naming ``name`` (the operator and the column).

    Example: ``checked_key_type(pa.int32(), pa.int64(), "sum(v): key column 'k'") == pa.int64()``
    """
    if first is None or kind == first:
        return kind
    if not (pa.types.is_integer(kind) and pa.types.is_integer(first)):
        raise DataError(
            f"{name} changed type from {first} to {kind} between batches; keep one key "
            "type (cast in map_batches)"
        )
    return pa.int64()


class KeyIndex:
    """Dense slots ``0..size-1`` for the distinct keys seen, in order of arrival.

    Three ways to find a key's slot, picked by what the keys are:

    - integers in ``0 <= key < DENSE_LIMIT`` (ids): a table indexed by the key value,
      so every row of a batch finds its slot with one gather (:meth:`row_slots`);
    - other integers: a binary search over a sorted copy of the keys;
    - any other type (strings, nulls...): a dict of Python values.

    Example::

        index = KeyIndex()
        index.slots(pa.array([7, 3]))[0].tolist() == [0, 1]
        index.slots(pa.array([3, 9]))[0].tolist() == [1, 2]
        index.row_slots(pa.array([9, 9, 7]))[0].tolist() == [2, 2, 0]
    """

    def __init__(self, name: str = "key column") -> None:
        self.name = name  # for errors: the operator and the column
        self.size = 0
        self.key_type: pa.DataType | None = None
        self._numeric: bool | None = None
        self._values = np.empty(0, dtype=np.int64)  # numeric: key of each slot
        # Dense: slot of each key value (-1: none), while every key fits the table.
        self._dense: np.ndarray | None = np.empty(0, dtype=np.int32)
        self._sorted = np.empty(0, dtype=np.int64)  # sparse: keys sorted, and their slots
        self._sorted_slots = np.empty(0, dtype=np.int64)
        self._dict: dict[Any, int] = {}
        self._list: list[Any] = []  # generic: key of each slot

    def _prepare(self, keys: pa.Array) -> bool:
        """Note the key type; whether ``keys`` take the numeric paths."""
        if self.key_type is None:
            self._numeric = pa.types.is_integer(keys.type)
        self.key_type = checked_key_type(self.key_type, keys.type, self.name)
        if self._numeric and keys.null_count:
            self._to_generic()
        return bool(self._numeric)

    def row_slots(self, keys: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
        """The slot of every row's key (repeats allowed) and the slots made for new
        keys; ``None`` unless the keys are dense integers (then use :meth:`slots`)."""
        if not self._prepare(keys) or self._dense is None:
            return None
        q = keys.to_numpy().astype(np.int64, copy=False)
        if not len(q):
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        if q.min() < 0 or q.max() >= DENSE_LIMIT:
            self._to_sparse()
            return None
        dense = self._dense_upto(int(q.max()))
        slots = dense[q]
        missing = slots < 0
        if not missing.any():
            return slots, np.empty(0, dtype=np.int64)
        new_keys = np.unique(q[missing])
        fresh = self._add_numeric(new_keys)
        return dense[q], fresh

    def slots(self, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """The slot of each key (all distinct) and a mask of the keys that were new."""
        if not self._prepare(keys):
            return self._generic_slots(keys.to_pylist())
        q = keys.to_numpy().astype(np.int64, copy=False)
        if self._dense is not None and len(q) and (q.min() < 0 or q.max() >= DENSE_LIMIT):
            self._to_sparse()
        if self._dense is not None:
            dense = self._dense_upto(int(q.max()) if len(q) else 0)
            slots = dense[q].astype(np.int64)
            new = slots < 0
            if new.any():
                slots[new] = self._add_numeric(q[new])
            return slots, new
        return self._sparse_slots(q)

    def _dense_upto(self, top: int) -> np.ndarray:
        dense = self._dense
        assert dense is not None
        if len(dense) <= top:
            grown = np.full(max(1024, 1 << top.bit_length()), -1, dtype=np.int32)
            grown[: len(dense)] = dense
            self._dense = dense = grown
        return dense

    def _add_numeric(self, new_keys: np.ndarray) -> np.ndarray:
        """Slots for ``new_keys`` (distinct, unseen), in the dense table if there is one."""
        fresh = np.arange(self.size, self.size + len(new_keys), dtype=np.int64)
        self.size += len(new_keys)
        self._values = np.concatenate([self._values, new_keys])
        if self._dense is not None:
            self._dense[new_keys] = fresh
        else:
            merged = np.concatenate([self._sorted, new_keys])
            order = np.argsort(merged, kind="stable")
            self._sorted = merged[order]
            self._sorted_slots = np.concatenate([self._sorted_slots, fresh])[order]
        return fresh

    def _sparse_slots(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sorted_keys = self._sorted
        pos = np.searchsorted(sorted_keys, q)
        found = pos < len(sorted_keys)
        found[found] = sorted_keys[pos[found]] == q[found]
        slots = np.empty(len(q), dtype=np.int64)
        slots[found] = self._sorted_slots[pos[found]]
        new = ~found
        if new.any():
            slots[new] = self._add_numeric(q[new])
        return slots, new

    def _to_sparse(self) -> None:
        self._dense = None
        order = np.argsort(self._values, kind="stable")
        self._sorted = self._values[order]
        self._sorted_slots = order.astype(np.int64)

    def _generic_slots(self, values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        table = self._dict
        slots = np.empty(len(values), dtype=np.int64)
        new = np.zeros(len(values), dtype=bool)
        for i, value in enumerate(values):
            value = canonical_nan(value)
            slot = table.get(value)
            if slot is None:
                slot = table[value] = self.size
                self._list.append(value)
                self.size += 1
                new[i] = True
            slots[i] = slot
        return slots, new

    def _to_generic(self) -> None:
        self._list = self._values.tolist()
        self._dict = {k: i for i, k in enumerate(self._list)}
        self._numeric = False
        self._dense = None

    def keys_at(self, slots: np.ndarray) -> pa.Array:
        """The keys of ``slots`` as an Arrow array of the key type."""
        if self._numeric:
            # uint64 keys above 2**63 are held wrapped into int64; the unchecked cast
            # wraps them back (every value came from the key type, so nothing truncates).
            return pa.array(self._values[slots]).cast(self.key_type, safe=False)
        values = self._list
        return pa.array([values[s] for s in slots.tolist()], type=self.key_type)
