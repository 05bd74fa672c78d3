from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.core.state_descriptors import MapStateDescriptor, ValueStateDescriptor
from epochstream.exceptions import ConfigurationError, StateError
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapKeyedStateBackend
from epochstream.state.handles import HeapSnapshotHandle, HeapStateFile, OperatorSubtaskState
from epochstream.state.keygroups import (
    KeyGroupAssigner,
    key_group_for_key,
    key_group_range_for_operator,
)
from epochstream.state.operator import OperatorStateStore
from epochstream.state.redistribute import (
    build_restores,
    merge_union_lists,
    redistribute_operator_lists,
)

MAX_P = 128


def test_same_parallelism_keeps_each_subtasks_lists() -> None:
    old: list[dict[str, list[Any]]] = [{"s": [1, 2, 3]}, {"s": [4], "t": ["x"]}]
    result = redistribute_operator_lists(old, 2)
    assert result == [{"s": [1, 2, 3]}, {"s": [4], "t": ["x"]}]
    result[0]["s"].append(99)
    assert old[0]["s"] == [1, 2, 3]  # copies


def test_round_robin_over_concatenation() -> None:
    old: list[dict[str, list[Any]]] = [{"s": [1, 2, 3]}, {"s": [4, 5], "t": ["x", "y"]}]
    assert redistribute_operator_lists(old, 3) == [
        {"s": [1, 4], "t": ["x"]},
        {"s": [2, 5], "t": ["y"]},
        {"s": [3]},
    ]
    assert redistribute_operator_lists(old, 1) == [{"s": [1, 2, 3, 4, 5], "t": ["x", "y"]}]
    single: list[dict[str, list[Any]]] = [{"s": [1]}]
    assert redistribute_operator_lists(single, 4) == [{"s": [1]}, {}, {}, {}]
    with pytest.raises(ConfigurationError):
        redistribute_operator_lists(old, 0)


def test_redistribution_loses_and_duplicates_nothing() -> None:
    old: list[dict[str, list[Any]]] = [{"s": list(range(i * 10, i * 10 + i))} for i in range(5)]
    every = [x for lists in old for x in lists["s"]]
    for p in range(1, 9):
        parts = redistribute_operator_lists(old, p)
        assert len(parts) == p
        got = sorted(x for part in parts for x in part.get("s", []))
        assert got == every
        sizes = [len(part.get("s", [])) for part in parts]
        assert max(sizes) - min(sizes) <= 1 or p == 5  # p == 5 keeps the old split


def test_merge_union_lists() -> None:
    assert merge_union_lists([{"u": [1]}, {}, {"u": [2, 3], "v": ["a"]}]) == {
        "u": [1, 2, 3],
        "v": ["a"],
    }
    assert merge_union_lists([]) == {}


def _heap(rng: range, index: int = 0) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(
        KeyedBackendContext(
            operator_uid="op",
            subtask=index,
            max_parallelism=MAX_P,
            key_group_range=rng,
            clock=ManualClock(),
            local_dir="",
        )
    )


def _snapshot_subtask(
    index: int, parallelism: int, keys: list[str], tmp_path: Path, assigner: KeyGroupAssigner
) -> OperatorSubtaskState:
    rng = key_group_range_for_operator(MAX_P, parallelism, index)
    backend = _heap(rng, index)
    count = backend.get_state(ValueStateDescriptor("count"))
    tags = backend.get_state(MapStateDescriptor("tags"))
    for key in keys:
        if assigner.channel(key, parallelism) == index:
            backend.set_current_key(key)
            count.update(len(key))
            tags.put("owner", index)
    target = SnapshotTarget(
        fs=storage_fs(str(tmp_path)),
        checkpoint_id=1,
        directory=str(tmp_path),
        shared_dir=None,
        name=f"op-{index}",
    )
    handle = backend.snapshot(target).run()
    store = OperatorStateStore()
    store.get_list_state("offsets").add_all([f"o{index}-{j}" for j in range(index + 2)])
    store.get_union_list_state("splits").add(f"split-{index}")
    lists, unions = store.snapshot()
    return OperatorSubtaskState(keyed=handle, operator_lists=lists, union_lists=unions)


@pytest.mark.parametrize("new_parallelism", [1, 2, 3, 4])
def test_build_restores_with_real_files(tmp_path: Path, new_parallelism: int) -> None:
    assigner = KeyGroupAssigner(MAX_P)
    keys = [f"key-{i}" * (i % 3 + 1) for i in range(400)]
    states = {i: _snapshot_subtask(i, 2, keys, tmp_path, assigner) for i in range(2)}
    restores = build_restores(
        states,
        old_parallelism=2,
        new_parallelism=new_parallelism,
        max_parallelism=MAX_P,
    )
    assert len(restores) == new_parallelism
    restored_keys: list[str] = []
    all_offsets: list[Any] = []
    for i, restore in enumerate(restores):
        rng = key_group_range_for_operator(MAX_P, new_parallelism, i)
        for handle in restore.keyed:
            assert all(Path(p).is_absolute() for p in handle.files())
            segments = {kg for f in handle.chain for kg in f.segments}
            assert segments and segments <= set(rng)  # no empty handles, nothing foreign
        assert restore.union_lists == {"splits": ["split-0", "split-1"]}
        all_offsets.extend(restore.operator_lists.get("offsets", []))

        backend = _heap(rng, i)
        backend.restore(restore.keyed, checkpoint_id=1, owned=restore.owned)
        count = backend.get_state(ValueStateDescriptor("count"))
        tags = backend.get_state(MapStateDescriptor("tags"))
        for key in backend.keys("count"):
            assert key_group_for_key(key, MAX_P) in rng
            backend.set_current_key(key)
            assert count.value() == len(key)
            assert tags.get("owner") == assigner.channel(key, 2)
        restored_keys.extend(backend.keys("count"))

        store = OperatorStateStore()
        store.restore(restore.operator_lists, restore.union_lists)
        assert store.get_union_list_state("splits").get() == ["split-0", "split-1"]
    assert sorted(restored_keys) == sorted(keys)
    assert sorted(all_offsets) == sorted(["o0-0", "o0-1", "o1-0", "o1-1", "o1-2"])
    # union lists are independent copies per subtask
    restores[0].union_lists["splits"].append("mutated")
    if new_parallelism > 1:
        assert restores[1].union_lists["splits"] == ["split-0", "split-1"]


def test_handles_without_overlap_are_dropped(tmp_path: Path) -> None:
    assigner = KeyGroupAssigner(MAX_P)
    keys = [f"k{i}" for i in range(300)]
    states = {i: _snapshot_subtask(i, 2, keys, tmp_path, assigner) for i in range(2)}
    restores = build_restores(
        states,
        old_parallelism=2,
        new_parallelism=4,
        max_parallelism=MAX_P,
    )
    # new subtasks 0-1 own groups 0..63 (old subtask 0); 2-3 own 64..127 (old subtask 1)
    assert [[Path(h.files()[0]).name for h in r.keyed] for r in restores] == [
        ["op-0.kst"],
        ["op-0.kst"],
        ["op-1.kst"],
        ["op-1.kst"],
    ]


def test_missing_subtasks_mean_empty(tmp_path: Path) -> None:
    assigner = KeyGroupAssigner(MAX_P)
    keys = [f"k{i}" for i in range(100)]
    states = {1: _snapshot_subtask(1, 3, keys, tmp_path, assigner)}
    restores = build_restores(
        states,
        old_parallelism=3,
        new_parallelism=3,
        max_parallelism=MAX_P,
    )
    assert restores[0].keyed == [] and restores[0].operator_lists == {}
    assert restores[2].keyed == [] and restores[2].operator_lists == {}
    assert [Path(h.files()[0]).name for h in restores[1].keyed] == ["op-1.kst"]
    assert restores[1].operator_lists == {"offsets": ["o1-0", "o1-1", "o1-2"]}
    assert all(r.union_lists == {"splits": ["split-1"]} for r in restores)
    assert (
        build_restores({}, old_parallelism=2, new_parallelism=1, max_parallelism=MAX_P)[0].keyed
        == []
    )


def test_build_restores_rejects_inconsistent_input(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="subtask 2"):
        build_restores(
            {2: OperatorSubtaskState()},
            old_parallelism=2,
            new_parallelism=2,
            max_parallelism=MAX_P,
        )
    wide = HeapSnapshotHandle(
        range(0, 256), (HeapStateFile("/x/op-0.kst", True, {200: (0, 10)}, 10),)
    )
    with pytest.raises(StateError, match=r"old subtask 0.*0\.\.255.*max_parallelism 128"):
        build_restores(
            {0: OperatorSubtaskState(keyed=wide)},
            old_parallelism=1,
            new_parallelism=1,
            max_parallelism=MAX_P,
        )
    with pytest.raises(ConfigurationError):
        build_restores(
            {},
            old_parallelism=1,
            new_parallelism=129,
            max_parallelism=MAX_P,
        )
