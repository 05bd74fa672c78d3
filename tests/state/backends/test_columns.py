"""The columnar-state contract (``KeyedStateBackend.column_table``), on every backend:
batch reads and writes, snapshots, restore at the same and at another parallelism,
and the rolling columnar aggregation over each backend against a dict oracle."""

from __future__ import annotations

import collections
import random

import numpy as np
import pyarrow as pa
import pytest

from epochstream.exceptions import StateError
from epochstream.state.backends.base import ColumnSchema
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.columnar_aggregates import ColumnarAggregates, accumulator_schema

from .conftest import MAX_P, Harness

SCHEMA = ColumnSchema((("acc", "int64", 0), ("count", "int64", 0)), pa.int64())


def _kgs(keys: pa.Array) -> np.ndarray:
    return key_groups_of_column(keys, MAX_P)


def _entries(table: pa.Table) -> dict[object, tuple[int, int]]:
    cols = table.to_pydict()
    return {k: (a, c) for k, a, c in zip(cols["_key"], cols["acc"], cols["count"], strict=True)}


def test_read_gives_identities_for_missing_keys_and_write_stores(harness: Harness) -> None:
    backend = harness.backend()
    assert backend.column_table("sum") is None
    table = backend.column_table("sum", SCHEMA)
    keys = pa.array(["a", "b", "c"])
    got = table.read(keys, _kgs(keys))
    assert got["acc"].tolist() == [0, 0, 0] and got["count"].tolist() == [0, 0, 0]
    got["acc"] += np.array([5, -7, 2**62])
    got["count"] += 1
    table.write(keys, _kgs(keys), got)
    again = table.read(pa.array(["c", "a", "z"]), _kgs(pa.array(["c", "a", "z"])))
    assert again["acc"].tolist() == [2**62, 5, 0]
    assert len(backend.column_table("sum")) >= 3  # heap reserves "z" at the read
    assert _entries(table.table())["b"] == (-7, 1)


def test_snapshot_restores_and_rescales(harness: Harness) -> None:
    backend = harness.backend()
    table = backend.column_table("sum", SCHEMA)
    keys = pa.array(list(range(500)))
    table.write(keys, _kgs(keys), {"acc": np.arange(500) * 3, "count": np.ones(500, np.int64)})
    handle = backend.snapshot(harness.target(1)).run()
    assert handle is not None
    same = harness.backend()
    same.restore([handle], checkpoint_id=1, owned=True)
    restored = same.column_table("sum")
    assert restored is not None and restored.schema.value_type == pa.int64()
    assert _entries(restored.table()) == {k: (3 * k, 1) for k in range(500)}
    merged: dict[object, tuple[int, int]] = {}
    for subtask in range(2):
        part = harness.backend(parallelism=2, subtask=subtask)
        part.restore([handle], checkpoint_id=None, owned=False)
        entries = _entries(part.column_table("sum", SCHEMA).table())
        groups = set(_kgs(pa.array(list(entries))).tolist()) if entries else set()
        assert groups <= set(part.key_group_range)
        merged.update(entries)
    assert merged == {k: (3 * k, 1) for k in range(500)}


def test_a_columnar_state_is_not_row_state(harness: Harness) -> None:
    from epochstream.core.state_descriptors import ValueStateDescriptor

    backend = harness.backend()
    backend.value_table(ValueStateDescriptor("sum"))
    with pytest.raises(StateError):
        backend.column_table("sum", SCHEMA)
        backend.snapshot(harness.target(1))


@pytest.mark.parametrize("kind", ["sum", "count", "min", "max", "mean"])
def test_rolling_aggregation_on_every_backend_matches_a_dict(harness: Harness, kind: str) -> None:
    rng = random.Random(7)
    backend = harness.backend()
    agg = ColumnarAggregates(kind, key="k", value="v", max_parallelism=MAX_P, backend=backend)
    seen: dict[str, list[int]] = collections.defaultdict(list)
    handle = None
    for step in range(6):
        keys = [f"k{rng.randrange(300)}" for _ in range(400)]
        values = [rng.randrange(-1000, 1000) for _ in keys]
        out = agg.update(pa.record_batch([pa.array(keys), pa.array(values)], names=["k", "v"]))
        for k, v in zip(keys, values, strict=True):
            seen[k].append(v)
        expected = _oracle(kind, seen)
        name = "count" if kind == "count" else "v"
        for row in out.to_pylist():
            assert row[name] == pytest.approx(expected[row["k"]])
        if step == 2:  # restart from a snapshot halfway
            handle = backend.snapshot(harness.target(1)).run()
            backend = harness.backend()
            backend.restore([handle], checkpoint_id=1, owned=True)
            agg = ColumnarAggregates(
                kind, key="k", value="v", max_parallelism=MAX_P, backend=backend
            )
            agg.attach()
            assert agg.value_type == pa.int64()
    keys, values = agg.result()
    got = dict(zip(keys.to_pylist(), values.to_pylist(), strict=True))
    assert got == pytest.approx(_oracle(kind, seen))


def _oracle(kind: str, seen: dict[str, list[int]]) -> dict[str, float]:
    ops = {"sum": sum, "count": len, "min": min, "max": max}
    if kind == "mean":
        return {k: sum(v) / len(v) for k, v in seen.items()}
    return {k: ops[kind](v) for k, v in seen.items()}


def test_accumulator_schema_identities() -> None:
    assert accumulator_schema("min", np.int64, None).fields[0][2] == 2**63 - 1
    assert accumulator_schema("max", pa.float64(), None).fields[0][2] == -np.inf
    schema = accumulator_schema("sum", np.float64, pa.float32())
    assert schema.loads(schema.dumps((1.5, 3))) == (1.5, 3)
    assert schema.identities(2)["acc"].dtype == np.float64


@pytest.mark.parametrize("restore_on", ["heap", "rocksdb"])
def test_a_savepoint_of_columnar_state_restores_on_either_backend(
    harness: Harness, restore_on: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    backend = harness.backend()
    table = backend.column_table("sum", SCHEMA)
    keys = pa.array([f"u{i}" for i in range(300)])
    table.write(keys, _kgs(keys), {"acc": np.arange(300), "count": np.full(300, 2)})
    handle = backend.snapshot(harness.target(1, savepoint="sp")).run()
    assert handle is not None
    other = Harness(restore_on, tmp_path_factory.mktemp("other"))
    merged: dict[object, tuple[int, int]] = {}
    for subtask in range(2):
        part = other.backend(parallelism=2, subtask=subtask)
        part.restore([handle], checkpoint_id=None, owned=False)
        restored = part.column_table("sum")
        assert restored is not None and restored.schema.value_type == pa.int64()
        merged.update(_entries(restored.table()))
    assert merged == {f"u{i}": (i, 2) for i in range(300)}


def test_dropped_tables_are_gone_from_snapshots(harness: Harness) -> None:
    backend = harness.backend()
    keys = pa.array([1, 2])
    for name in ("sum@0", "sum@10"):
        table = backend.column_table(name, SCHEMA)
        table.write(keys, _kgs(keys), {"acc": np.array([1, 2]), "count": np.array([1, 1])})
    backend.drop_column_table("sum@0")
    assert backend.column_tables() == ["sum@10"]
    handle = backend.snapshot(harness.target(1)).run()
    restored = harness.backend()
    restored.restore([handle], checkpoint_id=1, owned=True)
    assert restored.column_tables() == ["sum@10"]
    restored.drop_column_table("sum@10")
    empty = restored.snapshot(harness.target(2, base=1)).run()
    again = harness.backend()
    again.restore([empty] if empty is not None else [], checkpoint_id=2, owned=True)
    assert again.column_tables() == []
