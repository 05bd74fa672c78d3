"""Columnar keyed aggregation state: one slot per key, accumulators in NumPy arrays.

A batch updates the state with a handful of vectorized steps: Arrow's hash
``group_by`` folds the batch per key, :class:`KeyIndex` maps the batch's distinct keys
to dense slots (new keys get new slots), and NumPy applies the partial aggregates to
the accumulator arrays at those slots. Nothing runs per record in Python.

Where the state lives is the keyed-state backend's business (``backend=``, a
:meth:`~epochstream.state.backends.base.KeyedStateBackend.column_table`): on the heap
backend the slots and arrays *are* the backend's table, updated in place; on RocksDB
each fold reads the batch's distinct keys into a scratch table (one multi-get), folds
there with the same code, and writes the touched keys back (one write batch). Without
a backend (session windows) the state is a table of the object's own.

Checkpoints write the state as an Arrow IPC file of native columns with one record
batch per key group (:class:`~epochstream.state.handles.ColumnarSnapshotHandle`), so a
restore at another parallelism reads exactly the key groups of its new range, as
keyed state does on the row path. Every column of a state file has a name of its own
(``_kg``, ``_key``, ``acc``, ``count``, windows' ``_window_start``/``_window_end``):
a key column named like one of them (``count``, ``acc``) must not take its place.
Files written before 2026-11-26 hold the key under the key column's own name;
:func:`state_keys` reads both.

Example::

    agg = ColumnarAggregates("sum", key="k", value="v", max_parallelism=128)
    out = agg.update(pa.record_batch([pa.array([1, 1, 2]), pa.array([5, 6, 7])], names=["k", "v"]))
    out.to_pydict() == {"k": [1, 2], "v": [11, 7]}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG, TS
from epochstream.exceptions import ConfigurationError, StateError
from epochstream.state.backends.base import ColumnSchema, ColumnTable
from epochstream.state.backends.heap.columns import HeapColumnTable
from epochstream.state.canonical import read_batches, write_ipc_file
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.columnar_checks import (
    IntSumGuard,
    check_value_range,
    checked_value_type,
    event_times,
    require_columns,
    value_type_of,
    with_value_type,
)
from epochstream.state.handles import ColumnarSnapshotHandle, KeyedStateHandle
from epochstream.state.key_index import KeyIndex, canonical_float_keys

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS
    from epochstream.state.backends.base import KeyedStateBackend

__all__ = [
    "AGGREGATES",
    "STATE_KEY",
    "ColumnarAggregates",
    "accumulator_schema",
    "aggregate_value",
    "columnar_rows",
    "columnar_state_parts",
    "read_columnar_state",
    "split_by_key_group",
    "state_file_table",
    "state_keys",
    "state_of_table",
    "window_of_table",
    "window_table_name",
    "write_columnar_state",
]

#: The aggregations of the columnar path.
AGGREGATES = ("sum", "count", "min", "max", "mean")
_NAN = "_nan"
#: The key column of a state file, whatever the key column of the stream is called.
STATE_KEY = "_key"
#: The columns of a columnar state file besides the key.
STATE_COLUMNS = (KG, "acc", "count", "_window_start", "_window_end")


def state_keys(table: pa.Table | pa.RecordBatch, where: str) -> Any:
    """The key column of a columnar state table: ``_key``, or in a file written before
    it had that name, the one column that is not state.

    Example: ``state_keys(aggregates.state_table(), "sum(v)").to_pylist() == [1, 2]``
    """
    names = table.schema.names
    if STATE_KEY in names:
        return table.column(STATE_KEY)
    others = [n for n in names if n not in STATE_COLUMNS]
    if len(others) != 1:
        raise StateError(
            f"{where}: restored columnar state has no key column (columns: "
            f"{', '.join(names)}); it was written by another operator or is damaged"
        )
    return table.column(others[0])


class ColumnarAggregates:
    """Running ``kind`` (sum, count, min, max, mean) of column ``value`` per key ``key``.

    ``update(batch)`` folds a batch in and returns one row per key it touched with the
    key's new running value (``_ts`` = the latest timestamp of its rows, when the batch
    has event time). ``result()`` is every key's value (window firing).
    """

    def __init__(
        self,
        kind: str,
        *,
        key: str,
        value: str | None,
        max_parallelism: int,
        where: str = "",
        backend: KeyedStateBackend | None = None,
        name: str | None = None,
    ) -> None:
        if kind not in AGGREGATES:
            raise ConfigurationError(
                f"unknown aggregation {kind!r} (known: {', '.join(AGGREGATES)})"
            )
        if kind != "count" and not value:
            raise ConfigurationError(f"{kind}() needs the column to aggregate")
        self.kind = kind
        #: The column table's name in the backend (the aggregation; a window's adds
        #: ``@start``, see :func:`window_table_name`).
        self.name = name or kind
        self.key = key
        self.value = value
        self.out_name = "count" if kind == "count" else str(value)
        self.max_parallelism = max_parallelism
        self.where = where or f"{kind}({value or ''})"
        self._value_type: pa.DataType | None = None
        self._sums = IntSumGuard(self.where, str(value)) if kind == "sum" else None
        # The slots and accumulator arrays the fold works on in place: the heap
        # backend's table itself, or (another backend) a scratch table holding only
        # the keys of the batch being folded, read from and written back to the
        # backend's table around the fold.
        self._store = self._heap(self._schema(np.int64))
        self._backend = backend
        # The state: the backend's column table, once a batch or a restore made it;
        # without a backend, the in-memory table (state the operator keeps itself).
        self._table: ColumnTable | None = self._store if backend is None else None

    def _heap(self, schema: ColumnSchema) -> HeapColumnTable:
        return HeapColumnTable(self.kind, schema, f"{self.where}: key column {self.key!r}")

    def _adopt(self, table: ColumnTable) -> None:
        self._table = table
        if isinstance(table, HeapColumnTable):
            table.index.name = f"{self.where}: key column {self.key!r}"  # for its errors
            self._store = table
        elif self._store.schema != table.schema:
            # The accumulator types of a restored state: the next fold's scratch has them.
            self._store = self._heap(table.schema)

    def _schema(self, acc: Any) -> ColumnSchema:
        return accumulator_schema(self.kind, acc, self._value_type)

    # The fold's view of the store (reassigned as arrays grow or change type).
    @property
    def index(self) -> KeyIndex:
        """The slots of the keys being folded (all keys on the heap backend)."""
        return self._store.index

    @property
    def _kg(self) -> np.ndarray:
        return self._store.kg

    @property
    def _acc(self) -> np.ndarray:
        return self._store.arrays["acc"]

    @_acc.setter
    def _acc(self, array: np.ndarray) -> None:
        self._store.arrays["acc"] = array

    @property
    def _count(self) -> np.ndarray:
        return self._store.arrays["count"]

    def attach(self) -> None:
        """Take up the state the backend restored (call after the backend's restore).

        Example: ``aggregates.attach(); aggregates.value_type``
        """
        if self._backend is None:
            return
        restored = self._backend.column_table(self.name)
        if restored is None:
            return
        self._value_type = self._value_type or restored.schema.value_type
        acc = dict((n, k) for n, k, _ in restored.schema.fields)["acc"]
        table = self._backend.column_table(self.name, self._schema(acc))
        assert table is not None
        self._adopt(table)

    def _attach_table(self) -> ColumnTable:
        """The state's table, made (or given the schema) at the first batch."""
        schema = self._schema(self._acc.dtype)
        table = self._table
        if table is None or table.schema != schema:
            assert self._backend is not None
            table = self._backend.column_table(self.name, schema)
            assert table is not None
            self._adopt(table)
        return table

    @property
    def value_type(self) -> pa.DataType | None:
        """The value column's type, once a batch (or a restore) set it.

        Example: ``aggregates.value_type == pa.int64()``
        """
        return self._value_type

    # ---------------------------------------------------------------- updates
    def _check_columns(self, batch: pa.RecordBatch) -> None:
        require_columns(batch.schema, (self.key, self.value), self.where)
        if self.value:
            check_value_range(batch.column(self.value), self.where, self.value)
        if self.value:
            first = self._value_type
            kind = batch.schema.field(self.value).type
            self._value_type = checked_value_type(first, kind, self.where, self.value)
            if first is None:
                floating = pa.types.is_floating(kind) or self.kind == "mean"
                self._store.set_schema(self._schema(np.float64 if floating else np.int64))

    def _grow(self, size: int) -> None:
        self._store.grow(size)

    def _aggregations(self, has_ts: bool) -> list[tuple[Any, str]]:
        if self.kind == "count":
            aggs: list[tuple[Any, str]] = [([], "count_all")]
        elif self.kind == "mean":
            aggs = [(self.value, "sum"), (self.value, "count")]
        else:
            aggs = [(self.value, self.kind), (self.value, "count")]
        if has_ts:
            aggs.append((TS, "max"))
        return aggs

    def fold(self, batch: pa.RecordBatch) -> tuple[pa.Array, np.ndarray, pa.Array | None]:
        """Fold ``batch`` in: (keys touched, their slots, their latest ``_ts`` or None).

        The slots index :attr:`index` and the accumulators until the next fold."""
        self._check_columns(batch)
        table = self._table if self._backend is None else self._attach_table()
        if table is self._store:
            return self._fold_checked(batch)
        assert table is not None
        # Another backend: fold into a scratch table of the batch's keys, preloaded
        # with their accumulators (one batch read), then write them back (one batch write).
        keys = pc.unique(canonical_float_keys(batch.column(self.key)))
        key_groups = key_groups_of_column(keys, self.max_parallelism)
        self._store = self._heap(table.schema)
        self._store.write(keys, key_groups, table.read(keys, key_groups))
        touched, slots, ts = self._fold_checked(batch)
        n = len(keys)
        if self._store.index.size == n:
            # Every key read was folded (the batch's keys are all touched) and holds
            # slot i of keys[i]: write back under the same keys array, whose stored
            # keys the table encoded for the read already.
            values = {name: array[:n] for name, array in self._store.arrays.items()}
            table.write(keys, key_groups, values)
        else:
            values = {name: array[slots] for name, array in self._store.arrays.items()}
            table.write(touched, self._kg[slots], values)
        return touched, slots, ts

    def _fold_checked(self, batch: pa.RecordBatch) -> tuple[pa.Array, np.ndarray, pa.Array | None]:
        has_ts = TS in batch.schema.names
        if has_ts:
            event_times(batch, self.where)
        guard = self._sums if self._acc.dtype == np.int64 else None
        if guard is None or not guard.risky(batch.column(self.value), self._held):
            return self._fold(batch, has_ts)
        size, before = self.index.size, self._acc.copy()
        keys, slots, ts = self._fold(batch, has_ts)
        keys_in = canonical_float_keys(batch.column(self.key))
        table = pa.table(
            {"k": keys_in, "v": batch.column(self.value).cast(pa.float64(), safe=False)}
        )
        grouped = table.group_by("k", use_threads=False).aggregate([("v", "sum")])
        group_slots, _ = self.index.slots(grouped.column("k").combine_chunks())
        estimates = np.zeros(self.index.size)
        estimates[:size] = before[:size]
        estimates[group_slots] += _numpy(grouped.column("v_sum"), 0.0, np.float64)
        guard.check(self._acc[slots], estimates[slots], lambda i: keys[i].as_py())
        return keys, slots, ts

    def _held(self) -> float:
        held = self._acc[: self.index.size]
        return float(np.abs(held.astype(np.float64)).max()) if len(held) else 0.0

    def _fold(
        self, batch: pa.RecordBatch, has_ts: bool
    ) -> tuple[pa.Array, np.ndarray, pa.Array | None]:
        rows = self.index.row_slots(batch.column(self.key))
        if rows is not None:
            return self._fold_rows(batch, *rows, has_ts)
        columns = [self.key] + ([self.value] if self.value and self.value != self.key else [])
        table = pa.Table.from_batches([batch.select(columns + ([TS] if has_ts else []))])
        aggregations = self._aggregations(has_ts)
        nans = self.kind in ("min", "max") and self._acc.dtype == np.float64
        if nans:  # Arrow's min/max skip NaN; NumPy's (the dense path, sessions) return it
            table = table.append_column(_NAN, pc.is_nan(table.column(self.value)))
            aggregations.append((_NAN, "any"))
        if pa.types.is_floating(table.schema.field(self.key).type):
            index = table.schema.get_field_index(self.key)
            keys = canonical_float_keys(table.column(index).combine_chunks())
            table = table.set_column(index, self.key, keys)
        grouped = table.group_by(self.key, use_threads=False).aggregate(aggregations)
        keys = grouped.column(self.key).combine_chunks()
        slots, new = self.index.slots(keys)
        self._grow(self.index.size)
        if new.any():
            self._init_slots(slots[new], keys.filter(pa.array(new)))
        self._apply(grouped, slots)
        if nans:
            self._acc[slots[_numpy(grouped.column(f"{_NAN}_any"), False, bool)]] = np.nan
        ts = grouped.column(f"{TS}_max").combine_chunks() if has_ts else None
        return keys, slots, ts

    def _fold_rows(
        self, batch: pa.RecordBatch, slots: np.ndarray, fresh: np.ndarray, has_ts: bool
    ) -> tuple[pa.Array, np.ndarray, pa.Array | None]:
        """Fold with a slot per row (dense integer keys): bincount and ufunc.at over the
        slots, no hash group-by."""
        n = self.index.size
        self._grow(n)
        if len(fresh):
            self._init_slots(fresh, self.index.keys_at(fresh))
        rows_per_slot = np.bincount(slots, minlength=n)
        touched = np.flatnonzero(rows_per_slot)
        kind, acc = self.kind, self._acc
        if kind == "count":
            acc[touched] += rows_per_slot[touched]
        else:
            column, value_slots = batch.column(self.value), slots
            if column.null_count:
                valid = pc.is_valid(column)
                value_slots = slots[valid.to_numpy(zero_copy_only=False)]
                column = column.filter(valid)
                self._count[:n] += np.bincount(value_slots, minlength=n)
            else:
                self._count[touched] += rows_per_slot[touched]
            values = column.to_numpy()
            if kind in ("sum", "mean"):
                self._add_sums(value_slots, values, n, touched)
            else:
                ufunc = np.minimum if kind == "min" else np.maximum
                with np.errstate(invalid="ignore"):  # a NaN value gives NaN, no warning
                    ufunc.at(acc, value_slots, values.astype(acc.dtype, copy=False))
        ts = None
        if has_ts:
            latest = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
            np.maximum.at(latest, slots, event_times(batch, self.where))
            ts = pa.array(latest[touched])
        return self.index.keys_at(touched), touched, ts

    def _add_sums(self, slots: np.ndarray, values: np.ndarray, n: int, touched: np.ndarray) -> None:
        acc = self._acc
        if acc.dtype == np.float64:
            acc[touched] += np.bincount(slots, weights=values, minlength=n)[touched]
            return
        # bincount sums in float64: exact while every partial sum stays below 2**53.
        if len(values) and int(np.abs(values).max()) * len(values) < 2**53:
            partial = np.bincount(slots, weights=values, minlength=n)[touched]
            acc[touched] += np.rint(partial).astype(np.int64)
        else:
            np.add.at(acc, slots, values.astype(np.int64, copy=False))

    def _init_slots(self, slots: np.ndarray, keys: pa.Array) -> None:
        self._kg[slots] = key_groups_of_column(keys, self.max_parallelism)
        self._count[slots] = 0
        if self.kind == "min":
            self._acc[slots] = _identity(self._acc.dtype, high=True)
        elif self.kind == "max":
            self._acc[slots] = _identity(self._acc.dtype, high=False)
        else:
            self._acc[slots] = 0

    def _apply(self, grouped: pa.Table, slots: np.ndarray) -> None:
        kind, acc = self.kind, self._acc
        if kind == "count":
            acc[slots] += _numpy(grouped.column("count_all"), 0, np.int64)
            return
        value = self.value
        partial = grouped.column(f"{value}_{'sum' if kind == 'mean' else kind}")
        self._count[slots] += _numpy(grouped.column(f"{value}_count"), 0, np.int64)
        if kind in ("sum", "mean"):
            acc[slots] += _numpy(partial, 0, acc.dtype)
        elif kind == "min":
            acc[slots] = np.minimum(
                acc[slots], _numpy(partial, _identity(acc.dtype, True), acc.dtype)
            )
        else:
            acc[slots] = np.maximum(
                acc[slots], _numpy(partial, _identity(acc.dtype, False), acc.dtype)
            )

    def update(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Fold ``batch`` in and return each touched key's running value."""
        keys, slots, ts = self.fold(batch)
        columns = [keys, self.values_at(slots)]
        names = [self.key, self.out_name]
        if ts is not None:
            columns.append(ts)
            names.append(TS)
        return pa.record_batch(columns, names=names)

    def values_at(self, slots: np.ndarray) -> pa.Array:
        """The running values at ``slots`` (null where a key has seen only nulls)."""
        if self.kind == "count":
            return pa.array(self._acc[slots])
        count = self._count[slots]
        if self.kind == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                values = self._acc[slots] / count
        else:
            values = self._acc[slots]
        array = pa.array(values, mask=count == 0)
        if self.kind in ("min", "max") and self._value_type is not None:
            return array.cast(self._value_type)
        return array

    def result(self) -> tuple[pa.Array, pa.Array]:
        """Every key and its value (for a window that fires)."""
        if self._table is not None and self._table is not self._store:
            self._store = self._loaded(self._table.table())
        slots = np.arange(self.index.size, dtype=np.int64)
        return self.index.keys_at(slots), self.values_at(slots)

    # ---------------------------------------------------------------- snapshots
    def state_table(self) -> pa.Table:
        """The state as columns ``_kg, _key, acc, count`` (a copy: later updates do not
        change it, so the asynchronous part of a snapshot can write it)."""
        table = self._table if self._table is not None else self._store
        return with_value_type(table.table(), self._value_type)

    def _loaded(self, table: pa.Table) -> HeapColumnTable:
        store = self._heap(self._schema(table.column("acc").type))
        store.load(table, state_keys(table, self.where).combine_chunks())
        return store

    def restore_rows(self, table: pa.Table) -> None:
        """Add the rows of a :meth:`state_table` (keys not seen yet) to the state
        (state the operator keeps itself: windows, sessions)."""
        if table.num_rows == 0:
            return
        self._store.load(table, state_keys(table, self.where).combine_chunks())
        if self._value_type is None:
            self._value_type = value_type_of(table)
            self._store.set_schema(self._schema(self._acc.dtype))


#: Between a window aggregation's state name and its window's start.
WINDOW_SEP = "@"


def window_table_name(kind: str, start: int) -> str:
    """The column table of one window. Example: ``window_table_name("sum", 0) == "sum@0"``"""
    return f"{kind}{WINDOW_SEP}{start}"


def state_of_table(name: str) -> str:
    """The state (aggregation) of a column table. Example: ``state_of_table("sum@0") == "sum"``"""
    return name.partition(WINDOW_SEP)[0]


def window_of_table(name: str) -> int | None:
    """The window start of a window's column table, else None."""
    _, sep, start = name.partition(WINDOW_SEP)
    return int(start) if sep else None


def state_file_table(tables: list[tuple[str, pa.Table]]) -> pa.Table:
    """The columnar state file's rows of column tables ``(name, table())``: a window's
    rows get its ``_window_start``; keys of several integer widths take the widest."""
    parts = []
    for name, table in tables:
        start = window_of_table(name)
        if start is not None:
            column = pa.array(np.full(table.num_rows, start, dtype=np.int64))
            table = table.append_column(_WINDOW_START, column)
        parts.append(table)
    return pa.concat_tables(parts, promote_options="permissive")


def columnar_state_parts(state: str, rows: pa.Table, where: str) -> Iterable[tuple[str, pa.Table]]:
    """``(column table name, its rows)`` of a columnar state file's ``rows``: one
    part for a rolling aggregation, one per window start for windows."""
    if state not in AGGREGATES or "_window_end" in rows.schema.names:
        raise StateError(
            f"{where}: this state was written by another kind of columnar operator "
            f"(state {state!r}); a columnar aggregation restores only its own state: "
            "give the new operator another uid"
        )
    if _WINDOW_START not in rows.schema.names:
        yield state, rows
        return
    starts = rows.column(_WINDOW_START).to_numpy()
    for start in np.unique(starts).tolist():
        part = rows.filter(pa.array(starts == start)).drop_columns([_WINDOW_START])
        yield window_table_name(state, int(start)), part


_WINDOW_START = "_window_start"


def accumulator_schema(kind: str, acc: Any, value_type: pa.DataType | None) -> ColumnSchema:
    """The accumulators of aggregation ``kind``: ``acc`` (of NumPy or Arrow type
    ``acc``; min/max start at the type's extreme, the others at 0) and ``count`` (the
    non-null values seen).

    Example: ``accumulator_schema("min", np.int64, pa.int32()).fields[0][2] == 2**63 - 1``
    """
    dtype = np.dtype(acc.to_pandas_dtype() if isinstance(acc, pa.DataType) else acc)
    identity = _identity(dtype, high=True) if kind == "min" else 0
    if kind == "max":
        identity = _identity(dtype, high=False)
    if isinstance(identity, np.generic):
        identity = identity.item()
    return ColumnSchema((("acc", dtype.name, identity), ("count", "int64", 0)), value_type)


def _identity(dtype: np.dtype, high: bool) -> Any:
    if np.issubdtype(dtype, np.floating):
        return np.inf if high else -np.inf
    info = np.iinfo(dtype)
    return info.max if high else info.min


def _numpy(column: pa.ChunkedArray | pa.Array, fill: Any, dtype: Any) -> np.ndarray:
    filled = pc.fill_null(column, fill) if column.null_count else column
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks()
    return filled.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def split_by_key_group(table: pa.Table) -> Iterable[tuple[int, pa.RecordBatch]]:
    """The rows of ``table`` per key group (column ``_kg``), in ascending key group."""
    if table.num_rows == 0:
        return
    groups = table.column(KG).to_numpy()
    order = np.argsort(groups, kind="stable")
    ordered = table.take(pa.array(order)).combine_chunks()
    batch = ordered.to_batches()[0] if ordered.num_rows else None
    assert batch is not None
    sorted_groups = groups[order]
    bounds = np.flatnonzero(np.diff(sorted_groups)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(sorted_groups)]])
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(sorted_groups[start]), batch.slice(start, end - start)


def write_columnar_state(
    fs: StorageFS, path: str, table: pa.Table, *, key_groups: range, state: str
) -> ColumnarSnapshotHandle | None:
    """Write ``table`` (with a ``_kg`` column) as one record batch per key group;
    ``state`` names it for ``es.savepoint.read`` (the aggregation: ``"sum"``...)."""
    if table.num_rows == 0:
        return None
    batches, size, crc = write_ipc_file(fs, path, table.schema, split_by_key_group(table))
    return ColumnarSnapshotHandle(
        key_groups=key_groups,
        path=path,
        file_size=size,
        batches=batches,
        states={state: "columnar"},
        crc=crc,
    )


def read_columnar_state(
    fs_of: Any, handles: list[KeyedStateHandle], key_groups: range, where: str
) -> pa.Table | None:
    """The rows of ``key_groups`` in ``handles`` (``fs_of(path)`` opens a file system)."""
    parts: list[pa.RecordBatch] = []
    for handle in handles:
        if not isinstance(handle, ColumnarSnapshotHandle):
            raise StateError(
                f"{where}: this operator's state was written by another kind of operator "
                f"({type(handle).__name__}); a columnar aggregation restores only its own "
                "state: give the new operator another uid"
            )
        parts.extend(b for _, b in read_batches(fs_of(handle.path), handle, key_groups))
    if not parts:
        return None
    return pa.Table.from_batches(parts)


def columnar_rows(fs: StorageFS, handle: ColumnarSnapshotHandle) -> Iterable[tuple[Any, ...]]:
    """``(key, value, key group, window start or None)`` of every entry (offline reads)."""
    kind = next(iter(handle.states), "")
    if kind not in AGGREGATES:
        raise StateError(
            f"state {kind!r} of {handle.path} is a row table (a columnar join's, session "
            "window's or SQL window aggregation's rows), not one value per key; read it "
            "with es.savepoint.read"
        )
    for kg, batch in read_batches(fs, handle, handle.key_groups):
        cols = batch.to_pydict()
        keys = state_keys(batch, handle.path).to_pylist()
        windows = cols.get("_window_start", [None] * batch.num_rows)
        for key, acc, count, window in zip(keys, cols["acc"], cols["count"], windows, strict=True):
            yield key, aggregate_value(kind, acc, count), kg, window


def aggregate_value(kind: str, acc: Any, count: int) -> Any:
    """The value of aggregation ``kind`` from its accumulators (None: only nulls seen).

    Example: ``aggregate_value("mean", 9.0, 3) == 3.0``
    """
    if kind == "mean":
        return acc / count if count else None
    if kind in ("min", "max", "sum") and not count:
        return None
    return acc
