"""RocksDB row tables: the stored layout (the one key format, list state's entries and
counter, Arrow IPC values) and rows beyond the database's memory."""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

from epochstream.state.backends.base import RowSchema
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.backends.rocksdb.states import encode_prefix, split_value
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.keyformat import encode_key

from ..conftest import MAX_P, Harness

SCHEMA = RowSchema(pa.schema([("k", pa.string()), ("v", pa.int64())]), key="k")


def _harness(tmp_path: Any, **config: Any) -> Harness:
    h = Harness("rocksdb", tmp_path)
    h.config = RocksDBStateBackend(**config)
    return h


def test_rows_are_stored_per_key_under_the_one_key_format(tmp_path: Any) -> None:
    backend = _harness(tmp_path).backend()
    table = backend.row_table("left", SCHEMA)
    for values in ([1, 2], [3]):
        rows = pa.record_batch(
            [pa.array(["a"] * len(values)), pa.array(values)], schema=SCHEMA.schema
        )
        table.append(rows, key_groups_of_column(rows.column("k"), MAX_P))
    prefix = encode_prefix(int(key_groups_of_column(pa.array(["a"]), MAX_P)[0]), encode_key("a"))
    cf = backend._columns["left"].cf
    assert dict(cf.items()).keys() == {
        prefix,
        prefix + struct.pack(">Q", 0),
        prefix + struct.pack(">Q", 1),
    }
    assert cf[prefix] == struct.pack(">Q", 2)  # the next sequence number
    first = SCHEMA.loads(split_value(cf[prefix + struct.pack(">Q", 0)])[0])
    assert first.column("v").to_pylist() == [1, 2]


def test_rows_beyond_the_memory_bounds_stay_readable(tmp_path: Any) -> None:
    backend = _harness(tmp_path, block_cache_mb=1, write_buffer_mb=1).backend()
    table = backend.row_table("left", SCHEMA)
    keys = [f"key-{i:06d}" for i in range(60_000)]
    rows = pa.record_batch([pa.array(keys), pa.array(range(60_000))], schema=SCHEMA.schema)
    kgs = key_groups_of_column(rows.column("k"), MAX_P)
    for start in range(0, 60_000, 10_000):
        table.append(rows.slice(start, 10_000), kgs[start : start + 10_000])
    wanted = pa.array(keys[::997])
    got = table.read(wanted, key_groups_of_column(wanted, MAX_P))
    assert got.column("v").to_pylist() == list(range(0, 60_000, 997))
    assert len(table) == 60_000
