"""The keyed state interfaces user functions see (Flink's ValueState, ListState, ...).

Each backend implements them; a state object is bound to its backend's *current key*
(set by the runtime before each record and timer), so one obtained in ``open`` always
touches the entry of the record being processed.

Value semantics are the same on every backend: what ``value()``/``get()`` return is
the caller's to change (a copy where the value is mutable, as a RocksDB read is a
fresh object), and what ``update()``/``add()``/``put()`` receive is stored as it was
at the call (a later change of the caller's object does not change state). So state
changes only through these methods. Immutable values (numbers, strings, bytes, tuples
and frozensets of them, dates...) are never copied.

Example::

    count = ctx.get_state(ValueStateDescriptor("count", default=0))
    count.update(count.value() + 1)
"""

from __future__ import annotations

import copy
import datetime as _dt
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

__all__ = [
    "AggregatingState",
    "ListState",
    "MapState",
    "ReducingState",
    "State",
    "ValueState",
    "copy_value",
]

_ATOMIC: frozenset[type] = frozenset(
    {
        int,
        float,
        str,
        bytes,
        bool,
        type(None),
        complex,
        Decimal,
        _dt.date,
        _dt.datetime,
        _dt.time,
        _dt.timedelta,
    }
)


def _immutable(value: Any) -> bool:
    """True for atomic immutables and tuples/frozensets of immutables, named tuples
    included (their instances have no ``__dict__`` to change)."""
    kind = type(value)
    if kind in _ATOMIC:
        return True
    if (
        kind is tuple
        or kind is frozenset
        or (issubclass(kind, tuple) and not hasattr(value, "__dict__"))
    ):
        return _ATOMIC.issuperset(map(type, value)) or all(map(_immutable, value))
    return False


def copy_value(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """A copy of ``value`` that later in-place changes of ``value`` cannot reach.

    Immutables (atomics, and tuples, named tuples and frozensets of immutables) are
    returned as they are; lists and dicts of immutables get a shallow copy; anything
    else is deep-copied (``memo`` keeps aliasing between the values of one snapshot).
    Heap state copies what it stores and hands out, so that it behaves like a
    serializing backend; skipping the copy of immutables keeps that cheap (a session
    window operator's window set, a tuple of named-tuple windows, was deep-copied twice
    per record).

    Example::

        events = [1, 2]
        snap = copy_value(events)
        events.append(3)
        snap == [1, 2]
    """
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is list:
        if _ATOMIC.issuperset(map(type, value)) or all(map(_immutable, value)):
            return value.copy()
    elif kind is dict:
        if _ATOMIC.issuperset(map(type, value.values())) or all(map(_immutable, value.values())):
            return value.copy()
    elif kind is tuple and _ATOMIC.issuperset(map(type, value)):
        return value  # the common case, without a call
    elif _immutable(value):
        return value
    return copy.deepcopy(value, memo)


class State(ABC):
    """Base of every keyed state object."""

    #: True for namespaced state (windows and timers keep theirs per (key, namespace)).
    namespaced: bool = False

    @abstractmethod
    def clear(self) -> None:
        """Remove the current key's entry (in the current namespace, if namespaced)."""

    def set_namespace(self, namespace: Any) -> None:
        """Select the namespace that later accesses use (namespaced state only).

        Example: ``contents.set_namespace(window)``
        """
        from epochstream.exceptions import StateError

        raise StateError(f"{type(self).__name__} is not namespaced state")


class ValueState(State):
    """One value per key; ``value()`` is the descriptor's default when unset.

    Example::

        count.update(count.value() + 1)
    """

    @abstractmethod
    def value(self) -> Any:
        """The current key's value (a copy when mutable), or the default."""

    @abstractmethod
    def update(self, value: Any) -> None:
        """Set the current key's value; ``None`` clears it."""


class ListState(State):
    """A list per key; an unset key reads as ``[]`` and empty lists are never stored.

    Example::

        seen.add("a")
        seen.get() == ["a"]
    """

    @abstractmethod
    def get(self) -> list[Any]:
        """A new list with the current key's elements."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Append ``value``."""

    @abstractmethod
    def add_all(self, values: Iterable[Any]) -> None:
        """Append every element of ``values``."""

    @abstractmethod
    def update(self, values: Iterable[Any]) -> None:
        """Replace the list (an empty iterable clears it)."""


class MapState(State):
    """A dict per key; ``keys``/``values``/``items`` return new lists.

    Example::

        pages.put("/home", pages.get("/home", 0) + 1)
    """

    @abstractmethod
    def get(self, user_key: Any, default: Any = None) -> Any:
        """The value under ``user_key``, or ``default``."""

    @abstractmethod
    def put(self, user_key: Any, value: Any) -> None:
        """Set ``user_key`` to ``value``."""

    @abstractmethod
    def put_all(self, entries: Mapping[Any, Any]) -> None:
        """Set every entry of ``entries``."""

    @abstractmethod
    def remove(self, user_key: Any) -> None:
        """Remove ``user_key`` if present."""

    @abstractmethod
    def contains(self, user_key: Any) -> bool:
        """Whether ``user_key`` is present."""

    @abstractmethod
    def keys(self) -> list[Any]:
        """The user keys."""

    @abstractmethod
    def values(self) -> list[Any]:
        """The values."""

    @abstractmethod
    def items(self) -> list[tuple[Any, Any]]:
        """The ``(user_key, value)`` pairs."""

    def is_empty(self) -> bool:
        """Whether the current key has no entries."""
        return not self.keys()


class ReducingState(State):
    """One value per key folded with ``reduce_fn(old, new)``; ``get()`` is None when empty.

    Example::

        total.add(3); total.add(4); total.get() == 7
    """

    @abstractmethod
    def get(self) -> Any:
        """The reduced value, or ``None``."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Fold ``value`` in."""


class AggregatingState(State):
    """One accumulator per key driven by an ``AggregateFunction``.

    Example::

        avg.add(2); avg.add(4); avg.get() == 3.0
    """

    @abstractmethod
    def get(self) -> Any:
        """``get_result`` of the accumulator, or ``None`` when empty."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Fold ``value`` into the accumulator."""
