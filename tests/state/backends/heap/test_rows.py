"""Heap row tables: the row file (a record batch per key group, each table's rows as an
IPC stream naming its key column) and reading only some key groups of it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from epochstream.core.filesystems import storage_fs
from epochstream.state.backends.base import ROWS, RowSchema
from epochstream.state.backends.heap.rows import HeapRowTable, read_row_tables, write_row_tables
from epochstream.state.column_keygroups import key_groups_of_column

from ..conftest import MAX_P

SCHEMA = RowSchema(
    pa.schema([("id", pa.int64()), ("name", pa.string())], metadata={b"note": b"kept"}), key="id"
)


def test_a_row_file_holds_every_table_per_key_group(tmp_path: Path) -> None:
    tables = {}
    for name in ("left", "right"):
        table = HeapRowTable(name, SCHEMA)
        rows = pa.record_batch(
            [pa.array(list(range(50))), pa.array([name] * 50)], schema=SCHEMA.schema
        )
        table.append(rows, key_groups_of_column(rows.column("id"), MAX_P))
        tables[name] = (table.schema, table.batches())
    fs = storage_fs(str(tmp_path))
    handle = write_row_tables(fs, str(tmp_path / "op.rows.arrow"), tables, range(0, MAX_P))
    assert handle is not None and handle.states == {"left": ROWS, "right": ROWS}
    half = range(0, MAX_P // 2)
    got: dict[str, list[int]] = {}
    for name, schema, rows in read_row_tables(lambda _: fs, handle, half):
        assert schema.key == "id" and schema.schema.metadata == {b"note": b"kept"}
        assert set(rows.column("_kg").to_pylist()) <= set(half)
        got.setdefault(name, []).extend(rows.column("id").to_pylist())
    mine = [k for k, g in enumerate(key_groups_of_column(pa.array(range(50)), MAX_P)) if g in half]
    assert {n: sorted(ids) for n, ids in got.items()} == {"left": mine, "right": mine}


def test_an_empty_backend_writes_no_row_file(tmp_path: Path) -> None:
    fs = storage_fs(str(tmp_path))
    empty = {"left": (SCHEMA, HeapRowTable("left", SCHEMA).batches())}
    assert write_row_tables(fs, str(tmp_path / "x.arrow"), empty, range(0, MAX_P)) is None
