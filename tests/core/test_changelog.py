"""Changelog batches: row kinds, weights, and the conversions to and from a kind column."""

from __future__ import annotations

import pyarrow as pa
import pytest

from epochstream.core.changelog import (
    OP,
    KindsFromColumn,
    KindsToColumn,
    RowKind,
    is_changelog,
    kind_names,
    weights,
    with_kinds,
)
from epochstream.exceptions import DataError


def test_row_kinds_have_flinks_byte_values_and_short_strings() -> None:
    assert [k.value for k in RowKind] == [0, 1, 2, 3]
    assert [k.short for k in RowKind] == ["+I", "-U", "+U", "-D"]
    assert [k.adds for k in RowKind] == [True, False, True, False]


def test_weights_add_inserts_and_update_afters_and_retract_the_others() -> None:
    plain = pa.record_batch({"k": ["a", "b"]})
    assert not is_changelog(plain.schema) and weights(plain).tolist() == [1, 1]
    changes = with_kinds(pa.record_batch({"k": list("abcd")}), [0, 1, 2, 3])
    assert is_changelog(changes.schema) and changes.schema.field(OP).type == pa.int8()
    assert weights(changes).tolist() == [1, -1, 1, -1]
    assert kind_names(changes.column(OP)).to_pylist() == ["+I", "-U", "+U", "-D"]
    again = with_kinds(changes, [3, 3, 3, 3])  # replaced in place, not appended
    assert again.schema.names == ["k", OP] and weights(again).tolist() == [-1] * 4


def test_a_changelog_goes_to_a_kind_column_and_back() -> None:
    changes = with_kinds(pa.record_batch({"k": ["a", "a"], "n": [1, 2]}), [1, 2])
    plain = KindsToColumn("op")(changes)
    assert plain.to_pylist() == [{"op": "-U", "k": "a", "n": 1}, {"op": "+U", "k": "a", "n": 2}]
    assert KindsFromColumn("op")(plain).equals(changes)
    inserts = KindsToColumn("op")(pa.record_batch({"k": ["x"]}))
    assert inserts.column("op").to_pylist() == ["+I"]


def test_bad_kind_columns_are_named() -> None:
    with pytest.raises(DataError, match=r"row 1 of the batch has 'op' = '\*U'"):
        KindsFromColumn("op")(pa.record_batch({"op": ["+I", "*U"]}))
    with pytest.raises(DataError, match="no column 'op'"):
        KindsFromColumn("op")(pa.record_batch({"k": [1]}))
    with pytest.raises(DataError, match="a column 'k' already"):
        KindsToColumn("k")(pa.record_batch({"k": [1]}))
