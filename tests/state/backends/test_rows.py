"""The row-table contract (``KeyedStateBackend.row_table``), on every backend: append,
read and pop per key, the queue by integer key (``pop_until``), snapshots restored
at the same and at another parallelism, and savepoints restored on either backend."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from epochstream.exceptions import StateError
from epochstream.state.backends.base import RowSchema
from epochstream.state.column_keygroups import key_groups_of_column

from .conftest import MAX_P, Harness

SCHEMA = RowSchema(pa.schema([("id", pa.int64()), ("name", pa.string())]), key="id")


def _kgs(keys: pa.Array) -> np.ndarray:
    return key_groups_of_column(keys, MAX_P)


def _rows(ids: list[int], names: list[str]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array(names)], schema=SCHEMA.schema)


def _pairs(table: pa.Table) -> list[tuple[int, str]]:
    return sorted(
        zip(table.column("id").to_pylist(), table.column("name").to_pylist(), strict=True)
    )


def _append(table: object, ids: list[int], names: list[str]) -> None:
    rows = _rows(ids, names)
    table.append(rows, _kgs(rows.column("id")))  # type: ignore[attr-defined]


def test_rows_are_read_and_popped_per_key(harness: Harness) -> None:
    backend = harness.backend()
    assert backend.row_table("left") is None
    table = backend.row_table("left", SCHEMA)
    _append(table, [1, 2, 1], ["a", "b", "c"])
    _append(table, [1, 3], ["d", "e"])
    keys = pa.array([1, 9], pa.int64())
    got = table.read(keys, _kgs(keys))
    assert got.column("name").to_pylist() == ["a", "c", "d"]  # appended order per key
    popped = table.pop(pa.array([1, 9], pa.int64()), _kgs(pa.array([1, 9], pa.int64())))
    assert popped.column("name").to_pylist() == ["a", "c", "d"]
    assert _pairs(table.table().drop_columns(["_kg"])) == [(2, "b"), (3, "e")]
    assert table.pop(keys, _kgs(keys)).num_rows == 0
    assert len(table) == 2 and backend.row_tables() == ["left"]
    _append(table, [1], ["f"])  # a deleted key starts over
    assert table.read(keys, _kgs(keys)).column("name").to_pylist() == ["f"]
    assert table.table().column("_kg").to_pylist() == [
        int(g) for g in _kgs(table.table().column("id").combine_chunks())
    ]


def test_pop_until_takes_out_the_rows_up_to_a_key(harness: Harness) -> None:
    schema = RowSchema(pa.schema([("due", pa.uint64()), ("k", pa.string())]), key="due")
    table = harness.backend().row_table("ends", schema)
    due = [5, 2**63 + 7, 300, 5, 2**64 - 1, 0, 256]
    keys = [f"s{i}" for i in range(len(due))]
    rows = pa.record_batch([pa.array(due, pa.uint64()), pa.array(keys)], schema=schema.schema)
    table.append(rows, _kgs(pa.array(keys)))  # the key groups of other keys
    popped = table.pop_until(300)
    assert sorted(popped.column("due").to_pylist()) == [0, 5, 5, 256, 300]
    assert table.pop_until(300).num_rows == 0
    assert sorted(table.pop_until(2**64 - 1).column("due").to_pylist()) == [2**63 + 7, 2**64 - 1]
    assert len(table) == 0


def test_snapshot_restores_and_rescales(harness: Harness) -> None:
    backend = harness.backend()
    table = backend.row_table("right", SCHEMA)
    ids = list(range(400))
    _append(table, ids, [f"n{i}" for i in ids])
    _append(table, ids[:10], [f"m{i}" for i in ids[:10]])
    handle = backend.snapshot(harness.target(1)).run()
    assert handle is not None
    expected = sorted([(i, f"n{i}") for i in ids] + [(i, f"m{i}") for i in ids[:10]])
    same = harness.backend()
    same.restore([handle], checkpoint_id=1, owned=True)
    restored = same.row_table("right")
    assert restored is not None and restored.schema == SCHEMA
    assert _pairs(restored.table()) == expected
    merged: list[tuple[int, str]] = []
    for subtask in range(3):
        part = harness.backend(parallelism=3, subtask=subtask)
        part.restore([handle], checkpoint_id=None, owned=False)
        rows = part.row_table("right", SCHEMA)
        got = rows.table()
        assert set(got.column("_kg").to_pylist()) <= set(part.key_group_range)
        merged += _pairs(got)
        keys = pa.array([3, 5], pa.int64())
        mine = [
            k for k, g in zip([3, 5], _kgs(keys).tolist(), strict=True) if g in part.key_group_range
        ]
        assert sorted(set(rows.read(keys, _kgs(keys)).column("id").to_pylist())) == mine
        _append(rows, [1000 + subtask], ["x"])  # appends continue after a restore
    assert sorted(merged) == expected


@pytest.mark.parametrize("restore_on", ["heap", "rocksdb"])
def test_a_savepoint_of_row_tables_restores_on_either_backend(
    harness: Harness, restore_on: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    backend = harness.backend()
    for name in ("left@0", "left@1000"):
        _append(backend.row_table(name, SCHEMA), [1, 2, 3], [name, name, name])
    handle = backend.snapshot(harness.target(1, savepoint="sp")).run()
    assert handle is not None
    other = Harness(restore_on, tmp_path_factory.mktemp("other"))
    merged: dict[str, list[tuple[int, str]]] = {}
    for subtask in range(2):
        part = other.backend(parallelism=2, subtask=subtask)
        part.restore([handle], checkpoint_id=None, owned=False)
        for name in part.row_tables():
            table = part.row_table(name)
            assert table is not None and table.schema == SCHEMA
            merged.setdefault(name, []).extend(_pairs(table.table()))
    assert {n: sorted(r) for n, r in merged.items()} == {
        n: [(1, n), (2, n), (3, n)] for n in ("left@0", "left@1000")
    }


def test_dropped_row_tables_are_gone_and_schemas_are_checked(harness: Harness) -> None:
    backend = harness.backend()
    _append(backend.row_table("left@0", SCHEMA), [1], ["a"])
    _append(backend.row_table("left@10", SCHEMA), [2], ["b"])
    backend.drop_row_table("left@0")
    handle = backend.snapshot(harness.target(1)).run()
    restored = harness.backend()
    restored.restore([handle], checkpoint_id=1, owned=True)
    assert restored.row_tables() == ["left@10"]
    other = RowSchema(pa.schema([("id", pa.string())]), key="id")
    with pytest.raises(StateError):
        restored.row_table("left@10", other)
