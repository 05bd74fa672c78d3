"""Reading keyed state offline from a savepoint or checkpoint (``es.savepoint.read``).

Every snapshot format (canonical savepoints, heap and RocksDB checkpoints, columnar
aggregation state) reads into the same table, one row per entry (list state: per
element; map state: per user key; columnar state: per key and window, under the
aggregation's name, ``"sum"``, ``"count"``...; ``namespace`` is the window start;
row tables: per row, the row as a dict, under the table's name and the row's key,
e.g. a session window's ``"sessions"`` by key, a SQL window aggregation's
``"slice@<start>"`` by key group, as those tables file their rows):

    key        the key, in its canonical form (see :mod:`epochstream.state.keyformat`)
    value      the value (deserialized with the state's serializer)
    key_group  int32
    namespace  the namespace (window, timer domain), or null
    user_key   map state: the user key; else null
    ttl_ts     with TTL: wall-clock seconds of the last update; else null

``key``, ``namespace``, ``user_key`` and ``value`` columns hold Arrow values inferred
from the Python objects; when they do not fit one Arrow type (mixed types, custom
classes) the column holds their ``repr`` strings instead, and the schema metadata
``epochstream.repr_columns`` names those columns.

Example::

    table = es.savepoint.read("/sp/savepoint-3f2a9c-1b2c3d4e5f60", "counts", "_reduce")
    table.to_pandas().sort_values("key")
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from epochstream.checkpoint.storage import load_metadata
from epochstream.core.filesystems import storage_fs
from epochstream.core.state_ttl import TtlValue
from epochstream.exceptions import StateError
from epochstream.state.backends.base import ROWS, base_kind, is_namespaced
from epochstream.state.backends.heap.columns import COLUMNAR
from epochstream.state.backends.heap.files import merge_chain, split_key_groups
from epochstream.state.backends.heap.rows import read_row_tables
from epochstream.state.backends.rocksdb.files import read_database_rows
from epochstream.state.canonical import read_batches, read_state_meta
from epochstream.state.columnar_aggregates import (
    aggregate_value,
    columnar_rows,
    state_of_table,
    window_of_table,
)
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    ColumnarSnapshotHandle,
    HeapSnapshotHandle,
    KeyedStateHandle,
    RocksDBSnapshotHandle,
)
from epochstream.state.keyformat import decode_key
from epochstream.state.keygroups import KeyGroupAssigner

__all__ = ["read", "state_rows"]

#: (key, value, key group, namespace, user key, ttl timestamp)
Row = tuple[Any, Any, int, Any, Any, float | None]


def read(
    path: str,
    uid: str,
    state_name: str,
    *,
    storage_options: Any = None,
    trust_shared_storage: bool = False,
) -> Any:
    """Keyed state ``state_name`` of operator ``uid`` in a savepoint or checkpoint, as a
    ``pyarrow.Table`` (columns in the module docstring).

    A local ``path`` other local users could change is refused
    (:class:`~epochstream.exceptions.UntrustedStorageError`: it holds pickles) unless
    ``trust_shared_storage=True``.

    Example: ``es.savepoint.read("/sp/savepoint-3f2a9c-...", "counter", "count")``
    """
    import pyarrow as pa

    _directory, md = load_metadata(path, storage_options, trust_shared=trust_shared_storage)
    subtasks = md.operators.get(uid)
    if subtasks is None:
        raise StateError(
            f"{path}: no operator with uid {uid!r}; operators with state: {sorted(md.operators)}"
        )
    rows: list[Row] = []
    known: set[str] = set()
    for state in subtasks.values():
        if state.keyed is not None:
            known.update(_state_names(state.keyed))
            rows.extend(state_rows(state.keyed, state_name, md.max_parallelism, storage_options))
    if state_name not in known:
        raise StateError(
            f"{path}: operator {uid!r} has no keyed state {state_name!r}; it has {sorted(known)}"
        )
    columns: dict[str, list[Any]] = {
        name: [row[i] for row in rows]
        for i, name in enumerate(("key", "value", "key_group", "namespace", "user_key", "ttl_ts"))
    }
    arrays, as_repr = [], []
    for name, values in columns.items():
        if name == "key_group":
            arrays.append(pa.array(values, pa.int32()))
            continue
        if name == "ttl_ts":
            arrays.append(pa.array(values, pa.float64()))
            continue
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            arrays.append(pa.array([None if v is None else repr(v) for v in values], pa.string()))
            as_repr.append(name)
    metadata = {b"epochstream.repr_columns": ",".join(as_repr).encode()}
    return pa.table(arrays, names=list(columns)).replace_schema_metadata(metadata)


def _state_names(handle: KeyedStateHandle) -> set[str]:
    states = getattr(handle, "states", {})
    # A columnar window's table (``sum@0``) reads under its aggregation's name.
    return {state_of_table(n) if k == COLUMNAR else n for n, k in states.items()}


def _backend_columnar_rows(
    handle: KeyedStateHandle, state_name: str, max_parallelism: int, options: Any
) -> Iterator[Row] | None:
    """Columnar state a backend holds (RocksDB checkpoints, canonical savepoints): the
    aggregate per key (and window), as the heap backend's columnar files read; None
    when ``state_name`` is not columnar state of ``handle``."""
    states = getattr(handle, "states", {})
    tables = [n for n, k in states.items() if k == COLUMNAR and state_of_table(n) == state_name]
    if not tables:
        return None

    def rows() -> Iterator[Row]:
        for table in tables:
            window = window_of_table(table)
            for key, value, kg, _ns, _uk, _ttl in state_rows(
                handle, table, max_parallelism, options, raw=True
            ):
                acc, count = value
                yield key, aggregate_value(state_name, acc, count), kg, window, None, None

    return rows()


def state_rows(
    handle: KeyedStateHandle,
    state_name: str,
    max_parallelism: int,
    options: Any = None,
    *,
    raw: bool = False,
) -> Iterator[Row]:
    """The entries of one state in one keyed handle (``raw``: columnar state's stored
    accumulators, not the aggregate)."""
    columnar = None
    if not raw and not isinstance(handle, ColumnarSnapshotHandle):
        columnar = _backend_columnar_rows(handle, state_name, max_parallelism, options)
    if columnar is not None:
        yield from columnar
    elif isinstance(handle, ColumnarSnapshotHandle):
        if handle.states.get(state_name) == ROWS:
            yield from _row_file_rows(handle, state_name, options)
        elif state_name in handle.states:
            fs = storage_fs(handle.path, options)
            for key, value, kg, window in columnar_rows(fs, handle):
                yield key, value, kg, window, None, None
    elif isinstance(handle, CanonicalSnapshotHandle):
        yield from _each_row(_canonical_rows(handle, state_name, options))
    elif isinstance(handle, HeapSnapshotHandle):
        yield from _heap_rows(handle, state_name, max_parallelism, options)
    elif isinstance(handle, RocksDBSnapshotHandle):
        yield from _each_row(_rocksdb_rows(handle, state_name, options))
    else:
        raise StateError(f"cannot read a {type(handle).__name__}")


def _row_file_rows(handle: ColumnarSnapshotHandle, name: str, options: Any) -> Iterator[Row]:
    """A heap row file's rows of row table ``name``: ``(key, row as a dict, key group)``."""
    fs_of = lambda path: storage_fs(path, options)  # noqa: E731
    for table, schema, rows in read_row_tables(fs_of, handle, handle.key_groups):
        if table == name:
            for row in rows.to_pylist():
                yield row[schema.key], row, row.pop("_kg"), None, None, None


def _each_row(entries: Iterator[Row]) -> Iterator[Row]:
    """``entries`` with a row table's entries (record batches of a key's rows) as one
    entry per row (a dict), as a heap row file reads."""
    import pyarrow as pa

    for key, value, kg, ns, user_key, ttl_ts in entries:
        if isinstance(value, pa.RecordBatch):
            for row in value.to_pylist():
                yield key, row, kg, ns, user_key, ttl_ts
        else:
            yield key, value, kg, ns, user_key, ttl_ts


def _canonical_rows(handle: CanonicalSnapshotHandle, name: str, options: Any) -> Iterator[Row]:
    fs = storage_fs(handle.path, options)
    meta = read_state_meta(fs, handle.path).get(name)
    if meta is None:
        return
    for kg, batch in read_batches(fs, handle, handle.key_groups):
        cols = batch.to_pydict()
        for state, key, ns, user_key, value, ttl_ts in zip(
            cols["state"],
            cols["key"],
            cols["namespace"],
            cols["user_key"],
            cols["value"],
            cols["ttl_ts"],
            strict=True,
        ):
            if state == name:
                yield (
                    decode_key(key),
                    meta.serializer.loads(value),
                    kg,
                    None if ns is None else decode_key(ns),
                    None if user_key is None else decode_key(user_key),
                    ttl_ts,
                )


def _heap_rows(
    handle: HeapSnapshotHandle, name: str, max_parallelism: int, options: Any
) -> Iterator[Row]:
    if not handle.chain:
        return
    fs = storage_fs(handle.chain[0].path, options)
    state_kind = handle.states.get(name, "value")
    kind, namespaced = base_kind(state_kind), is_namespaced(state_kind)
    assigner = KeyGroupAssigner.shared(max_parallelism)
    ns_names = [n for n, k in handle.states.items() if is_namespaced(k)]
    merged = merge_chain(fs, handle.chain, handle.key_groups, assigner, ns_names)
    state = {name: merged[name]} if name in merged else {}
    for kg, segment in sorted(split_key_groups(state, assigner, ns_names).items()):
        for entry_key, stored in segment.get(name, {}).items():
            key, ns = entry_key if namespaced else (entry_key, None)
            if kind == "list":
                for element in stored:
                    value, ts = _unwrap(element)
                    yield (key, value, kg, ns, None, ts)
            elif kind == "map":
                for user_key, entry in stored.items():
                    value, ts = _unwrap(entry)
                    yield (key, value, kg, ns, user_key, ts)
            else:
                value, ts = _unwrap(stored)
                yield (key, value, kg, ns, None, ts)


def _unwrap(stored: Any) -> tuple[Any, float | None]:
    if type(stored) is TtlValue:
        return stored.value, stored.timestamp
    return stored, None


def _rocksdb_rows(handle: RocksDBSnapshotHandle, name: str, options: Any) -> Iterator[Row]:
    if name not in handle.states:
        return
    scratch = tempfile.mkdtemp(prefix="epochstream-read-")
    try:
        for file_name, file in handle.db_files.items():
            storage_fs(file.path, options).download(file.path, os.path.join(scratch, file_name))
        yield from read_database_rows(scratch, name)
    finally:
        shutil.rmtree(scratch)
