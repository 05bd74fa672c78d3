"""Heap-backend specifics: the synchronous part of a snapshot copies only what changed,
incremental chains stay bounded, and files are shared between checkpoints."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from epochstream.core.state_descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from epochstream.exceptions import StateError
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.heap.files import DELETED
from epochstream.state.backends.heap.states import UNTRACKED_MIN_KEYS
from epochstream.state.handles import HeapSnapshotHandle

from ..conftest import Harness

SUMS = ValueStateDescriptor("_sum")


def _harness(tmp_path: Any, **config: Any) -> Harness:
    h = Harness("heap", tmp_path)
    h.config = HeapStateBackend(**config)
    return h


def _write(backend: Any, keys: range, value: int) -> None:
    table = backend.value_table(SUMS)
    for k in keys:
        table[k] = (k, value)
    table.touched(keys)


def _complete_checkpoint(h: Harness, backend: Any, checkpoint_id: int) -> None:
    """Take snapshot ``checkpoint_id`` (no base), write it and mark it completed."""
    backend.snapshot(h.target(checkpoint_id)).run()
    backend.notify_checkpoint_complete(checkpoint_id)


def _restored_sums(h: Harness, handle: Any, checkpoint_id: int) -> dict[Any, Any]:
    """The ``SUMS`` entries of a new backend restored from ``handle``."""
    restored = h.backend()
    restored.restore([handle], checkpoint_id=checkpoint_id, owned=True)
    return dict(restored.value_table(SUMS).items())


def test_synchronous_part_copies_only_changed_entries(tmp_path: Any) -> None:
    h = _harness(tmp_path)
    backend = h.backend()
    _write(backend, range(10_000), 1)
    first = backend.snapshot(h.target(1))
    # The whole state changed: pickled at the barrier, nothing copied for later.
    assert first.encoded is not None and first.delta == {}  # type: ignore[attr-defined]
    first.run()
    backend.notify_checkpoint_complete(1)
    _write(backend, range(100), 2)
    second = backend.snapshot(h.target(2, base=1))
    assert sum(len(e) for e in second.delta.values()) == 100  # type: ignore[attr-defined]


def test_unconfirmed_changes_are_carried_until_a_checkpoint_completes(tmp_path: Any) -> None:
    h = _harness(tmp_path)
    backend = h.backend()
    _write(backend, range(50), 1)
    base = backend.snapshot(h.target(1))
    base.run()
    backend.notify_checkpoint_complete(1)
    _write(backend, range(10), 2)
    backend.snapshot(h.target(2, base=1)).run()  # checkpoint 2 is never completed
    _write(backend, range(10, 20), 3)
    third = backend.snapshot(h.target(3, base=1))
    assert set(third.delta["_sum"]) == set(range(20))  # type: ignore[attr-defined]
    values = _restored_sums(h, third.run(), 3)
    assert [values[k][1] for k in (0, 15, 30)] == [2, 3, 1]


def test_table_stops_tracking_when_most_keys_change_and_deltas_stay_exact(tmp_path: Any) -> None:
    n = 2 * UNTRACKED_MIN_KEYS
    h = _harness(tmp_path)
    backend = h.backend()
    other = ValueStateDescriptor("other")
    _write(backend, range(n), 1)
    backend.value_table(other)[7] = "kept"
    backend.value_table(other).touched([7])
    _complete_checkpoint(h, backend, 1)

    table = backend.value_table(SUMS)
    _write(backend, range(n // 2), 2)
    assert not backend._tables["_sum"].all_dirty  # half the keys: still tracked
    _write(backend, range(n // 2, n // 2 + 10), 2)
    assert backend._tables["_sum"].all_dirty
    _write(backend, range(n // 2 + 10, n - 10), 2)
    assert len(backend._tables["_sum"].dirty) == n // 2 + 10, "writes stop being recorded"
    table.delete(5)
    table.delete(n - 1)  # deletions are recorded even so
    second = backend.snapshot(h.target(2, base=1))
    assert not second.complete  # type: ignore[attr-defined]  # "other" did not change
    entries = second.delta["_sum"]  # type: ignore[attr-defined]
    assert len(entries) == n and entries[5] is DELETED and entries[n - 1] is DELETED
    handle = second.run()
    assert isinstance(handle, HeapSnapshotHandle) and len(handle.chain) == 2  # a delta

    restored = h.backend()
    restored.restore([handle], checkpoint_id=2, owned=True)
    values = dict(restored.value_table(SUMS).items())
    assert len(values) == n - 2 and 5 not in values and n - 1 not in values
    assert values[n - 20] == (n - 20, 2) and values[n - 5] == (n - 5, 1)
    assert dict(restored.value_table(other).items()) == {7: "kept"}
    assert not backend._tables["_sum"].all_dirty, "the snapshot starts tracking again"


def test_small_tables_keep_tracking_so_snapshots_stay_deltas(tmp_path: Any) -> None:
    h = _harness(tmp_path)
    backend = h.backend()
    _write(backend, range(100), 1)
    _complete_checkpoint(h, backend, 1)
    _write(backend, range(90), 2)
    assert not backend._tables["_sum"].all_dirty
    second = backend.snapshot(h.target(2, base=1))
    assert set(second.delta["_sum"]) == set(range(90))  # type: ignore[attr-defined]


def test_an_unconfirmed_whole_table_snapshot_is_carried(tmp_path: Any) -> None:
    n = 2 * UNTRACKED_MIN_KEYS
    h = _harness(tmp_path)
    backend = h.backend()
    other = backend.value_table(ValueStateDescriptor("other"))
    other[0] = 0
    other.touched([0])
    _write(backend, range(n), 1)
    _complete_checkpoint(h, backend, 1)
    _write(backend, range(n - 10), 2)  # most keys: the table stops tracking
    assert backend._tables["_sum"].all_dirty
    backend.snapshot(h.target(2, base=1)).run()  # never completes
    _write(backend, range(3), 3)
    third = backend.snapshot(h.target(3, base=1))
    assert set(third.delta["_sum"]) == set(range(n))  # type: ignore[attr-defined]
    restored = h.backend()
    restored.restore([third.run()], checkpoint_id=3, owned=True)
    values = dict(restored.value_table(SUMS).items())
    assert [values[k][1] for k in (0, n // 2, n - 1)] == [3, 2, 1]


def test_incremental_chain_is_shared_and_bounded(tmp_path: Any) -> None:
    h = _harness(tmp_path, max_chain=3)
    backend = h.backend()
    _write(backend, range(1_000), 0)
    chains = []
    for n in range(1, 9):
        _write(backend, range(n), n)
        handle = backend.snapshot(h.target(n, base=n - 1 if n > 1 else None)).run()
        backend.notify_checkpoint_complete(n)
        assert isinstance(handle, HeapSnapshotHandle)
        chains.append(handle.chain)
    assert all(len(chain) <= 3 for chain in chains)
    assert chains[1][0] == chains[0][0], "the second checkpoint reuses the first's full file"
    assert any(len(chain) == 1 for chain in chains[2:]), "a long chain is materialized"
    assert all(f.shared for chain in chains for f in chain)


def test_full_mode_writes_one_private_file_per_checkpoint(tmp_path: Any) -> None:
    h = _harness(tmp_path, incremental=False)
    backend = h.backend()
    for n in range(1, 4):
        _write(backend, range(100), n)
        handle = backend.snapshot(h.target(n, base=n - 1 if n > 1 else None)).run()
        backend.notify_checkpoint_complete(n)
        assert isinstance(handle, HeapSnapshotHandle) and len(handle.chain) == 1
        assert not handle.chain[0].shared and f"chk-{n}" in handle.chain[0].path


def test_restored_list_state_takes_the_new_ttl_setting(tmp_path: Any) -> None:
    h = _harness(tmp_path)
    backend = h.backend()
    plain = backend.get_state(ListStateDescriptor("l"))
    backend.set_current_key("k")
    plain.add("a")
    handle = backend.snapshot(h.target(1)).run()
    restored = h.backend()
    restored.restore([handle], checkpoint_id=1, owned=False)
    restored.set_current_key("k")
    timed = restored.get_state(ListStateDescriptor("l", ttl=5.0))
    assert timed.get() == ["a"]
    h.clock.advance(6)
    assert timed.get() == []


def test_list_and_map_snapshots_copy_containers_not_elements(tmp_path: Any) -> None:
    h = _harness(tmp_path)
    backend = h.backend()
    _write(backend, range(5), 1)  # unchanged below: the snapshot is a delta, copied
    _complete_checkpoint(h, backend, 1)
    events = backend.get_state(ListStateDescriptor("events"))
    people = backend.get_state(MapStateDescriptor("people"))
    for k in range(3):
        backend.set_current_key(k)
        events.add({"id": k, "tags": ["a"]})
        people.put(f"p{k}", {"name": "x", "ids": [k]})
    job = backend.snapshot(h.target(2, base=1))
    stored = backend._tables["events"].data[0]
    # The container is copied (appends after the barrier must not reach the snapshot),
    # its elements shared: the backend never changes one in place.
    assert job.delta["events"][0] is not stored  # type: ignore[attr-defined]
    assert job.delta["events"][0][0] is stored[0]  # type: ignore[attr-defined]
    for k in range(3):  # after the barrier: appends, puts, and changes to what reads return
        backend.set_current_key(k)
        events.add({"id": 100 + k})
        events.get()[0]["tags"].append("changed")
        people.get(f"p{k}")["ids"].append(-1)
        people.put(f"p{k}", {"name": "y"})
        people.put("new", {"name": "z"})
    handle = job.run()
    restored = h.backend()
    restored.restore([handle], checkpoint_id=2, owned=True)
    r_events = restored.get_state(ListStateDescriptor("events"))
    r_people = restored.get_state(MapStateDescriptor("people"))
    for k in range(3):
        restored.set_current_key(k)
        assert r_events.get() == [{"id": k, "tags": ["a"]}]
        assert r_people.items() == [(f"p{k}", {"name": "x", "ids": [k]})]


def test_a_key_outside_the_subtasks_key_groups_fails_the_snapshot_with_its_name(
    tmp_path: Any,
) -> None:
    h = _harness(tmp_path)
    backend = h.backend(parallelism=2, subtask=0)  # key groups 0..63 of 128
    assigner = backend.assigner
    ours = [k for k in range(20_000) if assigner.key_group(k) < 64][:5_000]
    stray = next(k for k in range(20_000) if assigner.key_group(k) >= 64)
    table = backend.value_table(SUMS)
    for k in ours:
        table[k] = (k, 1)
    table[stray] = (stray, 1)  # after two chunks of owned keys
    table.touched([*ours, stray])
    with pytest.raises(
        StateError, match=rf"key {stray} is in key group {assigner.key_group(stray)}, outside"
    ):
        backend.snapshot(h.target(1)).run()
    del table[stray]
    table.touched([stray])
    assert backend.snapshot(h.target(2)).run() is not None


def test_a_namespaced_entry_of_a_key_outside_the_key_groups_is_named_too(tmp_path: Any) -> None:
    h = _harness(tmp_path)
    backend = h.backend(parallelism=2, subtask=0)  # key groups 0..63 of 128
    assigner = backend.assigner
    ours = [k for k in range(20_000) if assigner.key_group(k) < 64][:3_000]
    stray = next(k for k in range(20_000) if assigner.key_group(k) >= 64)
    contents = backend.get_namespaced_state(ValueStateDescriptor("contents"))
    for k in [*ours, stray]:  # the stray key's entry comes in the second chunk
        backend.set_current_key(k)
        contents.set_namespace(("window", k % 3))
        contents.update(k)
    with pytest.raises(StateError, match=rf"state 'contents': key {stray} is in key group"):
        backend.snapshot(h.target(1)).run()


def test_a_whole_state_snapshot_is_pickled_at_the_barrier(tmp_path: Any) -> None:
    """Writes after the barrier do not reach it; the snapshot thread only writes the file."""
    h = _harness(tmp_path)
    backend = h.backend()
    _write(backend, range(5_000), 1)
    _complete_checkpoint(h, backend, 1)
    _write(backend, range(5_000), 2)  # every key changed: the delta is the whole state
    job = backend.snapshot(h.target(2, base=1))
    assert job.complete and job.encoded is not None  # type: ignore[attr-defined]
    assert job.delta == {}, "no copy of the state is kept for the snapshot thread"  # type: ignore[attr-defined]
    _write(backend, range(10), 3)  # after the barrier
    backend.value_table(SUMS).delete(11)
    backend.value_table(SUMS).touched([11])
    handle = job.run()
    assert (
        isinstance(handle, HeapSnapshotHandle) and len(handle.chain) == 1 and handle.chain[0].full
    )
    assert _restored_sums(h, handle, 2) == {k: (k, 2) for k in range(5_000)}


def test_snapshots_with_a_ttl_or_for_a_savepoint_are_not_pickled_at_the_barrier(
    tmp_path: Any,
) -> None:
    h = _harness(tmp_path)
    backend = h.backend()
    ttl = backend.get_state(ValueStateDescriptor("seen", ttl=timedelta(seconds=5)))
    backend.set_current_key(1)
    ttl.update("x")
    job = backend.snapshot(h.target(1))
    assert job.complete and job.encoded is None  # type: ignore[attr-defined]
    h.clock.advance(10.0)  # expired by the time the snapshot thread writes it
    assert job.run() is None, "expired entries are dropped when the snapshot is written"

    plain = h.backend()
    _write(plain, range(100), 1)
    savepoint = plain.snapshot(h.target(2, savepoint="sp"))
    assert savepoint.encoded is None  # type: ignore[attr-defined]
    assert savepoint.run() is not None
