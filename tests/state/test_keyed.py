from __future__ import annotations

import itertools
import operator
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from epochstream.exceptions import ConfigurationError, StateError
from epochstream.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from epochstream.state.handles import KeyedStateHandle
from epochstream.state.keyed import HeapKeyedStateBackend, copy_for_snapshot
from epochstream.state.keygroups import (
    KeyGroupAssigner,
    key_group_for_key,
    key_group_range_for_operator,
)

MAX_P = 128


class Average(AggregateFunction):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, accumulator: tuple[int, int]) -> tuple[int, int]:
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: tuple[int, int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


class Box:
    def __init__(self, items: list[int]) -> None:
        self.items = items


def full_backend() -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(max_parallelism=MAX_P, key_group_range=range(MAX_P))


def test_value_state() -> None:
    backend = full_backend()
    count = backend.get_state(ValueStateDescriptor("count", default=0))
    backend.set_current_key("a")
    assert count.value() == 0
    count.update(5)
    backend.set_current_key("b")
    assert count.value() == 0
    count.update(7)
    backend.set_current_key("a")
    assert count.value() == 5
    count.update(None)  # Flink: update(null) clears
    assert count.value() == 0
    assert backend.keys("count") == ["b"]
    backend.set_current_key("b")
    count.clear()
    assert backend.table("count") == {}


def test_value_state_mutable_default_is_copied_per_key() -> None:
    backend = full_backend()
    state = backend.get_state(ValueStateDescriptor("bag", default=[]))
    backend.set_current_key(1)
    first = state.value()
    first.append("x")
    assert state.value() == []


def test_list_state() -> None:
    backend = full_backend()
    seen = backend.get_state(ListStateDescriptor("seen"))
    backend.set_current_key(("k", 1))
    assert seen.get() == []
    seen.add(1)
    seen.add_all([2, 3])
    seen.add_all([])
    got = seen.get()
    got.append(99)  # get() returns a copy
    assert seen.get() == [1, 2, 3]
    seen.update(["x"])
    assert seen.get() == ["x"]
    seen.update([])
    assert seen.get() == []
    assert backend.table("seen") == {}  # empty lists are not stored
    seen.add_all([])
    assert backend.table("seen") == {}
    seen.add(None)
    assert seen.get() == [None]
    seen.clear()
    assert backend.keys("seen") == []


def test_map_state() -> None:
    backend = full_backend()
    pages = backend.get_state(MapStateDescriptor("pages"))
    backend.set_current_key("u1")
    assert pages.is_empty()
    assert pages.get("/", "none") == "none"
    assert not pages.contains("/")
    pages.put("/", 1)
    pages.put_all({"/a": 2, "/b": 3})
    assert pages.get("/") == 1
    assert pages.contains("/a")
    assert sorted(pages.keys()) == ["/", "/a", "/b"]
    assert sorted(pages.values()) == [1, 2, 3]
    assert sorted(pages.items()) == [("/", 1), ("/a", 2), ("/b", 3)]
    backend.set_current_key("u2")
    assert pages.is_empty()
    assert pages.keys() == []
    backend.set_current_key("u1")
    pages.remove("/")
    pages.remove("/missing")
    assert not pages.is_empty()
    pages.remove("/a")
    pages.remove("/b")
    assert pages.is_empty()
    assert backend.table("pages") == {}  # the emptied dict was dropped
    pages.put("/z", 0)
    pages.clear()
    assert pages.items() == []


def test_reducing_and_aggregating_state() -> None:
    backend = full_backend()
    total = backend.get_state(ReducingStateDescriptor("sum", reduce_fn=operator.add))
    avg = backend.get_state(AggregatingStateDescriptor("avg", aggregate_function=Average()))
    backend.set_current_key("k")
    assert total.get() is None
    assert avg.get() is None
    for v in (2, 4, 9):
        total.add(v)
        avg.add(v)
    assert total.get() == 15
    assert avg.get() == 5.0
    backend.set_current_key("other")
    total.add(1)
    assert total.get() == 1
    backend.set_current_key("k")
    total.clear()
    avg.clear()
    assert total.get() is None
    assert avg.get() is None


def test_state_registration_rules() -> None:
    backend = full_backend()
    first = backend.get_state(ValueStateDescriptor("s"))
    assert backend.get_state(ValueStateDescriptor("s", default=3)) is first
    with pytest.raises(StateError, match=r"ValueStateDescriptor.*ListStateDescriptor"):
        backend.get_state(ListStateDescriptor("s"))
    with pytest.raises(ConfigurationError):
        ValueStateDescriptor("")
    with pytest.raises(ConfigurationError):
        ReducingStateDescriptor("r")
    with pytest.raises(ConfigurationError, match="get_result"):
        AggregatingStateDescriptor("a", aggregate_function=object())  # type: ignore[arg-type]


def test_access_without_current_key_raises() -> None:
    backend = full_backend()
    states = [
        backend.get_state(ValueStateDescriptor("v")),
        backend.get_state(ListStateDescriptor("l")),
        backend.get_state(MapStateDescriptor("m")),
        backend.get_state(ReducingStateDescriptor("r", reduce_fn=operator.add)),
        backend.get_state(AggregatingStateDescriptor("a", aggregate_function=Average())),
    ]
    with pytest.raises(StateError):
        _ = backend.current_key
    for state in states:
        with pytest.raises(StateError, match="no current key"):
            state.clear()
    with pytest.raises(StateError, match="'v'"):
        states[0].value()
    with pytest.raises(StateError):
        states[1].add(1)
    with pytest.raises(StateError):
        states[2].put("a", 1)
    backend.set_current_key(None)  # None is a valid key
    assert backend.current_key is None
    states[0].update(1)
    assert states[0].value() == 1


def test_table_is_the_live_dict() -> None:
    backend = full_backend()
    state = backend.get_state(ValueStateDescriptor("sum"))
    raw = backend.table("sum")
    raw["k"] = 41
    backend.set_current_key("k")
    assert state.value() == 41
    state.update(42)
    assert raw == {"k": 42}
    assert backend.table("fresh") == {}
    assert backend.table("fresh") is backend.table("fresh")


def test_snapshot_is_isolated_from_later_updates_and_in_place_mutation() -> None:
    backend = full_backend()
    value = backend.get_state(ValueStateDescriptor("value"))
    box = backend.get_state(ValueStateDescriptor("box"))
    nested = backend.get_state(ValueStateDescriptor("nested"))
    lists = backend.get_state(ListStateDescriptor("list"))
    maps = backend.get_state(MapStateDescriptor("map"))
    backend.set_current_key("k")
    value.update(1)
    box.update(Box([1]))
    nested.update((1, [2]))
    lists.add_all([1, 2])
    maps.put("a", [1])
    maps.put("b", 2)

    snap = backend.snapshot()
    assert snap.entry_count == 5
    assert not snap.is_empty

    value.update(2)
    box.value().items.append(2)
    nested.value()[1].append(3)
    lists.add(3)  # in place: appends to the stored list
    maps.put("c", 3)  # in place: the stored dict
    maps.get("a").append(9)  # in place: a list inside the map
    backend.set_current_key("new")
    value.update(100)

    assert snap.tables["value"] == {"k": 1}
    assert snap.tables["box"]["k"].items == [1]
    assert snap.tables["nested"] == {"k": (1, [2])}
    assert snap.tables["list"] == {"k": [1, 2]}
    assert snap.tables["map"] == {"k": {"a": [1], "b": 2}}


def test_copy_for_snapshot_shares_only_immutables() -> None:
    atomic = ("a", 1, 2.5, None)
    assert copy_for_snapshot(atomic) is atomic
    items = [1, 2]
    assert copy_for_snapshot(items) == items
    assert copy_for_snapshot(items) is not items
    shared = [1]
    memo: dict[int, Any] = {}
    a = copy_for_snapshot([shared], memo)
    b = copy_for_snapshot([shared], memo)
    assert a[0] is b[0]  # aliasing inside one snapshot is kept
    assert a[0] is not shared


def test_write_and_restore_round_trip(tmp_path: Path) -> None:
    backend = full_backend()
    value = backend.get_state(ValueStateDescriptor("value"))
    lists = backend.get_state(ListStateDescriptor("list"))
    maps = backend.get_state(MapStateDescriptor("map"))
    avg = backend.get_state(AggregatingStateDescriptor("avg", aggregate_function=Average()))
    keys: list[object] = [f"k{i}" for i in range(200)] + [("t", 1), None, 7, b"b"]
    for i, key in enumerate(keys):
        backend.set_current_key(key)
        value.update(i)
        lists.add_all([i, str(key)])
        maps.put("i", Box([i]))
        avg.add(i)
    snap = backend.snapshot()
    result: list[KeyedStateHandle | None] = []
    writer = threading.Thread(target=lambda: result.append(snap.write(str(tmp_path), "a.kst")))
    writer.start()
    writer.join()
    handle = result[0]
    assert handle is not None
    assert handle.path == "a.kst"
    assert handle.size == os.path.getsize(tmp_path / "a.kst")
    expected_groups = {key_group_for_key(k, MAX_P) for k in keys}
    assert set(handle.key_groups) == expected_groups
    spans = sorted(handle.key_groups.values())
    assert spans[0][0] == 0
    for (off, length), (next_off, _) in itertools.pairwise(spans):
        assert off + length == next_off  # contiguous, in key-group order

    restored = full_backend()
    restored.restore([handle.resolve(str(tmp_path))])
    r_value = restored.get_state(ValueStateDescriptor("value"))
    r_lists = restored.get_state(ListStateDescriptor("list"))
    r_maps = restored.get_state(MapStateDescriptor("map"))
    r_avg = restored.get_state(AggregatingStateDescriptor("avg", aggregate_function=Average()))
    for i, key in enumerate(keys):
        restored.set_current_key(key)
        assert r_value.value() == i
        assert r_lists.get() == [i, str(key)]
        assert r_maps.get("i").items == [i]
        assert r_avg.get() == float(i)
    assert sorted(map(repr, restored.keys("value"))) == sorted(map(repr, keys))


def test_empty_snapshot_writes_nothing(tmp_path: Path) -> None:
    backend = full_backend()
    backend.get_state(ListStateDescriptor("l"))
    snap = backend.snapshot()
    assert snap.is_empty
    assert snap.entry_count == 0
    assert snap.write(str(tmp_path), "none.kst") is None
    assert not (tmp_path / "none.kst").exists()


def _one_key_handle(tmp_path: Path) -> tuple[KeyedStateHandle, int]:
    backend = full_backend()
    state = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key("only")
    state.update("payload" * 10)
    handle = backend.snapshot().write(str(tmp_path), "one.kst")
    assert handle is not None
    return handle.resolve(str(tmp_path)), key_group_for_key("only", MAX_P)


def test_truncated_file_names_file_and_key_group(tmp_path: Path) -> None:
    handle, kg = _one_key_handle(tmp_path)
    with open(handle.path, "r+b") as f:
        f.truncate(handle.size - 5)
    with pytest.raises(StateError, match=rf"one\.kst, key group {kg} at offset 0.*truncated"):
        full_backend().restore([handle])


def test_corrupt_file_is_detected(tmp_path: Path) -> None:
    handle, kg = _one_key_handle(tmp_path)
    data = bytearray(Path(handle.path).read_bytes())
    data[-3] ^= 0xFF
    Path(handle.path).write_bytes(bytes(data))
    with pytest.raises(StateError, match=rf"one\.kst, key group {kg}.*checksum"):
        full_backend().restore([handle])
    data[0:4] = b"XXXX"
    Path(handle.path).write_bytes(bytes(data))
    with pytest.raises(StateError, match="bad segment header"):
        full_backend().restore([handle])


def test_missing_file_and_relative_handle(tmp_path: Path) -> None:
    missing = KeyedStateHandle(path=str(tmp_path / "gone.kst"), key_groups={0: (0, 20)}, size=20)
    with pytest.raises(StateError, match=r"gone\.kst"):
        full_backend().restore([missing])
    relative = KeyedStateHandle(path="rel.kst", key_groups={0: (0, 20)}, size=20)
    with pytest.raises(StateError, match="not absolute"):
        full_backend().restore([relative])


def test_key_outside_range_fails_the_write(tmp_path: Path) -> None:
    rng = key_group_range_for_operator(MAX_P, 2, 0)
    backend = HeapKeyedStateBackend(max_parallelism=MAX_P, key_group_range=rng)
    state = backend.get_state(ValueStateDescriptor("v"))
    foreign = next(f"k{i}" for i in range(1000) if key_group_for_key(f"k{i}", MAX_P) not in rng)
    backend.set_current_key(foreign)
    state.update(1)
    with pytest.raises(StateError, match=f"{foreign}.*outside this backend's range 0..63"):
        backend.snapshot().write(str(tmp_path), "bad.kst")


def test_backend_validates_arguments() -> None:
    with pytest.raises(StateError):
        HeapKeyedStateBackend(max_parallelism=128, key_group_range=range(0, 129))
    with pytest.raises(StateError, match="assigner"):
        HeapKeyedStateBackend(
            max_parallelism=128, key_group_range=range(128), assigner=KeyGroupAssigner(256)
        )


def _fill_at_parallelism_two(tmp_path: Path) -> tuple[list[KeyedStateHandle], dict[object, int]]:
    assigner = KeyGroupAssigner(MAX_P)
    backends = [
        HeapKeyedStateBackend(
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, 2, i),
            assigner=assigner,
        )
        for i in range(2)
    ]
    expected: dict[object, int] = {}
    keys: list[object] = [f"user-{i}" for i in range(500)] + list(range(300)) + [("pair", 1)]
    for n, key in enumerate(keys):
        backend = backends[assigner.channel(key, 2)]
        backend.set_current_key(key)
        backend.get_state(ValueStateDescriptor("v")).update(n)
        backend.get_state(ListStateDescriptor("l")).add(n)
        expected[key] = n
    handles = []
    for i, backend in enumerate(backends):
        handle = backend.snapshot().write(str(tmp_path), f"op-{i}.kst")
        assert handle is not None
        handles.append(handle.resolve(str(tmp_path)))
    return handles, expected


@pytest.mark.parametrize("new_parallelism", [3, 1, 2, 5])
def test_rescale_restores_every_key_in_its_owner(tmp_path: Path, new_parallelism: int) -> None:
    handles, expected = _fill_at_parallelism_two(tmp_path)
    seen: dict[object, int] = {}
    for i in range(new_parallelism):
        rng = key_group_range_for_operator(MAX_P, new_parallelism, i)
        restricted = [r for r in (h.restricted_to(rng) for h in handles) if r is not None]
        backend = HeapKeyedStateBackend(max_parallelism=MAX_P, key_group_range=rng)
        backend.restore(restricted)
        value = backend.get_state(ValueStateDescriptor("v"))
        lists = backend.get_state(ListStateDescriptor("l"))
        for key in backend.keys("v"):
            assert key_group_for_key(key, MAX_P) in rng
            assert key not in seen
            backend.set_current_key(key)
            seen[key] = value.value()
            assert lists.get() == [expected[key]]
        assert set(backend.keys("l")) == set(backend.keys("v"))
    assert seen == expected


def test_restore_ignores_key_groups_outside_the_range(tmp_path: Path) -> None:
    handles, expected = _fill_at_parallelism_two(tmp_path)
    rng = key_group_range_for_operator(MAX_P, 4, 3)
    backend = HeapKeyedStateBackend(max_parallelism=MAX_P, key_group_range=rng)
    backend.restore(handles)  # unrestricted handles: the backend filters itself
    owned = {k for k in expected if key_group_for_key(k, MAX_P) in rng}
    assert owned
    assert set(backend.keys("v")) == owned
