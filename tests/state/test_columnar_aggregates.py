"""Columnar aggregation state against a per-row oracle; snapshots split by key group."""

from __future__ import annotations

import dataclasses
import random
import struct
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import ConfigurationError, CorruptStateError, DataError, StateError
from epochstream.state.columnar_aggregates import (
    STATE_KEY,
    ColumnarAggregates,
    columnar_rows,
    read_columnar_state,
    state_keys,
    write_columnar_state,
)
from epochstream.state.handles import HeapSnapshotHandle
from epochstream.state.keygroups import key_group_for_key, key_group_range_for_operator

MAX_P = 128


def _batches(seed: int, keys: list[Any], count: int = 8) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(1, 300)
        ks = [rng.choice(keys) for _ in range(n)]
        vs = [rng.choice([None, *range(-50, 50)]) for _ in range(n)]
        out.append(pa.record_batch([pa.array(ks), pa.array(vs, pa.int64())], names=["k", "v"]))
    return out


def _oracle(kind: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if kind == "count":
        return len(values)
    if not present:
        return None
    return {"sum": sum, "min": min, "max": max, "mean": lambda v: sum(v) / len(v)}[kind](present)


@pytest.mark.parametrize("kind", ["sum", "count", "min", "max", "mean"])
@pytest.mark.parametrize("keys", [list(range(-20, 20)), [f"u{i}" for i in range(30)]])
def test_rolling_values_match_a_per_row_oracle(kind: str, keys: list[Any]) -> None:
    agg = ColumnarAggregates(
        kind, key="k", value=None if kind == "count" else "v", max_parallelism=MAX_P
    )
    seen: dict[Any, list[Any]] = defaultdict(list)
    for batch in _batches(7, keys):
        out = agg.update(batch).to_pylist()
        for row in batch.to_pylist():
            seen[row["k"]].append(row["v"])
        touched = {row["k"] for row in batch.to_pylist()}
        assert {r["k"] for r in out} == touched
        name = "count" if kind == "count" else "v"
        for r in out:
            assert r[name] == pytest.approx(_oracle(kind, seen[r["k"]]))


def test_non_numeric_values_are_refused_with_the_column() -> None:
    agg = ColumnarAggregates("sum", key="k", value="v", max_parallelism=MAX_P, where="sum (1/2)")
    with pytest.raises(ConfigurationError, match="sum \\(1/2\\): column 'v' is string"):
        agg.update(pa.record_batch([pa.array([1]), pa.array(["x"])], names=["k", "v"]))


def test_snapshot_restores_split_over_new_key_group_ranges(tmp_path: Path) -> None:
    keys = list(range(500))
    agg = ColumnarAggregates("sum", key="k", value="v", max_parallelism=MAX_P)
    for batch in _batches(3, keys, count=20):
        agg.update(batch)
    fs = storage_fs(str(tmp_path))
    handle = write_columnar_state(
        fs, str(tmp_path / "s.arrow"), agg.state_table(), key_groups=range(0, MAX_P), state="sum"
    )
    assert handle is not None
    before = dict(zip(*(c.to_pylist() for c in agg.result()), strict=True))
    after: dict[Any, Any] = {}
    for index in range(3):  # restore at parallelism 3
        mine = key_group_range_for_operator(MAX_P, 3, index)
        part = handle.restricted_to(mine)
        assert part is not None
        table = read_columnar_state(lambda p: fs, [part], mine, "sums (1/3)")
        assert table is not None
        restored = ColumnarAggregates("sum", key="k", value="v", max_parallelism=MAX_P)
        restored.restore_rows(table)
        keys_back, values = restored.result()
        for k, v in zip(keys_back.to_pylist(), values.to_pylist(), strict=True):
            assert key_group_for_key(k, MAX_P) in mine
            after[k] = v
    assert after == before


def test_a_damaged_or_missing_state_file_is_corrupt_state(tmp_path: Path) -> None:
    """Corrupt state is what makes a restore fall back to an earlier checkpoint; a
    well-formed file with other contents is caught by its CRC-32, kept in the handle."""
    agg = ColumnarAggregates("sum", key="k", value="v", max_parallelism=MAX_P)
    agg.update(pa.record_batch([pa.array([1, 2]), pa.array([5, 6])], names=["k", "v"]))
    fs = storage_fs(str(tmp_path))
    path = tmp_path / "s.arrow"
    handle = write_columnar_state(
        fs, str(path), agg.state_table(), key_groups=range(0, MAX_P), state="sum"
    )
    assert handle is not None and handle.crc == zlib.crc32(path.read_bytes())
    assert handle.file_size == path.stat().st_size
    doc = handle.to_json(str)
    assert type(handle).from_json(doc, str, "test").crc == handle.crc
    good = path.read_bytes()
    read = lambda: read_columnar_state(lambda p: fs, [handle], range(0, MAX_P), "sums (1/1)")  # noqa: E731
    assert read() is not None
    # The same file with one accumulator changed: well-formed Arrow.
    table = pa.ipc.open_file(pa.py_buffer(good)).read_all()
    changed = table.set_column(table.schema.get_field_index("acc"), "acc", pa.array([6, 7]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, changed.schema) as writer:
        writer.write_table(changed)
    for damaged in (sink.getvalue().to_pybytes(), good[:-40], b""):
        path.write_bytes(damaged)
        with pytest.raises(CorruptStateError) as caught:
            read()
        assert caught.value.path == str(path)
    path.unlink()
    with pytest.raises(CorruptStateError, match="cannot read state file"):
        read()
    # Files written before checksums were kept still read.
    path.write_bytes(good)
    legacy = dataclasses.replace(handle, crc=None)
    assert read_columnar_state(lambda p: fs, [legacy], range(0, MAX_P), "sums (1/1)") is not None


def test_state_of_another_operator_kind_is_refused() -> None:
    with pytest.raises(StateError, match="another kind of operator"):
        read_columnar_state(
            lambda p: None, [HeapSnapshotHandle(range(0, 1), ())], range(0, 1), "op"
        )


def test_a_column_changing_type_between_batches_is_bad_data() -> None:
    agg = ColumnarAggregates("sum", key="k", value="v", max_parallelism=MAX_P, where="sum (1/1)")
    agg.update(pa.record_batch([pa.array([1]), pa.array([1])], names=["k", "v"]))
    agg.update(
        pa.record_batch([pa.array([1], pa.int32()), pa.array([2], pa.int16())], names=["k", "v"])
    )
    with pytest.raises(DataError, match="column 'v' changed type from int64 to double"):
        agg.update(pa.record_batch([pa.array([1]), pa.array([1.5])], names=["k", "v"]))
    # Not numeric after a numeric first batch: it was a raw Arrow/NumPy error, retried.
    for later in (pa.array([True]), pa.array(["x"])):
        with pytest.raises(DataError, match=rf"column 'v' changed type from int64 to {later.type}"):
            agg.update(pa.record_batch([pa.array([1]), later], names=["k", "v"]))
    with pytest.raises(
        DataError, match=r"sum \(1/1\): key column 'k' changed type from int64 to string"
    ):
        agg.update(pa.record_batch([pa.array(["a"]), pa.array([1])], names=["k", "v"]))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_integer_keys_of_several_widths_come_out_as_int64(sparse: bool) -> None:
    """A first batch of int8 keys and a later key of 1000 was a raw ArrowInvalid (the
    key did not fit the first batch's type) that the restart strategy retried."""
    agg = ColumnarAggregates(
        "count", key="k", value=None, max_parallelism=MAX_P, where="count (1/1)"
    )
    first = [-1] if sparse else [1]
    assert (
        agg.update(pa.record_batch([pa.array(first, pa.int8())], names=["k"])).column("k").type
        == pa.int8()
    )
    out = agg.update(pa.record_batch([pa.array([1_000, 1_000], pa.int64())], names=["k"]))
    assert out.to_pydict() == {"k": [1_000], "count": [2]} and out.column("k").type == pa.int64()
    keys, counts = agg.result()
    assert sorted(zip(keys.to_pylist(), counts.to_pylist(), strict=True)) == [
        (first[0], 1),
        (1_000, 2),
    ]


@pytest.mark.parametrize("keys", [[1, 1, 2], ["a", "a", "b"]], ids=["dense", "hashed"])
def test_an_int64_sum_that_would_wrap_is_bad_data_naming_the_key(keys: list[Any]) -> None:
    """NumPy and Arrow sums wrap around silently; the row path's Python ints do not."""
    big = 2**62
    agg = ColumnarAggregates("sum", key="k", value="v", max_parallelism=MAX_P, where="sum(v) (1/1)")
    out = agg.update(
        pa.record_batch([pa.array(keys), pa.array([big, big - 1, -big])], names=["k", "v"])
    )
    assert out.to_pydict()["v"] == [2**63 - 1, -big]  # at the limit, not past it
    agg.update(pa.record_batch([pa.array(keys), pa.array([-big, 1, big])], names=["k", "v"]))
    wraps = rf"sum\(v\) \(1/1\): the sum of column 'v' overflows int64 for key {keys[0]!r}"
    with pytest.raises(DataError, match=wraps):
        agg.update(pa.record_batch([pa.array(keys[:1]), pa.array([2**63 - 1])], names=["k", "v"]))


def test_uint64_keys_above_the_int64_range_round_trip() -> None:
    """They are held wrapped into int64; reading them back (a window firing, a
    snapshot) was a raw ArrowInvalid."""
    keys = pa.array([2**64 - 1, 5, 2**63], pa.uint64())
    agg = ColumnarAggregates("count", key="k", value=None, max_parallelism=MAX_P)
    agg.update(pa.record_batch([keys], names=["k"]))
    assert agg.result()[0].to_pylist() == keys.to_pylist()
    table = agg.state_table()
    assert table.column(STATE_KEY).to_pylist() == keys.to_pylist()
    assert table.column("_kg").to_pylist() == [
        key_group_for_key(k, MAX_P) for k in keys.to_pylist()
    ]


@pytest.mark.parametrize("keys", [[1, 1, 2], ["a", "a", "b"]], ids=["dense", "hashed"])
@pytest.mark.parametrize("kind", ["min", "max"])
def test_a_nan_value_gives_nan_whatever_the_key_type(kind: str, keys: list[Any]) -> None:
    """Dense integer keys (NumPy) gave NaN and hashed keys (Arrow, which skips NaN) 1.0."""
    agg = ColumnarAggregates(kind, key="k", value="v", max_parallelism=MAX_P)
    out = agg.update(
        pa.record_batch([pa.array(keys), pa.array([float("nan"), 1.0, 2.0])], names=["k", "v"])
    )
    values = dict(zip(out.column("k").to_pylist(), out.column("v").to_pylist(), strict=True))
    assert values[keys[0]] != values[keys[0]] and values[keys[2]] == 2.0
    later = agg.update(pa.record_batch([pa.array(keys[:1]), pa.array([0.5])], names=["k", "v"]))
    assert later.column("v")[0].as_py() != later.column("v")[0].as_py()  # still NaN


@pytest.mark.parametrize("key", ["acc", "count", "_kg", "_window_start", "k"])
def test_a_key_column_named_like_a_state_column_survives_a_snapshot(
    tmp_path: Path, key: str
) -> None:
    """A key column named ``acc`` or ``count`` took the place of that state column in
    the snapshot: the restored keys were accumulators, and every running value restarted
    from nothing, without an error."""
    agg = ColumnarAggregates("sum", key=key, value="v", max_parallelism=MAX_P)
    agg.update(pa.record_batch([pa.array([1, 2, 1]), pa.array([10, 20, 30])], names=[key, "v"]))
    fs = storage_fs(str(tmp_path))
    path = str(tmp_path / "s.arrow")
    handle = write_columnar_state(
        fs, path, agg.state_table(), key_groups=range(0, MAX_P), state="sum"
    )
    assert handle is not None
    table = read_columnar_state(lambda p: fs, [handle], range(0, MAX_P), "sum (1/1)")
    assert table is not None
    restored = ColumnarAggregates("sum", key=key, value="v", max_parallelism=MAX_P)
    restored.restore_rows(table)
    out = restored.update(pa.record_batch([pa.array([1, 2]), pa.array([1, 1])], names=[key, "v"]))
    assert out.to_pydict() == {key: [1, 2], "v": [41, 21]}
    # Offline reads (es.savepoint.read) find the keys too.
    assert sorted((k, v) for k, v, _, _ in columnar_rows(fs, handle)) == [(1, 40), (2, 20)]


def test_state_written_with_the_key_under_its_own_name_still_restores() -> None:
    """Files written before the key column had a name of its own (``_key``)."""
    legacy = pa.table({"_kg": pa.array([3], pa.int32()), "k": [7], "acc": [5], "count": [1]})
    assert state_keys(legacy, "sum (1/1)").to_pylist() == [7]
    agg = ColumnarAggregates("sum", key="k", value="v", max_parallelism=MAX_P)
    agg.restore_rows(legacy)
    assert [c.to_pylist() for c in agg.result()] == [[7], [5]]
    broken = pa.table({"_kg": pa.array([3], pa.int32()), "acc": [5], "count": [1]})
    with pytest.raises(
        StateError, match="sum \\(1/1\\): restored columnar state has no key column"
    ):
        state_keys(broken, "sum (1/1)")
    assert STATE_KEY in agg.state_table().column_names


@pytest.mark.parametrize("kind", ["sum", "count", "mean"])
def test_float_keys_equal_in_python_are_one_key(kind: str) -> None:
    """0.0 and -0.0 were two Arrow groups sharing one slot (one group's rows were lost),
    and every batch's NaN a new key."""
    nan2 = struct.unpack(">d", bytes.fromhex("7ff8000000000001"))[0]
    agg = ColumnarAggregates(
        kind, key="k", value=None if kind == "count" else "v", max_parallelism=MAX_P
    )
    for _ in range(3):
        keys = pa.array([0.0, -0.0, float("nan"), nan2, 1.5, -0.0])
        out = agg.update(pa.record_batch([keys, pa.array([1.0] * 6)], names=["k", "v"]))
        assert len(out) == 3  # one row per key touched: 0.0, NaN, 1.5
    keys, values = agg.result()
    got = {
        ("nan" if k != k else k): v
        for k, v in zip(keys.to_pylist(), values.to_pylist(), strict=True)
    }
    expected = {"sum": (9.0, 6.0, 3.0), "count": (9, 6, 3), "mean": (1.0, 1.0, 1.0)}[kind]
    assert got == dict(zip([0.0, "nan", 1.5], expected, strict=True))
