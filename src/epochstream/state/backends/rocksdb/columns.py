"""The RocksDB backend's columnar state: one column family per columnar state.

Keys are the backend's one stored key layout (:func:`encode_prefix` of the key group
and :func:`~epochstream.state.keyformat.encode_key` of the key), so key-group range
copies on rescale, incremental snapshots and savepoints treat columnar state like any
other state. A value is the backend's value header (no TTL) followed by the packed
accumulator record of the state's :class:`ColumnSchema` (fixed width, little-endian).
The schema is the column's serializer, recorded in the meta column family, so a
restore knows the fields and the aggregated column's type.

A batch costs one multi-get (``Rdict.get`` of a list of keys) and one ``WriteBatch``:
the records of all keys are packed and unpacked by NumPy in one step each.

Example::

    table = RocksColumnTable(column, db, write_options, remember)
    acc = table.read(pa.array(["a", "b"]), np.array([7, 9]))   # identities if absent
    table.write(pa.array(["a", "b"]), np.array([7, 9]), acc)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from epochstream.core.arrow import KG
from epochstream.exceptions import StateError
from epochstream.state.backends.base import COLUMN_KEY, ColumnSchema, ColumnTable
from epochstream.state.backends.rocksdb.states import RocksColumn, decode_prefix, encode_prefix
from epochstream.state.keyformat import decode_key, encode_key

__all__ = ["RocksColumnTable"]

#: The value header of an entry without TTL (see ``encode_value``).
_PLAIN = 0


def _stored_record(schema: ColumnSchema) -> np.dtype:
    """One stored value: the header byte, then the packed accumulators."""
    fields: list[tuple[str, Any]] = [("_header", np.uint8)]
    fields += [(name, np.dtype(kind).newbyteorder("<")) for name, kind, _ in schema.fields]
    return np.dtype(fields)


class RocksColumnTable(ColumnTable):
    """One columnar state in a RocksDB column family (see the module docstring).

    Example: ``len(RocksColumnTable(column, db, options, remember))`` counts its entries.
    """

    def __init__(
        self,
        column: RocksColumn,
        db: Any,
        write_options: Any,
        remember: Callable[[RocksColumn], None],
    ) -> None:
        if not isinstance(column.serializer, ColumnSchema):
            raise StateError(f"state {column.name!r} is not columnar state")
        self.name = column.name
        self._column = column
        self._db = db
        self._write_options = write_options
        self._remember = remember
        self._record = _stored_record(column.serializer)
        self._last_keys: tuple[pa.Array, list[bytes]] | None = None

    @property
    def schema(self) -> ColumnSchema:
        schema = self._column.serializer
        assert isinstance(schema, ColumnSchema)
        return schema

    def set_schema(self, schema: ColumnSchema) -> None:
        old = self.schema
        if schema == old:
            return
        stored = [(n, np.dtype(k)) for n, k, _ in old.fields]
        if stored != [(n, np.dtype(k)) for n, k, _ in schema.fields] and len(self):
            # The stored records are bytes of the old layout: reading them with another
            # one would give wrong numbers, not an error.
            raise StateError(
                f"columnar state {self.name!r} holds fields {old.fields}, not {schema.fields}"
            )
        self._column.serializer = schema
        self._record = _stored_record(schema)
        self._remember(self._column)

    def _db_keys(self, keys: pa.Array, key_groups: np.ndarray) -> list[bytes]:
        # Encoding is most of a batch's cost; an operator writes back the very keys
        # array it read, so the encoding of the last array is kept (by identity).
        last = self._last_keys
        if last is not None and last[0] is keys:
            return last[1]
        db_keys = [
            encode_prefix(kg, encode_key(key))
            for key, kg in zip(keys.to_pylist(), np.asarray(key_groups).tolist(), strict=True)
        ]
        self._last_keys = (keys, db_keys)
        return db_keys

    def read(self, keys: pa.Array, key_groups: np.ndarray) -> dict[str, np.ndarray]:
        values = self.schema.identities(len(keys))
        if not len(keys):
            return values
        stored = self._column.cf.get(self._db_keys(keys, key_groups))
        found = np.fromiter((v is not None for v in stored), dtype=bool, count=len(stored))
        if found.any():
            records = self._records([v for v in stored if v is not None])
            for name in values:
                values[name][found] = records[name]
        return values

    def _records(self, stored: list[bytes]) -> np.ndarray:
        size = self._record.itemsize
        if any(len(v) != size for v in stored):
            raise StateError(f"columnar state {self.name!r}: a stored value is not a record")
        records = np.frombuffer(b"".join(stored), dtype=self._record)
        if (records["_header"] != _PLAIN).any():
            raise StateError(f"columnar state {self.name!r}: a stored value is not a record")
        return records

    def write(self, keys: pa.Array, key_groups: np.ndarray, values: dict[str, np.ndarray]) -> None:
        n = len(keys)
        if not n:
            return
        records = np.zeros(n, dtype=self._record)
        for name in self.schema.names:
            records[name] = values[name]
        raw = records.tobytes()
        size = self._record.itemsize
        batch = self._write_batch()
        for i, db_key in enumerate(self._db_keys(keys, key_groups)):
            batch.put(db_key, raw[i * size : (i + 1) * size])
        self._db.write(batch, self._write_options)

    def _write_batch(self) -> Any:
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._db.get_column_family_handle(self.name))
        return batch

    def table(self) -> pa.Table:
        kgs: list[int] = []
        keys: list[Any] = []
        stored: list[bytes] = []
        for db_key, value in self._column.cf.items():
            kg, key, _ns, _rest = decode_prefix(bytes(db_key))
            kgs.append(kg)
            keys.append(decode_key(key))
            stored.append(bytes(value))
        records = self._records(stored) if stored else np.zeros(0, dtype=self._record)
        columns: dict[str, Any] = {KG: pa.array(kgs, pa.int32()), COLUMN_KEY: pa.array(keys)}
        for name in self.schema.names:
            columns[name] = pa.array(records[name].astype(records[name].dtype.newbyteorder("=")))
        return pa.table(columns)

    def __len__(self) -> int:
        return sum(1 for _ in self._column.cf.keys())
