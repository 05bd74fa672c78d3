"""KeyGroupSpill: rows in any order in, one canonical file per key-group range out,
one record batch per key group, a key's rows in input order, under a memory budget."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pyarrow as pa
import pytest

from epochstream.checkpoint.keygroup_spill import CANONICAL_SCHEMA, KeyGroupSpill
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import StateError
from epochstream.state.canonical import StateMeta, read_batches
from epochstream.state.keyformat import encode_key
from epochstream.state.keygroups import key_group_for_key

MAX_P = 32


def _batch(state: str, pairs: list[tuple[str, int]]) -> pa.RecordBatch:
    n = len(pairs)
    return pa.record_batch(
        [
            pa.array([state] * n),
            pa.array([key_group_for_key(k, MAX_P) for k, _ in pairs], pa.int32()),
            pa.array([encode_key(k) for k, _ in pairs], pa.binary()),
            pa.array([None] * n, pa.binary()),
            pa.array([None] * n, pa.binary()),
            pa.array([str(v).encode() for _, v in pairs], pa.binary()),
            pa.array([None] * n, pa.float64()),
        ],
        schema=CANONICAL_SCHEMA,
    )


@pytest.mark.parametrize("budget", [1 << 30, 1])
def test_rows_come_out_grouped_in_input_order_under_any_budget(tmp_path: Path, budget: int) -> None:
    rng = random.Random(7)
    keys = [f"k{i}" for i in range(50)]
    pairs = [(rng.choice(keys), i) for i in range(2_000)]
    ranges = [range(0, 10), range(10, 32)]
    fs = storage_fs(str(tmp_path))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with KeyGroupSpill(
        uid="op",
        states={"l": StateMeta("list")},
        ranges=ranges,
        memory_budget=budget,
        scratch_dir=str(scratch),
    ) as spill:
        for start in range(0, len(pairs), 128):
            spill.add(_batch("l", pairs[start : start + 128]))
        assert os.listdir(scratch)  # the rows wait there
        handles = spill.write(fs, str(tmp_path), "op")
    assert os.listdir(scratch) == []
    assert [h.key_groups for h in handles] == ranges
    got: dict[bytes, list[int]] = {}
    for handle in handles:
        previous = -1
        for kg, batch in read_batches(fs, handle, handle.key_groups):
            assert kg in handle.key_groups and kg > previous  # one batch per key group, ascending
            previous = kg
            assert set(batch.column("key_group").to_pylist()) == {kg}
            for key, value in zip(
                batch["key"].to_pylist(), batch["value"].to_pylist(), strict=True
            ):
                got.setdefault(key, []).append(int(value))
    expected: dict[bytes, list[int]] = {}
    for k, v in pairs:
        expected.setdefault(encode_key(k), []).append(v)
    assert got == expected


def test_repeated_value_keys_and_undeclared_states_are_refused(tmp_path: Path) -> None:
    fs = storage_fs(str(tmp_path))
    with KeyGroupSpill(
        uid="op", states={"v": StateMeta("value")}, ranges=[range(0, MAX_P)]
    ) as spill:
        with pytest.raises(StateError, match=r"operator 'op': rows of states \['x'\]"):
            spill.add(_batch("x", [("a", 1)]))
        spill.add(_batch("v", [("a", 1), ("b", 2)]))
        spill.add(_batch("v", [("a", 3)]))
        with pytest.raises(StateError, match=r"'op', value state 'v': key 'a' appears more"):
            spill.write(fs, str(tmp_path), "op")
