"""KeyIndex (state/key_index.py): dense slots for columnar keys, and which keys are one.

Pure NumPy/Arrow: no job runs.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest

from epochstream.exceptions import DataError
from epochstream.state.key_index import KeyIndex, canonical_float_keys


def test_key_index_switches_to_generic_keys_when_a_null_key_arrives() -> None:
    index = KeyIndex()
    assert index.slots(pa.array([5, 3]))[0].tolist() == [0, 1]
    slots, new = index.slots(pa.array([3, None]))
    assert slots.tolist() == [1, 2] and new.tolist() == [False, True]
    assert index.keys_at(slots).to_pylist() == [3, None]


def test_every_nan_key_finds_one_slot_across_batches() -> None:
    """NaN equals nothing, so a dict lookup of a fresh NaN object never found its slot."""
    index = KeyIndex()
    nan2 = struct.unpack(">d", bytes.fromhex("7ff8000000000001"))[0]
    first, new = index.slots(pa.array([float("nan"), 1.0]))
    assert new.tolist() == [True, True]
    again, new = index.slots(pa.array([nan2, 1.0, -0.0, 0.0]))
    assert again.tolist() == [first[0], first[1], 2, 2] and new.tolist() == [
        False,
        False,
        True,
        False,
    ]
    assert index.size == 3


def test_canonical_float_keys_make_equal_keys_one_arrow_group() -> None:
    nan2 = struct.unpack(">d", bytes.fromhex("7ff8000000000001"))[0]
    keys = pa.array([0.0, -0.0, float("nan"), nan2, None, 2.5], pa.float64())
    table = pa.table({"k": canonical_float_keys(keys), "v": [1] * 6})
    grouped = table.group_by("k").aggregate([("v", "count")]).to_pydict()
    assert sorted(grouped["v_count"]) == [1, 1, 2, 2]
    assert canonical_float_keys(pa.array([-0.0], pa.float32())).to_pylist() == [0.0]
    half = canonical_float_keys(pa.array(np.array([-0.0, np.nan, 1.5], np.float16)))
    assert (
        half.type == pa.float16()
        and np.signbit(half.to_numpy(zero_copy_only=False)).tolist() == [False] * 3
    )
    ints = pa.array([1, 2])
    assert canonical_float_keys(ints) is ints


def test_a_key_type_change_is_bad_data_naming_the_column() -> None:
    index = KeyIndex("sum(v): key column 'k'")
    index.slots(pa.array(["a"]))
    with pytest.raises(
        DataError, match="sum\\(v\\): key column 'k' changed type from string to int64"
    ):
        index.slots(pa.array([1]))
