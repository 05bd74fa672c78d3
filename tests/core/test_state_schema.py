"""The state schema a snapshot records, the class comparison and the one evolution rule."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import pytest

from epochstream.core.state_schema import (
    StateSchema,
    ValueShape,
    class_changes,
    evolve,
    shape_of_type,
    shapes_of,
)
from epochstream.exceptions import CheckpointError


@dataclasses.dataclass
class Profile:
    name: str
    visits: int
    email: str | None = None


class Point(NamedTuple):
    x: int
    y: int


HERE = Profile.__module__


def test_shapes_are_the_classes_with_named_fields() -> None:
    assert shape_of_type(Profile) == ValueShape(f"{HERE}:Profile", ("name", "visits", "email"))
    assert shape_of_type(Point) == ValueShape(f"{HERE}:Point", ("x", "y"))
    assert shapes_of([1, "a", (1, 2), {"a": 1}, None]) == frozenset()
    assert shapes_of([Profile("a", 1), Profile("b", 2), Point(1, 2), 3]) == {
        shape_of_type(Profile),
        shape_of_type(Point),
    }


def test_schema_json_round_trip_and_bad_documents_name_the_place() -> None:
    schema = StateSchema(3, shapes_of([Profile("a", 1)]))
    assert StateSchema.from_json(schema.to_json(), "here") == schema
    with pytest.raises(CheckpointError, match=r"here: a state schema needs a version >= 1"):
        StateSchema.from_json({"version": 0}, "here")
    with pytest.raises(CheckpointError, match=r"here.shapes\[0\]: a value shape"):
        StateSchema.from_json({"version": 1, "shapes": [{"class": 3}]}, "here")


def test_class_changes_compare_saved_fields_with_the_class_of_that_name_now() -> None:
    saved = StateSchema(
        1,
        frozenset(
            {
                ValueShape(f"{HERE}:Profile", ("name", "visits", "age")),
                ValueShape(f"{HERE}:Point", ("x", "y")),  # unchanged
                ValueShape("no_such_module_anywhere:Thing", ("a",)),  # not judged here
            }
        ),
    )
    assert class_changes(saved) == [
        f"{HERE}:Profile: field 'email' added, field 'age' removed",
    ]
    reordered = StateSchema(1, frozenset({ValueShape(f"{HERE}:Point", ("y", "x"))}))
    assert class_changes(reordered) == [
        f"{HERE}:Point: fields reordered from ['y', 'x'] to ['x', 'y']"
    ]
    gone = StateSchema(1, frozenset({ValueShape(f"{HERE}:NoLongerHere", ("a",))}))
    assert class_changes(gone) == []  # a name that does not resolve is not judged


def _verdict(**overrides: Any) -> tuple[str, str]:
    args: dict[str, Any] = {
        "saved_kind": "value",
        "saved": StateSchema(1),
        "kind": "value",
        "version": 1,
        "migrate": None,
        "changes": [],
    }
    args.update(overrides)
    v = evolve(**args)
    return v.action, v.reason


def test_the_evolution_rule() -> None:
    def fn(value: Any, old: int) -> Any:
        return value

    assert _verdict() == ("restore", "")
    assert _verdict(version=2, migrate=fn)[0] == "migrate"
    assert _verdict(saved=StateSchema(2), version=3, migrate=fn)[1] == "version 2 -> 3 by migrate="
    assert "without migrate=" in _verdict(version=2)[1]
    assert "downgrade" in _verdict(saved=StateSchema(2))[1]
    assert "saved as value state and is now list state" in _verdict(kind="list")[1]
    # A kind change is refused even with a migration function.
    assert _verdict(kind="map", version=2, migrate=fn)[0] == "fail"
    changed = _verdict(changes=["m:P: field 'e' added"])
    assert changed[0] == "fail" and "field 'e' added" in changed[1] and "version=2" in changed[1]
    assert _verdict(changes=["m:P: field 'e' added"], version=2, migrate=fn)[0] == "migrate"


def test_descriptors_validate_version_and_migrate() -> None:
    from epochstream.core.state_descriptors import ValueStateDescriptor
    from epochstream.exceptions import ConfigurationError

    assert ValueStateDescriptor("p", version=2, migrate=lambda v, o: v).version == 2
    with pytest.raises(ConfigurationError, match=r"state 'p': version must be an int >= 1"):
        ValueStateDescriptor("p", version=0)
    with pytest.raises(ConfigurationError, match=r"state 'p': migrate must be a function"):
        ValueStateDescriptor("p", version=2, migrate="nope")
