"""State schema evolution on every backend: a restored state is restored as saved,
migrated by its descriptor's ``migrate=``, or refused at its first ask
(:mod:`epochstream.core.state_schema`), from checkpoints and savepoints alike."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epochstream.core.serializers import JsonSerializer
from epochstream.core.state_descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from epochstream.core.state_schema import StateSchema, ValueShape
from epochstream.exceptions import StateError

from .conftest import Harness


@dataclasses.dataclass
class Visit:
    page: str
    seconds: int


KEYS = range(40)


def _fill(backend: Any) -> None:
    count = backend.get_state(ValueStateDescriptor("count"))
    seen = backend.get_state(ListStateDescriptor("seen"))
    pages = backend.get_state(MapStateDescriptor("pages"))
    visit = backend.get_state(ValueStateDescriptor("visit"))
    for k in KEYS:
        backend.set_current_key(f"k{k}")
        count.update(k)
        seen.add_all([k, k + 1])
        pages.put("/home", k)
        visit.update(Visit("/a", k))


def _snapshot(harness: Harness, backend: Any, savepoint: bool) -> Any:
    target = harness.target(1, savepoint="sp") if savepoint else harness.target(1)
    handle = backend.snapshot(target).run()
    assert handle is not None
    return handle


def _restored(
    harness: Harness, handle: Any, changes: dict[str, list[str]] | None = None, uid: str = "op"
) -> Any:
    backend = harness.backend(uid=uid)
    backend.set_class_changes(changes or {})
    backend.restore([handle], checkpoint_id=1, owned=False)
    return backend


@pytest.mark.parametrize("savepoint", [False, True], ids=["checkpoint", "savepoint"])
def test_a_higher_version_migrates_every_value_once(harness: Harness, savepoint: bool) -> None:
    source = harness.backend()
    _fill(source)
    handle = _snapshot(harness, source, savepoint)
    assert handle.schemas["count"].version == 1

    calls: list[tuple[Any, int]] = []

    def to_text(value: Any, old: int) -> str:
        calls.append((value, old))
        return f"n={value}"

    v2 = {
        "count": ValueStateDescriptor("count", version=2, migrate=to_text),
        "seen": ListStateDescriptor("seen", version=3, migrate=lambda v, old: v * 10 + old),
        "pages": MapStateDescriptor("pages", version=2, migrate=lambda v, old: -v),
    }
    backend = _restored(harness, handle)
    count, seen, pages = (backend.get_state(d) for d in v2.values())
    for k in KEYS:
        backend.set_current_key(f"k{k}")
        assert count.value() == f"n={k}"
        assert seen.get() == [k * 10 + 1, (k + 1) * 10 + 1]
        assert dict(pages.items()) == {"/home": -k}
    assert sorted(v for v, _ in calls) == list(KEYS)
    assert {old for _, old in calls} == {1}

    # The next snapshot records version 2 and holds migrated values: restoring it with
    # the same descriptors migrates nothing again.
    again = backend.snapshot(harness.target(2, savepoint="sp2")).run()
    assert again.schemas["count"].version == 2 and again.schemas["seen"].version == 3
    calls.clear()
    restored = harness.backend()
    restored.restore([again], checkpoint_id=2, owned=False)
    count = restored.get_state(v2["count"])
    restored.set_current_key("k7")
    assert count.value() == "n=7"
    assert calls == []


def test_a_higher_version_without_migrate_fails_naming_operator_and_state(
    harness: Harness,
) -> None:
    source = harness.backend(uid="profiles")
    _fill(source)
    backend = _restored(harness, _snapshot(harness, source, savepoint=False), uid="profiles")
    with pytest.raises(
        StateError,
        match=r"operator 'profiles', state 'count'.*version 1.*version 2 without migrate=",
    ) as err:
        backend.get_state(ValueStateDescriptor("count", version=2))
    assert err.value.suppress_restarts
    # The refusal stays: asking again fails the same way.
    with pytest.raises(StateError, match="without migrate="):
        backend.get_state(ValueStateDescriptor("count", version=2))


def test_a_lower_version_is_a_downgrade_and_fails(harness: Harness) -> None:
    source = harness.backend()
    source.get_state(ValueStateDescriptor("count", version=3))
    source.set_current_key("k1")
    source.get_state(ValueStateDescriptor("count", version=3)).update(1)
    backend = _restored(harness, _snapshot(harness, source, savepoint=True))
    with pytest.raises(StateError, match=r"saved at version 3.*version 1: a downgrade"):
        backend.get_state(ValueStateDescriptor("count"))


def test_another_kind_of_state_fails_naming_both_kinds(harness: Harness) -> None:
    source = harness.backend(uid="op")
    _fill(source)
    backend = _restored(harness, _snapshot(harness, source, savepoint=True))
    with pytest.raises(StateError, match=r"operator 'op', state 'count'.*saved as value state"):
        backend.get_state(ListStateDescriptor("count"))


def test_savepoints_record_the_shapes_of_their_values(harness: Harness) -> None:
    source = harness.backend()
    _fill(source)
    handle = _snapshot(harness, source, savepoint=True)
    assert handle.schemas["visit"].shapes == frozenset(
        {ValueShape(f"{Visit.__module__}:Visit", ("page", "seconds"))}
    )
    assert handle.schemas["count"].shapes == frozenset()


def test_a_changed_class_at_the_same_version_fails_naming_the_field(harness: Harness) -> None:
    source = harness.backend()
    _fill(source)
    handle = _snapshot(harness, source, savepoint=True)
    change = ["tests:Visit: field 'referrer' added"]
    backend = _restored(harness, handle, {"visit": change})
    with pytest.raises(StateError, match=r"state 'visit'.*field 'referrer' added.*version=2"):
        backend.get_state(ValueStateDescriptor("visit"))
    # The other states are untouched by the refusal of one.
    backend.set_current_key("k3")
    assert backend.get_state(ValueStateDescriptor("count")).value() == 3

    migrated = _restored(harness, handle, {"visit": change})
    visit = migrated.get_state(
        ValueStateDescriptor(
            "visit", version=2, migrate=lambda old, _v: {"page": old.page, "referrer": None}
        )
    )
    migrated.set_current_key("k3")
    assert visit.value() == {"page": "/a", "referrer": None}


def test_a_failing_migration_names_the_value(harness: Harness) -> None:
    source = harness.backend()
    _fill(source)
    backend = _restored(harness, _snapshot(harness, source, savepoint=False))

    def broken(value: Any, old: int) -> Any:
        raise KeyError("nope")

    with pytest.raises(StateError, match=r"state 'visit': migrate= raised KeyError.*Visit\(") as e:
        backend.get_state(ValueStateDescriptor("visit", version=2, migrate=broken))
    assert e.value.suppress_restarts


def test_a_new_serializer_reads_saved_values_without_a_version(harness: Harness) -> None:
    source = harness.backend()
    doc = source.get_state(ValueStateDescriptor("doc", serializer=JsonSerializer()))
    source.set_current_key("k1")
    doc.update({"a": [1, 2]})
    backend = _restored(harness, _snapshot(harness, source, savepoint=True))
    backend.set_current_key("k1")
    assert backend.get_state(ValueStateDescriptor("doc")).value() == {"a": [1, 2]}


def test_a_state_not_asked_for_keeps_its_saved_schema(harness: Harness) -> None:
    source = harness.backend()
    counts = source.get_state(ValueStateDescriptor("count", version=4))
    source.set_current_key("k1")
    counts.update(1)
    backend = _restored(harness, _snapshot(harness, source, savepoint=True))
    backend.set_current_key("k2")
    backend.get_state(ValueStateDescriptor("other")).update(2)
    assert backend.schema_of("count") == StateSchema(4)
    again = backend.snapshot(harness.target(2)).run()
    assert again.schemas["count"] == StateSchema(4) and again.schemas["other"] == StateSchema(1)


def test_migrated_values_keep_their_ttl(harness: Harness) -> None:
    source = harness.backend()
    ttl = ValueStateDescriptor("session", ttl=60)
    state = source.get_state(ttl)
    source.set_current_key("k1")
    state.update(5)
    harness.clock.advance(30)
    backend = _restored(harness, _snapshot(harness, source, savepoint=True))
    migrated = backend.get_state(
        ValueStateDescriptor("session", ttl=60, version=2, migrate=lambda v, _o: v + 1)
    )
    backend.set_current_key("k1")
    assert migrated.value() == 6
    harness.clock.advance(31)  # 61 s after the write: expired, the migration kept its stamp
    assert migrated.value() is None
