"""The keyed-state backend contract: every backend passes the same tests.

Semantics of each state kind, copy semantics of values, registration rules, the batch
value table, snapshots and restores (incremental chains, savepoints, rescaling), TTL,
and corrupt files.
"""

from __future__ import annotations

import datetime as dt
import operator
from typing import Any

import pytest

from epochstream.core.serializers import JsonSerializer
from epochstream.core.state_descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from epochstream.exceptions import CorruptStateError, StateError
from epochstream.state.keygroups import key_group_for_key, key_group_range_for_operator

from .conftest import MAX_P, Harness


class Average(AggregateFunction):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, accumulator: tuple[int, int]) -> tuple[int, int]:
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: tuple[int, int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


COUNT = ValueStateDescriptor("count", default=0)
SEEN = ListStateDescriptor("seen")
PAGES = MapStateDescriptor("pages")
TOTAL = ReducingStateDescriptor("total", reduce_fn=operator.add)
AVG = AggregatingStateDescriptor("avg", aggregate_function=Average())


def _fill(backend: Any, keys: range, *, scale: int = 1) -> None:
    count, seen, pages = (backend.get_state(d) for d in (COUNT, SEEN, PAGES))
    total, avg = backend.get_state(TOTAL), backend.get_state(AVG)
    for k in keys:
        backend.set_current_key(f"k{k}")
        count.update(k * scale)
        seen.add_all([k, k + 1])
        pages.put("/home", k)
        pages.put(("nested", k), [k])
        total.add(k)
        avg.add(k)


def _dump(backend: Any, keys: range) -> dict[str, Any]:
    count, seen, pages = (backend.get_state(d) for d in (COUNT, SEEN, PAGES))
    total, avg = backend.get_state(TOTAL), backend.get_state(AVG)
    out: dict[str, Any] = {}
    for k in keys:
        backend.set_current_key(f"k{k}")
        out[f"k{k}"] = (
            count.value(),
            seen.get(),
            sorted(pages.items(), key=repr),
            total.get(),
            avg.get(),
        )
    return out


def test_value_state(harness: Harness) -> None:
    backend = harness.backend()
    count = backend.get_state(COUNT)
    backend.set_current_key("a")
    assert count.value() == 0
    count.update(5)
    backend.set_current_key("b")
    assert count.value() == 0
    backend.set_current_key("a")
    assert count.value() == 5
    count.update(None)
    assert count.value() == 0
    count.update(7)
    count.clear()
    assert count.value() == 0
    assert backend.keys("count") == []


def test_list_state(harness: Harness) -> None:
    backend = harness.backend()
    seen = backend.get_state(SEEN)
    backend.set_current_key(("tuple", 1))
    assert seen.get() == []
    seen.add(1)
    seen.add_all([2, 3])
    seen.add_all([])
    assert seen.get() == [1, 2, 3]
    seen.update([9])
    assert seen.get() == [9]
    seen.update([])
    assert seen.get() == [] and backend.keys("seen") == []


def test_map_state(harness: Harness) -> None:
    backend = harness.backend()
    pages = backend.get_state(PAGES)
    backend.set_current_key(7)
    assert pages.is_empty() and pages.get("/x", "d") == "d"
    pages.put("/x", 1)
    pages.put_all({"/y": 2, ("t", 1): 3})
    assert pages.contains("/y") and not pages.contains("/z")
    assert sorted(pages.keys(), key=repr) == sorted(["/x", "/y", ("t", 1)], key=repr)
    assert sorted(pages.values()) == [1, 2, 3]
    pages.remove("/x")
    pages.remove("/nope")
    assert sorted(pages.items(), key=repr) == sorted([("/y", 2), (("t", 1), 3)], key=repr)
    pages.clear()
    assert pages.is_empty() and backend.keys("pages") == []


def test_reducing_and_aggregating_state(harness: Harness) -> None:
    backend = harness.backend()
    total, avg = backend.get_state(TOTAL), backend.get_state(AVG)
    backend.set_current_key("k")
    assert total.get() is None and avg.get() is None
    for v in (2, 4, 9):
        total.add(v)
        avg.add(v)
    assert total.get() == 15 and avg.get() == 5.0
    total.clear()
    assert total.get() is None and avg.get() == 5.0


def test_values_are_copied_in_and_out(harness: Harness) -> None:
    """What value()/get() return and what update()/add()/put() receive are the caller's."""
    backend = harness.backend()
    box = backend.get_state(ValueStateDescriptor("box", default=[]))
    seen, pages = backend.get_state(SEEN), backend.get_state(PAGES)
    backend.set_current_key("k")
    got = box.value()
    got.append("leak")
    assert box.value() == [], "a mutable default must not be shared"
    mine = [1]
    box.update(mine)
    mine.append(2)
    assert box.value() == [1]
    read = box.value()
    read.append(3)
    assert box.value() == [1]
    element = {"n": 1}
    seen.add(element)
    element["n"] = 2
    assert seen.get() == [{"n": 1}]
    seen.get()[0]["n"] = 3
    assert seen.get() == [{"n": 1}]
    value = [1]
    pages.put("p", value)
    value.append(2)
    pages.get("p").append(3)
    assert pages.get("p") == [1]


def test_registration_rules(harness: Harness) -> None:
    backend = harness.backend()
    first = backend.get_state(COUNT)
    assert backend.get_state(ValueStateDescriptor("count", default=0)) is first
    with pytest.raises(StateError):
        backend.get_state(ListStateDescriptor("count"))
    with pytest.raises(StateError, match="no current key"):
        first.value()


def test_value_table(harness: Harness) -> None:
    backend = harness.backend()
    table = backend.value_table(ValueStateDescriptor("_sum"))
    for k in ("a", "b", "a"):
        table[k] = table.get(k, 0) + 1
    table.touched(["a", "b", "a"])
    table.delete("b")
    table.delete("missing")
    assert dict(table.items()) == {"a": 2}
    assert table.get("b", "gone") == "gone"


def _checkpoint(harness: Harness, backend: Any, n: int, base: int | None = None) -> Any:
    handle = backend.snapshot(harness.target(n, base=base)).run()
    backend.notify_checkpoint_complete(n)
    return handle


def test_snapshot_is_the_state_at_the_barrier(harness: Harness) -> None:
    backend = harness.backend()
    _fill(backend, range(20))
    expected = _dump(backend, range(20))
    job = backend.snapshot(harness.target(1))
    _fill(backend, range(20), scale=100)  # changes after the synchronous part
    backend.get_state(SEEN).clear()
    handle = job.run()
    restored = harness.backend()
    restored.restore([handle], checkpoint_id=1, owned=True)
    assert _dump(restored, range(20)) == expected


def test_chain_of_checkpoints_restores_the_latest(harness: Harness) -> None:
    backend = harness.backend()
    count = backend.get_state(COUNT)
    table = backend.value_table(ValueStateDescriptor("_sum"))
    handle = None
    expected: dict[int, int] = {}
    for n in range(1, 8):
        for k in range(n * 10):  # new keys and changed ones
            backend.set_current_key(k)
            count.update(count.value() + 1)
            expected[k] = expected.get(k, 0) + 1
        backend.set_current_key(n)
        count.clear()  # a deletion in a delta
        expected.pop(n)
        table[n] = n
        table.touched([n])
        handle = _checkpoint(harness, backend, n, base=n - 1 if n > 1 else None)
    restored = harness.backend()
    restored.restore([handle], checkpoint_id=7, owned=True)
    rcount = restored.get_state(COUNT)
    for k in range(70):
        restored.set_current_key(k)
        assert rcount.value() == expected.get(k, 0), k
    assert sorted(restored.keys("count")) == sorted(expected)
    assert dict(restored.value_table(ValueStateDescriptor("_sum")).items()) == {
        n: n for n in range(1, 8)
    }


def test_restored_backend_keeps_checkpointing(harness: Harness) -> None:
    """A failover restore continues the chain; a foreign restore starts a self-contained one."""
    backend = harness.backend()
    _fill(backend, range(30))
    h1 = _checkpoint(harness, backend, 1)
    for n, owned in ((2, True), (3, False)):
        again = harness.backend()
        again.restore([h1], checkpoint_id=1, owned=owned)
        again.set_current_key("k3")
        again.get_state(COUNT).update(333)
        h2 = _checkpoint(harness, again, n, base=1)
        final = harness.backend()
        final.restore([h2], checkpoint_id=n, owned=True)
        dump = _dump(final, range(30))
        assert dump["k3"][0] == 333 and dump["k4"][0] == 4


@pytest.mark.parametrize(("old", "new"), [(1, 3), (3, 2), (2, 1)])
def test_rescale_hands_every_key_to_its_new_owner(harness: Harness, old: int, new: int) -> None:
    keys = range(200)
    handles = []
    for i in range(old):
        backend = harness.backend(parallelism=old, subtask=i)
        owned = key_group_range_for_operator(MAX_P, old, i)
        mine = [k for k in keys if key_group_for_key(f"k{k}", MAX_P) in owned]
        for k in mine:
            _fill(backend, range(k, k + 1))
        handle = backend.snapshot(harness.target(1, subtask=i)).run()
        if handle is not None:
            handles.append(handle)
    expected = {}
    reference = harness.backend()
    _fill(reference, keys)
    expected = _dump(reference, keys)
    got = {}
    for j in range(new):
        kgr = key_group_range_for_operator(MAX_P, new, j)
        mine_handles = [r for r in (h.restricted_to(kgr) for h in handles) if r is not None]
        backend = harness.backend(parallelism=new, subtask=j)
        backend.restore(mine_handles, checkpoint_id=1, owned=False)
        mine = [k for k in keys if key_group_for_key(f"k{k}", MAX_P) in kgr]
        got.update(
            _dump(backend, range(0))
            or {f"k{k}": _dump(backend, range(k, k + 1))[f"k{k}"] for k in mine}
        )
        assert sorted(backend.keys("count")) == sorted(f"k{k}" for k in mine)
    assert got == expected


def test_savepoint_round_trip_in_canonical_format(harness: Harness) -> None:
    backend = harness.backend()
    _fill(backend, range(50))
    json_state = backend.get_state(ValueStateDescriptor("doc", serializer=JsonSerializer()))
    backend.set_current_key("k1")
    json_state.update({"a": [1, 2]})
    h1 = _checkpoint(harness, backend, 1)
    assert h1 is not None
    _fill(backend, range(10, 20), scale=3)
    savepoint = backend.snapshot(harness.target(2, base=1, savepoint="sp")).run()
    assert type(savepoint).__name__ == "CanonicalSnapshotHandle"
    expected = _dump(backend, range(50))
    restored = harness.backend()
    restored.restore([savepoint], checkpoint_id=2, owned=False)
    assert _dump(restored, range(50)) == expected
    restored.set_current_key("k1")
    doc = restored.get_state(ValueStateDescriptor("doc", serializer=JsonSerializer()))
    assert doc.value() == {"a": [1, 2]}


def test_ttl_expires_after_write_and_refreshes_on_read(harness: Harness) -> None:
    backend = harness.backend()
    on_write = backend.get_state(ValueStateDescriptor("w", ttl=dt.timedelta(seconds=10)))
    on_read = backend.get_state(ValueStateDescriptor("r", ttl=10.0, ttl_update="on_read_and_write"))
    per_element = backend.get_state(ListStateDescriptor("l", ttl=10.0))
    per_user_key = backend.get_state(MapStateDescriptor("m", ttl=10.0))
    backend.set_current_key("k")
    on_write.update("x")
    on_read.update("y")
    per_element.add(1)
    per_user_key.put("old", 1)
    harness.clock.advance(6)
    assert on_write.value() == "x" and on_read.value() == "y"  # the read refreshes "r"
    per_element.add(2)
    per_user_key.put("new", 2)
    harness.clock.advance(6)
    assert on_write.value() is None  # 12 s after its write
    assert on_read.value() == "y"  # 6 s after its last read
    assert per_element.get() == [2]
    assert per_user_key.items() == [("new", 2)]
    harness.clock.advance(11)
    savepoint = backend.snapshot(harness.target(1, savepoint="sp-ttl")).run()
    restored = harness.backend()
    if savepoint is not None:
        restored.restore([savepoint], checkpoint_id=1, owned=False)
    restored.set_current_key("k")
    assert restored.get_state(ValueStateDescriptor("r", ttl=10.0)).value() is None
    assert restored.keys("r") == [] and restored.keys("l") == []


def test_corrupt_snapshot_file_is_reported_with_its_path(harness: Harness) -> None:
    backend = harness.backend()
    _fill(backend, range(40))
    handle = _checkpoint(harness, backend, 1)
    victim = handle.files()[0]
    with open(victim, "r+b") as f:
        f.seek(40)
        f.write(b"\xff" * 16)
    restored = harness.backend()
    with pytest.raises(CorruptStateError) as info:
        restored.restore([handle], checkpoint_id=1, owned=True)
    assert info.value.path == victim


def test_missing_snapshot_file_is_corrupt_state(harness: Harness) -> None:
    backend = harness.backend()
    _fill(backend, range(5))
    handle = _checkpoint(harness, backend, 1)
    import os

    os.unlink(handle.files()[0])
    with pytest.raises(CorruptStateError):
        harness.backend().restore([handle], checkpoint_id=1, owned=True)


def test_unreachable_snapshot_files_are_unavailable_not_corrupt(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every backend's restore tells an outage from corruption (one classification)."""
    import os

    from epochstream.core import storage_faults
    from epochstream.exceptions import StorageUnavailableError
    from epochstream.state import canonical
    from epochstream.state.backends.heap import files as heap_files
    from epochstream.state.backends.rocksdb import backend as rocksdb_backend

    fast = storage_faults.StorageRetry(
        storage_faults.Backoff(deadline=1.0), sleep=lambda s: None, clock=lambda: 0.0
    )
    for module in (heap_files, canonical, rocksdb_backend):
        monkeypatch.setattr(module, "READ_RETRY", fast)
    backend = harness.backend()
    _fill(backend, range(20))
    expected = _dump(backend, range(20))
    handle = _checkpoint(harness, backend, 1)
    job, away = harness.root / "job", harness.root / "job.away"
    os.rename(job, away)
    job.write_text("a regular file where the checkpoint directory was (its mount went away)")
    with pytest.raises(StorageUnavailableError) as info:
        harness.backend().restore([handle], checkpoint_id=1, owned=True)
    assert not isinstance(info.value, CorruptStateError)
    job.unlink()
    os.rename(away, job)
    restored = harness.backend()
    restored.restore([handle], checkpoint_id=1, owned=True)
    assert _dump(restored, range(20)) == expected


def test_state_of_the_other_backend_is_refused_without_restarts(harness: Harness) -> None:
    """Every attempt would restore the same state: the error must not use up restarts."""
    from epochstream.state.handles import HeapSnapshotHandle, RocksDBSnapshotHandle

    backend = harness.backend()
    other = (
        RocksDBSnapshotHandle(range(0, MAX_P))
        if harness.kind.startswith("heap")
        else HeapSnapshotHandle(range(0, MAX_P), ())
    )
    with pytest.raises(
        StateError, match=r"cannot be restored by the .* backend: take a savepoint"
    ) as caught:
        backend.check_restorable(other)
    assert caught.value.suppress_restarts is True
    backend.dispose()
