from __future__ import annotations

import pytest

from epochstream.exceptions import StateError
from epochstream.state.operator import OperatorStateStore


def test_list_state_operations() -> None:
    store = OperatorStateStore()
    state = store.get_list_state("offsets")
    assert store.get_list_state("offsets") is state
    assert state.get() == []
    state.add(1)
    state.add_all([2, 3])
    got = state.get()
    got.append(99)  # a copy
    assert state.get() == [1, 2, 3]
    state.update(iter(["a", "b"]))
    assert state.get() == ["a", "b"]
    state.clear()
    assert state.get() == []
    assert not state.union


def test_list_and_union_names_cannot_mix() -> None:
    store = OperatorStateStore()
    store.get_list_state("a")
    store.get_union_list_state("b")
    with pytest.raises(StateError, match="'a' is list state, cannot use it as union"):
        store.get_union_list_state("a")
    with pytest.raises(StateError, match="'b' is union list state"):
        store.get_list_state("b")
    with pytest.raises(StateError):
        store.get_list_state("")


def test_snapshot_copies_and_skips_empty_lists() -> None:
    store = OperatorStateStore()
    offsets = store.get_list_state("offsets")
    splits = store.get_union_list_state("splits")
    store.get_list_state("empty")
    offsets.add({"split": "s0", "offset": 5})
    splits.add_all(["s0", "s1"])
    lists, unions = store.snapshot()
    assert lists == {"offsets": [{"split": "s0", "offset": 5}]}
    assert unions == {"splits": ["s0", "s1"]}

    offsets.get()[0]["offset"] = 6  # in-place mutation of an element
    offsets.add({"split": "s1", "offset": 0})
    splits.clear()
    assert lists == {"offsets": [{"split": "s0", "offset": 5}]}
    assert unions == {"splits": ["s0", "s1"]}


def test_restore_before_and_after_registration() -> None:
    store = OperatorStateStore()
    early = store.get_list_state("early")
    early.add("stale")
    store.restore({"early": [1, 2], "late": [3]}, {"u": ["x"]})
    assert early.get() == [1, 2]  # replaced, same object
    assert store.get_list_state("late").get() == [3]
    assert store.get_union_list_state("u").get() == ["x"]
    lists, unions = store.snapshot()
    assert lists == {"early": [1, 2], "late": [3]}
    assert unions == {"u": ["x"]}


def test_restore_rejects_conflicting_kinds() -> None:
    store = OperatorStateStore()
    with pytest.raises(StateError, match="both"):
        store.restore({"s": [1]}, {"s": [2]})
    store.get_union_list_state("u")
    with pytest.raises(StateError, match="'u' is union list state"):
        store.restore({"u": [1]}, {})
