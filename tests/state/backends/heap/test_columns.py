"""Heap columnar state: slots and arrays, and the columnar Arrow file as its snapshot
(checkpoints written before columnar state moved behind the backend restore)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from epochstream.core.arrow import KG
from epochstream.exceptions import StateError
from epochstream.state.backends.base import ColumnSchema
from epochstream.state.backends.heap.columns import HeapColumnTable
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.columnar_aggregates import write_columnar_state
from epochstream.state.columnar_checks import with_value_type
from epochstream.state.handles import ColumnarSnapshotHandle

from ..conftest import MAX_P, Harness

MIN = ColumnSchema((("acc", "int64", 2**63 - 1), ("count", "int64", 0)), pa.int32())


def test_new_slots_start_at_the_identities_and_keep_their_key_groups() -> None:
    table = HeapColumnTable("min", MIN)
    keys = pa.array([10, 20])
    kgs = key_groups_of_column(keys, MAX_P)
    assert table.read(keys, kgs)["acc"].tolist() == [2**63 - 1] * 2
    table.write(pa.array([20]), kgs[1:], {"acc": np.array([4]), "count": np.array([1])})
    assert table.table().to_pydict() == {
        KG: kgs.tolist(),
        "_key": [10, 20],
        "acc": [2**63 - 1, 4],
        "count": [0, 1],
    }
    assert len(table) == 2


def test_set_schema_converts_the_arrays_and_refuses_other_fields() -> None:
    table = HeapColumnTable("sum", ColumnSchema((("acc", "int64", 0), ("count", "int64", 0))))
    table.write(pa.array(["a"]), np.array([1]), {"acc": np.array([3]), "count": np.array([1])})
    table.set_schema(ColumnSchema((("acc", "float64", 0.0), ("count", "int64", 0))))
    assert table.arrays["acc"].dtype == np.float64 and table.read(pa.array(["a"]), np.array([1]))[
        "acc"
    ].tolist() == [3.0]
    with pytest.raises(StateError, match="holds fields"):
        table.set_schema(ColumnSchema((("total", "int64", 0),)))


def test_load_refuses_a_key_twice() -> None:
    table = HeapColumnTable("sum", ColumnSchema((("acc", "int64", 0), ("count", "int64", 0))))
    rows = pa.table({KG: pa.array([1, 1], pa.int32()), "acc": [1, 2], "count": [1, 1]})
    with pytest.raises(StateError, match="holds a key twice"):
        table.load(rows, pa.array(["a", "a"]))


def test_a_columnar_file_from_before_the_backend_restores(tmp_path) -> None:
    """A checkpoint's columnar file as the operator wrote it itself (key under the key
    column's own name, as files before 2026-11-26): the heap backend reads it."""
    h = Harness("heap", tmp_path)
    keys = pa.array(["x", "y", "z"])
    old = pa.table(
        {
            KG: pa.array(key_groups_of_column(keys, MAX_P)),
            "user": keys,
            "acc": pa.array([5, 6, 7]),
            "count": pa.array([1, 2, 3]),
        }
    )
    path = str(tmp_path / "old.columnar.arrow")
    handle = write_columnar_state(
        h.fs, path, with_value_type(old, pa.int16()), key_groups=range(0, MAX_P), state="max"
    )
    assert isinstance(handle, ColumnarSnapshotHandle)
    backend = h.backend()
    backend.restore([handle], checkpoint_id=3, owned=True)
    table = backend.column_table("max")
    assert table is not None and table.schema.value_type == pa.int16()
    assert table.schema.fields[0][2] == -(2**63)  # max starts at the lowest int64
    assert sorted(table.table().column("_key").to_pylist()) == ["x", "y", "z"]
    # A snapshot writes the same format back.
    again = backend.snapshot(h.target(4)).run()
    assert isinstance(again, ColumnarSnapshotHandle) and again.states == {"max": "columnar"}
