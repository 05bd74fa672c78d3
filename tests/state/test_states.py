"""copy_value: what heap state copies when it stores and hands out values."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest

from epochstream.graph.windowing import TimeWindow
from epochstream.state.states import copy_value

Point = namedtuple("Point", "x y")


class Pair(tuple):  # a tuple subclass with a __dict__: its attributes can change
    pass


@pytest.mark.parametrize(
    "value",
    [
        7,
        "s",
        None,
        (1, "a", None),
        ((1, 2), (3, (4, 5))),
        Point(1, 2),
        (TimeWindow(0, 10), TimeWindow(0, 10)),
        tuple((TimeWindow(0, 10), TimeWindow(5, 15)) for _ in range(3)),
        frozenset({(1, 2), (3, 4)}),
    ],
)
def test_immutables_are_returned_as_they_are(value: Any) -> None:
    assert copy_value(value) is value


@pytest.mark.parametrize(
    "value",
    [[1, 2], [(1, 2), Point(3, 4)], {"a": 1}, {"a": (1, 2)}],
)
def test_lists_and_dicts_of_immutables_get_a_shallow_copy(value: Any) -> None:
    copied = copy_value(value)
    assert copied == value and copied is not value
    assert all(a is b for a, b in zip(_items(copied), _items(value), strict=True))


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else list(value.values())


def test_anything_mutable_inside_is_deep_copied() -> None:
    inner = [1]
    for value in ((inner, 2), [(inner,)], {"k": [inner]}, Point(inner, 2)):
        copied = copy_value(value)
        assert copied == value
        inner.append(2)
        assert copied != value, value
        inner.pop()
    tagged = Pair((1, 2))
    tagged.note = "x"
    copied = copy_value(tagged)
    assert copied is not tagged and copied.note == "x"
