"""The heap backend's row tables: Arrow record batches in memory, and their files.

A :class:`HeapRowTable` keeps its rows as the immutable batches they were appended in,
each with a ``_kg`` column (compacted into one now and then). Reading, deleting and
popping rows are one vectorized filter over them (``is_in`` on the key column), so a
batch costs a few Arrow kernels and no per-row Python.

Snapshots (:func:`write_row_tables`, on the snapshot thread) write every row table of
the backend as one Arrow IPC file with one record batch per key group, of columns
``_kg``, ``_table`` (the row table's name) and ``_rows`` (that table's rows of that key
group as an Arrow IPC stream, schema and key column included): a restore at another
parallelism reads only its key groups (:func:`read_row_tables`), on either backend.

Example::

    table = HeapRowTable("left", RowSchema(batch.schema, key="id"))
    table.append(batch, key_groups_of_column(batch["id"], 128))
    table.read(pa.array([7]), np.array([key_group_for_key(7, 128)])).num_rows
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG
from epochstream.exceptions import StateError
from epochstream.state.backends.base import ROWS, RowSchema, RowTable
from epochstream.state.canonical import read_batches, write_ipc_file
from epochstream.state.handles import ColumnarSnapshotHandle, KeyedStateHandle

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS

__all__ = ["HeapRowTable", "read_row_tables", "write_row_tables"]

# Compact the batches into one when there are this many (fewer chunks to filter).
_MAX_CHUNKS = 32
_TABLE, _ROWS = "_table", "_rows"
#: Where a row file's ``_rows`` stream notes its key column (schema metadata).
_KEY_META = b"epochstream.row_key"


class HeapRowTable(RowTable):
    """One row table in memory (see the module docstring).

    Example: ``len(HeapRowTable("left", schema))`` counts its rows.
    """

    def __init__(self, name: str, schema: RowSchema) -> None:
        self.name = name
        self._schema = schema
        self._stored = pa.schema([pa.field(KG, pa.int32()), *schema.schema])
        self._batches: list[pa.RecordBatch] = []

    @property
    def schema(self) -> RowSchema:
        return self._schema

    def __len__(self) -> int:
        return sum(b.num_rows for b in self._batches)

    def append(self, rows: pa.RecordBatch, key_groups: np.ndarray) -> None:
        if not rows.num_rows:
            return
        rows = self._schema.conform(rows)
        kgs = pa.array(np.asarray(key_groups, dtype=np.int32))
        self._batches.append(pa.record_batch([kgs, *rows.columns], schema=self._stored))
        if len(self._batches) >= _MAX_CHUNKS:
            self._batches = [pa.concat_batches(self._batches)]

    def _all(self) -> pa.Table:
        return pa.Table.from_batches(self._batches, schema=self._stored)

    def _of_keys(self, table: pa.Table, keys: pa.Array) -> pa.ChunkedArray | pa.Array:
        return pc.is_in(table.column(self._schema.key), value_set=keys, skip_nulls=False)

    def _keep(self, table: pa.Table, mask: Any) -> None:
        self._batches = [b for b in table.filter(mask).to_batches() if b.num_rows]

    def read(self, keys: pa.Array, key_groups: np.ndarray) -> pa.Table:
        if not self._batches or not len(keys):
            return self._schema.schema.empty_table()
        table = self._all()
        return table.filter(self._of_keys(table, keys)).drop_columns([KG])

    def pop(self, keys: pa.Array, key_groups: np.ndarray) -> pa.Table:
        if not self._batches or not len(keys):
            return self._schema.schema.empty_table()
        table = self._all()
        mine = self._of_keys(table, keys)
        popped = table.filter(mine).drop_columns([KG])
        if popped.num_rows:
            self._keep(table, pc.invert(mine))
        return popped

    def pop_until(self, bound: int) -> pa.Table:
        if not self._batches:
            return self._schema.schema.empty_table()
        table = self._all()
        due = pc.less_equal(table.column(self._schema.key), pa.scalar(bound, pa.uint64()))
        popped = table.filter(due).drop_columns([KG])
        if popped.num_rows:
            self._keep(table, pc.invert(due))
        return popped

    def table(self) -> pa.Table:
        return self._all()

    def batches(self) -> list[pa.RecordBatch]:
        """The stored batches (``_kg`` first): immutable, so a snapshot keeps them as
        they are at the barrier without a copy."""
        return list(self._batches)


def _stream(schema: RowSchema, rows: pa.Table) -> bytes:
    """``rows`` as an Arrow IPC stream with the schema's metadata, noting the key column."""
    metadata = {**(schema.schema.metadata or {}), _KEY_META: schema.key.encode("utf-8")}
    kept = rows.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, kept.schema) as writer:
        writer.write_table(kept)
    return sink.getvalue().to_pybytes()


def _key_groups(
    tables: dict[str, tuple[RowSchema, list[pa.RecordBatch]]],
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The file's record batches: per key group (ascending) one row per table with rows."""
    split: dict[int, list[tuple[str, bytes]]] = {}
    for name, (schema, batches) in sorted(tables.items()):
        if not batches:
            continue
        rows = pa.Table.from_batches(batches).combine_chunks()
        groups = rows.column(KG).to_numpy()
        order = np.argsort(groups, kind="stable")
        rows, groups = rows.take(pa.array(order)), groups[order]
        bounds = np.flatnonzero(np.diff(groups)) + 1
        for start, end in zip(
            np.concatenate([[0], bounds]).tolist(),
            np.concatenate([bounds, [len(groups)]]).tolist(),
            strict=True,
        ):
            part = rows.slice(start, end - start).drop_columns([KG])
            split.setdefault(int(groups[start]), []).append((name, _stream(schema, part)))
    for kg in sorted(split):
        names, streams = zip(*split[kg], strict=True)
        yield (
            kg,
            pa.record_batch(
                [
                    pa.array(np.full(len(names), kg, dtype=np.int32)),
                    pa.array(names, pa.string()),
                    pa.array(streams, pa.binary()),
                ],
                names=[KG, _TABLE, _ROWS],
            ),
        )


_FILE_SCHEMA = pa.schema([(KG, pa.int32()), (_TABLE, pa.string()), (_ROWS, pa.binary())])


def write_row_tables(
    fs: StorageFS,
    path: str,
    tables: dict[str, tuple[RowSchema, list[pa.RecordBatch]]],
    key_groups: range,
) -> ColumnarSnapshotHandle | None:
    """Write row tables (``name: (schema, batches with _kg)``) as one file (see the
    module docstring); ``None`` when no table has rows.

    Example: ``write_row_tables(fs, path, {"left": (t.schema, t.batches())}, range(0, 64))``
    """
    if not any(batches for _, batches in tables.values()):
        return None
    batches, size, crc = write_ipc_file(fs, path, _FILE_SCHEMA, _key_groups(tables))
    return ColumnarSnapshotHandle(
        key_groups=key_groups,
        path=path,
        file_size=size,
        batches=batches,
        states=dict.fromkeys(sorted(tables), ROWS),
        crc=crc,
    )


def is_row_file(handle: KeyedStateHandle) -> bool:
    """Whether ``handle`` is a file of row tables (:func:`write_row_tables`).

    Example: ``is_row_file(job.run())`` for a heap backend holding row tables
    """
    return isinstance(handle, ColumnarSnapshotHandle) and ROWS in handle.states.values()


def read_row_tables(
    fs_of: Callable[[str], StorageFS], handle: ColumnarSnapshotHandle, key_groups: range
) -> Iterable[tuple[str, RowSchema, pa.Table]]:
    """``(table name, schema, rows with _kg)`` of ``key_groups`` in a row file, a part
    per key group and table (``fs_of(path)`` opens a file system).

    Example::

        for name, schema, rows in read_row_tables(storage_fs, handle, range(0, 32)):
            backend.row_table(name, schema)
    """
    for kg, batch in read_batches(fs_of(handle.path), handle, key_groups):
        names = batch.column(_TABLE).to_pylist()
        streams = batch.column(_ROWS)
        for i, name in enumerate(names):
            rows = pa.ipc.open_stream(streams[i].as_buffer()).read_all()
            metadata = dict(rows.schema.metadata or {})
            key = metadata.pop(_KEY_META, None)
            if key is None:
                raise StateError(f"{handle.path}: row table {name!r} has no key column")
            rows = rows.replace_schema_metadata(metadata or None)
            kgs = pa.array(np.full(rows.num_rows, kg, dtype=np.int32))
            yield name, RowSchema(rows.schema, key.decode("utf-8")), rows.add_column(0, KG, kgs)
