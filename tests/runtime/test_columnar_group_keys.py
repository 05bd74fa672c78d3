"""GroupKeys: a batch's state keys, slots, key groups and key columns."""

from __future__ import annotations

import pyarrow as pa
import pytest

from epochstream.exceptions import DataError
from epochstream.runtime.operators.columnar_group_keys import TUPLE_KEY, GroupKeys, key_slots
from epochstream.state.column_keygroups import key_groups_by_columns, tuple_keys_of_columns
from epochstream.state.keyformat import encode_key


def test_one_key_column_is_its_own_state_key() -> None:
    keys = GroupKeys(("k",), "op", 128)
    assert keys.state_key == "k"
    batch = pa.record_batch({"k": [3.0, -0.0, 3.0, 0.0, None]})
    found = keys.of(batch, {})
    # -0.0 and 0.0 are one key (canonical floats); NULL is a key of its own.
    assert found.keys.to_pylist() == [3.0, 0.0, None]
    assert found.slots.tolist() == [0, 1, 0, 1, 2]
    assert found.first.tolist() == [0, 1, 4]
    expected = key_groups_by_columns([found.columns["k"]], 128, rows=5)
    assert found.key_groups.tolist() == expected[[0, 1, 4]].tolist()


def test_several_or_no_key_columns_are_a_tuple_key() -> None:
    batch = pa.record_batch({"a": [1, 1, 2], "b": ["x", "x", None]})
    keys = GroupKeys(("a", "b"), "op", 128)
    assert keys.state_key == TUPLE_KEY
    found = keys.of(batch, {})
    assert found.keys.equals(tuple_keys_of_columns([batch["a"], batch["b"]]).take([0, 2]))
    assert found.slots.tolist() == [0, 0, 1]
    glob = GroupKeys((), "op", 128).of(batch, {})
    assert glob.keys.to_pylist() == [encode_key(())] and glob.slots.tolist() == [0, 0, 0]


def test_the_hash_edges_key_groups_are_taken_and_widths_follow_the_first_batch() -> None:
    keys = GroupKeys(("k",), "op", 128)
    batch = pa.record_batch(
        [pa.array([7, 7], pa.int32()), pa.array([5, 5], pa.int32())], names=["k", "_kg"]
    )
    found = keys.of(batch, {"k": pa.int64()})
    assert found.columns["k"].type == pa.int64() and found.key_groups.tolist() == [5]
    with pytest.raises(DataError, match="op: key column 'k'"):
        keys.of(pa.record_batch({"k": [2**40]}), {"k": pa.int32()})


def test_key_slots_finds_each_value_among_distinct_keys() -> None:
    assert key_slots(pa.array(["b", None, "a"]), pa.array(["a", "b", None])).tolist() == [1, 2, 0]
