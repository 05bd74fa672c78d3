"""RocksDB columnar state: the stored layout (the one key format, packed records),
state larger than the database's memory, and heap columnar files read into RocksDB."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from epochstream.core.arrow import KG
from epochstream.exceptions import StateError
from epochstream.state.backends.base import ColumnSchema
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.backends.rocksdb.states import encode_prefix
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.columnar_aggregates import write_columnar_state
from epochstream.state.columnar_checks import with_value_type
from epochstream.state.handles import RocksDBSnapshotHandle
from epochstream.state.keyformat import encode_key

from ..conftest import MAX_P, Harness

SUM = ColumnSchema((("acc", "int64", 0), ("count", "int64", 0)), pa.int64())


def _harness(tmp_path: Any, **config: Any) -> Harness:
    h = Harness("rocksdb", tmp_path)
    h.config = RocksDBStateBackend(**config)
    return h


def test_entries_are_stored_under_the_one_key_format_as_packed_records(tmp_path: Any) -> None:
    backend = _harness(tmp_path).backend()
    table = backend.column_table("sum", SUM)
    keys = pa.array(["a", "b"])
    kgs = key_groups_of_column(keys, MAX_P)
    table.write(keys, kgs, {"acc": np.array([5, -1]), "count": np.array([2, 1])})
    cf = backend._columns["sum"].cf
    stored = cf.get(encode_prefix(int(kgs[0]), encode_key("a")))
    assert stored == b"\x00" + np.array([(5, 2)], dtype="<i8,<i8").tobytes()
    # The schema is the state's serializer: offline readers decode an entry with it.
    assert SUM.loads(stored[1:]) == (5, 2)


def test_a_value_that_is_not_a_record_is_refused(tmp_path: Any) -> None:
    backend = _harness(tmp_path).backend()
    table = backend.column_table("sum", SUM)
    kgs = key_groups_of_column(pa.array(["a"]), MAX_P)
    backend._columns["sum"].cf.put(encode_prefix(int(kgs[0]), encode_key("a")), b"\x00abc")
    with pytest.raises(StateError, match="not a record"):
        table.read(pa.array(["a"]), kgs)


def test_a_columnar_state_larger_than_the_cache_through_a_snapshot(tmp_path: Any) -> None:
    """200k keys (about 10 MB stored) through a 1 MB cache and 1 MB write buffers."""
    h = _harness(tmp_path, block_cache_mb=1, write_buffer_mb=1)
    backend = h.backend()
    table = backend.column_table("sum", SUM)
    n = 200_000
    for start in range(0, n, 20_000):
        keys = pa.array([f"user-{i:08d}" for i in range(start, start + 20_000)])
        kgs = key_groups_of_column(keys, MAX_P)
        values = table.read(keys, kgs)
        values["acc"] += np.arange(start, start + 20_000)
        values["count"] += 1
        table.write(keys, kgs, values)
    handle = backend.snapshot(h.target(1)).run()
    assert isinstance(handle, RocksDBSnapshotHandle)
    restored = h.backend()
    restored.restore([handle], checkpoint_id=1, owned=True)
    again = restored.column_table("sum")
    assert again is not None and len(again) == n
    probe = pa.array([f"user-{i:08d}" for i in (0, 77_777, n - 1)])
    assert again.read(probe, key_groups_of_column(probe, MAX_P))["acc"].tolist() == [
        0,
        77_777,
        n - 1,
    ]


def test_a_heap_columnar_file_restores_into_rocksdb(tmp_path: Any) -> None:
    h = _harness(tmp_path)
    keys = pa.array([3, 4, 5])
    rows = pa.table(
        {
            KG: pa.array(key_groups_of_column(keys, MAX_P)),
            "_key": keys,
            "acc": pa.array([1.5, 2.5, 3.5]),
            "count": pa.array([1, 1, 2]),
        }
    )
    handle = write_columnar_state(
        h.fs,
        str(tmp_path / "heap.columnar.arrow"),
        with_value_type(rows, pa.float64()),
        key_groups=range(0, MAX_P),
        state="mean",
    )
    assert handle is not None
    backend = h.backend()
    backend.restore([handle], checkpoint_id=None, owned=False)
    table = backend.column_table("mean")
    assert table is not None and table.schema.fields[0][1] == "float64"
    got = table.table().to_pydict()
    assert dict(zip(got["_key"], got["acc"], strict=True)) == {3: 1.5, 4: 2.5, 5: 3.5}


@pytest.mark.parametrize("savepoint", [False, True])
def test_offline_reads_give_the_aggregate_per_key_and_window(
    tmp_path: Any, savepoint: bool
) -> None:
    from epochstream.checkpoint.reader import _state_names, state_rows
    from epochstream.state.columnar_aggregates import accumulator_schema, window_table_name

    h = _harness(tmp_path)
    backend = h.backend()
    schema = accumulator_schema("mean", np.float64, pa.int64())
    keys = pa.array(["a", "b"])
    kgs = key_groups_of_column(keys, MAX_P)
    for start in (0, 500):
        table = backend.column_table(window_table_name("mean", start), schema)
        acc = {"acc": np.array([9.0, 1.0]) + start, "count": np.array([3, 0])}
        table.write(keys, kgs, acc)
    target = h.target(1, savepoint="sp") if savepoint else h.target(1)
    handle = backend.snapshot(target).run()
    assert handle is not None and _state_names(handle) == {"mean"}
    rows = sorted((r[0], r[1], r[3]) for r in state_rows(handle, "mean", MAX_P))
    assert rows == [("a", 3.0, 0), ("a", 509.0 / 3, 500), ("b", None, 0), ("b", None, 500)]
