"""The RocksDB backend's row tables: one column family per table, rows per key.

Keys are the backend's one stored key layout (:func:`encode_prefix` of the key group
and :func:`~epochstream.state.keyformat.encode_key` of the row's key), laid out as
list state is: each append puts one entry per distinct key, ``prefix | sequence number
(8 bytes, big-endian)``, whose value is the backend's value header followed by that
key's rows as one Arrow IPC record batch message (:meth:`RowSchema.dumps`), and
a counter entry at ``prefix`` holding the next sequence number. A key's live entries
are exactly its sequence numbers below the counter (``pop`` removes them all and
the counter), so reading a batch's keys is two multi-gets (the counters, then the
entries), no iterator per key. The schema is the table's serializer, recorded in the
meta column family.

A table whose keys are non-negative integers is ordered by key within each key group
(the key's length leads its bytes, and a larger integer is never shorter), so
:meth:`RocksRowTable.pop_until` reads each key group's due rows as one range.

Example::

    table = RocksRowTable(column, db, write_options, range(0, 64))
    table.append(batch, key_groups_of_column(batch["id"], 128))
    table.read(pa.array([7]), np.array([key_group_for_key(7, 128)]))
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa

from epochstream.core.arrow import KG
from epochstream.exceptions import StateError
from epochstream.state.backends.base import RowSchema, RowTable
from epochstream.state.backends.rocksdb.states import (
    RocksColumn,
    decode_prefix,
    encode_prefix,
    encode_value,
    split_value,
)
from epochstream.state.keyformat import encode_key

__all__ = ["RocksRowTable"]

_SEQ = struct.Struct(">Q")


class RocksRowTable(RowTable):
    """One row table in a RocksDB column family (see the module docstring).

    Example: ``len(RocksRowTable(column, db, options, range(0, 64)))`` counts its rows.
    """

    def __init__(self, column: RocksColumn, db: Any, write_options: Any, key_groups: range) -> None:
        if not isinstance(column.serializer, RowSchema):
            raise StateError(f"state {column.name!r} is not a row table")
        self.name = column.name
        self._column = column
        self._db = db
        self._write_options = write_options
        self._key_groups = key_groups

    @property
    def schema(self) -> RowSchema:
        schema = self._column.serializer
        assert isinstance(schema, RowSchema)
        return schema

    def _prefixes(self, keys: pa.Array, key_groups: np.ndarray) -> list[bytes]:
        return [
            encode_prefix(kg, encode_key(key))
            for key, kg in zip(keys.to_pylist(), np.asarray(key_groups).tolist(), strict=True)
        ]

    def _counters(self, prefixes: list[bytes]) -> list[int]:
        stored = self._column.cf.get(prefixes)
        return [0 if v is None else _SEQ.unpack(v)[0] for v in stored]

    def _write_batch(self) -> Any:
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._db.get_column_family_handle(self.name))
        return batch

    def append(self, rows: pa.RecordBatch, key_groups: np.ndarray) -> None:
        if not rows.num_rows:
            return
        schema = self.schema
        rows = schema.conform(rows)
        # The rows of each distinct key together (stable: appended order kept per key).
        encoded = rows.column(schema.key).dictionary_encode(null_encoding="encode")
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        rows = rows.take(pa.array(order))
        codes = codes[order]
        starts = np.concatenate([[0], np.flatnonzero(np.diff(codes)) + 1])
        ends = np.concatenate([starts[1:], [len(codes)]])
        distinct = encoded.dictionary.take(pa.array(codes[starts]))
        kgs = np.asarray(key_groups)[order][starts]
        prefixes = self._prefixes(distinct, kgs)
        batch = self._write_batch()
        for prefix, seq, start, end in zip(
            prefixes, self._counters(prefixes), starts.tolist(), ends.tolist(), strict=True
        ):
            value = encode_value(schema.dumps(rows.slice(start, end - start)), None)
            batch.put(prefix + _SEQ.pack(seq), value)
            batch.put(prefix, _SEQ.pack(seq + 1))
        self._db.write(batch, self._write_options)

    def _entries(self, keys: pa.Array, key_groups: np.ndarray) -> tuple[list[bytes], list[bytes]]:
        """The keys' counter entries and live row entries."""
        prefixes = self._prefixes(keys, key_groups)
        entries = [
            prefix + _SEQ.pack(seq)
            for prefix, count in zip(prefixes, self._counters(prefixes), strict=True)
            for seq in range(count)
        ]
        return prefixes, entries

    def _decoded(self, stored: list[Any]) -> pa.Table:
        schema = self.schema
        batches = [schema.loads(split_value(bytes(v))[0]) for v in stored if v is not None]
        return pa.Table.from_batches(batches, schema=schema.schema)

    def read(self, keys: pa.Array, key_groups: np.ndarray) -> pa.Table:
        if not len(keys):
            return self.schema.schema.empty_table()
        _, entries = self._entries(keys, key_groups)
        return self._decoded(self._column.cf.get(entries) if entries else [])

    def pop(self, keys: pa.Array, key_groups: np.ndarray) -> pa.Table:
        if not len(keys):
            return self.schema.schema.empty_table()
        prefixes, entries = self._entries(keys, key_groups)
        if not entries:
            return self.schema.schema.empty_table()
        stored = self._column.cf.get(entries)
        batch = self._write_batch()
        for db_key in entries + prefixes:
            batch.delete(db_key)
        self._db.write(batch, self._write_options)
        return self._decoded(stored)

    def pop_until(self, bound: int) -> pa.Table:
        if bound < 0:
            return self.schema.schema.empty_table()
        # Below the prefix of key ``bound + 1`` in a key group: its keys up to ``bound``.
        upper = encode_key(bound + 1)
        stored: list[bytes] = []
        batch = self._write_batch()
        for kg in self._key_groups:
            lo, hi = encode_prefix(kg, b"")[:2], encode_prefix(kg, upper)
            for db_key, value in self._column.scan(lo, hi):
                batch.delete(db_key)
                if decode_prefix(bytes(db_key))[3]:  # not a counter
                    stored.append(value)
        if batch.len():
            self._db.write(batch, self._write_options)
        return self._decoded(stored)

    def table(self) -> pa.Table:
        schema = self.schema
        kgs: list[int] = []
        batches: list[pa.RecordBatch] = []
        for db_key, value in self._column.cf.items():
            kg, _key, _ns, rest = decode_prefix(bytes(db_key))
            if rest:  # not a counter
                batches.append(schema.loads(split_value(bytes(value))[0]))
                kgs.append(kg)
        # One chunk: an entry holds one key's rows, and Arrow kernels (a group_by over a
        # window's slices) slow down with every chunk of a table.
        rows = pa.Table.from_batches(batches, schema=schema.schema).combine_chunks()
        groups = np.repeat(
            np.array(kgs, dtype=np.int32), np.array([b.num_rows for b in batches], dtype=np.int64)
        )
        return rows.add_column(0, KG, pa.array(groups))

    def __len__(self) -> int:
        return self.table().num_rows
