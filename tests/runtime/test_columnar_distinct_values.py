"""DistinctValues: a COUNT(DISTINCT)'s values per group, indexed in memory (heap) or read
and joined (RocksDB); both give every group's exact count, against a Python reference."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from epochstream.core.clock import ManualClock
from epochstream.runtime.operators.columnar_distinct_values import DistinctValues
from epochstream.runtime.operators.columnar_group_keys import GroupKeys
from epochstream.state.backends.base import KeyedBackendContext, RowSchema
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend

MAX_P = 16
SCHEMA = pa.schema([("g", pa.string()), ("v", pa.float64())])


def _backend(kind: str, root: Path) -> Any:
    ctx = KeyedBackendContext(
        operator_uid="agg",
        subtask=0,
        max_parallelism=MAX_P,
        key_group_range=range(0, MAX_P),
        clock=ManualClock(),
        local_dir=str(root / kind),
    )
    config = HeapStateBackend() if kind == "heap" else RocksDBStateBackend(block_cache_mb=8)
    return config.create(ctx)


@pytest.mark.parametrize("indexed", [True, False], ids=["indexed", "read"])
def test_counts_equal_a_python_reference_batch_after_batch(tmp_path: Path, indexed: bool) -> None:
    backend = _backend("heap" if indexed else "rocksdb", tmp_path)
    table = backend.row_table("distinct0", RowSchema(SCHEMA, "g"))
    values = DistinctValues(table, "g", "v", indexed=indexed)
    keys = GroupKeys(("g",), "agg", MAX_P)
    rng = random.Random(7)
    seen: dict[str, set[Any]] = {}
    for _ in range(30):
        rows = [
            (rng.choice("abc"), rng.choice([None, float("nan"), 0.5, *range(20)]))
            for _ in range(rng.randint(1, 40))
        ]
        batch = pa.record_batch(
            {"g": [g for g, _ in rows], "v": pa.array([v for _, v in rows], pa.float64())}
        )
        found = keys.of(batch, {"g": pa.string(), "v": pa.float64()})
        groups = found.keys.to_pylist()
        expected_before = [len(seen.get(g, ())) for g in groups]
        for g, v in rows:
            if v is not None:
                seen.setdefault(g, set()).add("nan" if v != v else v)
        before, after = values.update(found, batch.column("v"))
        assert before.tolist() == expected_before
        assert after.tolist() == [len(seen[g]) if g in seen else 0 for g in groups]
    # The row table holds each (group, value) once: what a restore indexes again.
    stored = table.table()
    assert stored.num_rows == sum(len(s) for s in seen.values())
    again = DistinctValues(table, "g", "v", indexed=True)  # rebuilt from the table
    known = next(iter(seen["a"]))
    value = float("nan") if known == "nan" else known
    found = keys.of(pa.record_batch({"g": ["a"], "v": [value]}), {})
    before, after = again.update(found, pa.array([value], pa.float64()))
    assert before.tolist() == after.tolist() == [len(seen["a"])]


@pytest.mark.parametrize("indexed", [True, False], ids=["indexed", "read"])
def test_dropped_groups_start_over(tmp_path: Path, indexed: bool) -> None:
    backend = _backend("heap" if indexed else "rocksdb", tmp_path)
    table = backend.row_table("distinct0", RowSchema(SCHEMA, "g"))
    values = DistinctValues(table, "g", "v", indexed=indexed)
    keys = GroupKeys(("g",), "agg", MAX_P)
    batch = pa.record_batch({"g": ["a", "a", "b"], "v": [1.0, 2.0, 1.0]})
    found = keys.of(batch, {})
    assert values.update(found, batch.column("v"))[1].tolist() == [2, 1]
    values.drop(found.keys.slice(0, 1), found.key_groups[:1])
    assert values.update(found, batch.column("v"))[0].tolist() == [0, 1]
    assert np.array_equal(values.update(found, batch.column("v"))[1], [2, 1])
