"""Keyed state objects (Flink's ValueState, ListState, MapState, ReducingState,
AggregatingState), each bound to the backend's current key.

They read and write one flat dict per state name owned by
:class:`~epochstream.state.keyed.HeapKeyedStateBackend`; the backend sets the current
key before each record, so a state object obtained once in ``open`` always touches
the entry of the record being processed.

Example::

    count = backend.get_state(ValueStateDescriptor("count", default=0))
    backend.set_current_key("user-7")
    count.update(count.value() + 1)
"""

from __future__ import annotations

import copy
import datetime as _dt
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from epochstream.exceptions import StateError
from epochstream.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

__all__ = [
    "AggregatingState",
    "ListState",
    "MapState",
    "ReducingState",
    "ValueState",
    "copy_for_snapshot",
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


def copy_for_snapshot(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """A copy of ``value`` that later in-place mutation of ``value`` cannot reach.

    Atomic immutables (and tuples/frozensets of them) are returned as they are; lists
    and dicts of atomics get a shallow copy; anything else is deep-copied (``memo``
    keeps aliasing between values of one snapshot).

    Example::

        events = [1, 2]
        snap = copy_for_snapshot(events)
        events.append(3)
        snap == [1, 2]
    """
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is list:
        if _ATOMIC.issuperset(map(type, value)):
            return value.copy()
    elif kind is dict:
        if _ATOMIC.issuperset(map(type, value.values())):
            return value.copy()
    elif kind is tuple or kind is frozenset:
        if _ATOMIC.issuperset(map(type, value)):
            return value
    return copy.deepcopy(value, memo)


def _copy_table(table: dict[Any, Any], memo: dict[int, Any]) -> dict[Any, Any]:
    if _ATOMIC.issuperset(map(type, table.values())):
        return table.copy()  # the common case: one C-level dict copy
    return {key: copy_for_snapshot(value, memo) for key, value in table.items()}


_NO_KEY: Any = object()
_MISSING: Any = object()


class _KeyContext:
    """The backend's current key, shared by all its state objects."""

    __slots__ = ("key",)

    def __init__(self) -> None:
        self.key: Any = _NO_KEY


class _KeyedState:
    """Base of the state objects: a table and the shared current-key context."""

    __slots__ = ("_ctx", "_table", "descriptor")

    def __init__(
        self, descriptor: StateDescriptor, table: dict[Any, Any], ctx: _KeyContext
    ) -> None:
        self.descriptor = descriptor
        self._table = table
        self._ctx = ctx

    def _no_key(self) -> StateError:
        return StateError(
            f"state {self.descriptor.name!r} accessed with no current key; keyed state is "
            "only available while processing a keyed record or timer"
        )

    def clear(self) -> None:
        """Remove the current key's entry."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        self._table.pop(key, None)


class ValueState(_KeyedState):
    """One value per key (Flink's ``ValueState``).

    ``value()`` returns the stored object itself (mutating it changes state on this
    heap backend, but call ``update`` to be portable); when unset it returns the
    descriptor's default, copied when the default is mutable. ``update(None)`` clears.

    Example::

        count = backend.get_state(ValueStateDescriptor("count", default=0))
        count.update(count.value() + 1)
    """

    __slots__ = ("_default", "_default_is_atomic")

    def __init__(
        self, descriptor: ValueStateDescriptor, table: dict[Any, Any], ctx: _KeyContext
    ) -> None:
        super().__init__(descriptor, table, ctx)
        self._default = descriptor.default
        self._default_is_atomic = copy_for_snapshot(self._default) is self._default

    def value(self) -> Any:
        """The current key's value, or the default."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        found = self._table.get(key, _MISSING)
        if found is _MISSING:
            if self._default_is_atomic:
                return self._default
            return copy.deepcopy(self._default)
        return found

    def update(self, value: Any) -> None:
        """Set the current key's value; ``None`` clears it (as in Flink)."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        if value is None:
            self._table.pop(key, None)
        else:
            self._table[key] = value


class ListState(_KeyedState):
    """A list per key (Flink's ``ListState``).

    ``get()`` returns a new list (a shallow copy), so changing it does not change
    state; an unset key gives ``[]``. Empty lists are never stored.

    Example::

        seen = backend.get_state(ListStateDescriptor("seen"))
        seen.add("a")
        seen.add_all(["b", "c"])
        seen.get() == ["a", "b", "c"]
    """

    __slots__ = ()

    def get(self) -> list[Any]:
        """A copy of the current key's list (``[]`` when unset)."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        found = self._table.get(key)
        return [] if found is None else list(found)

    def add(self, value: Any) -> None:
        """Append ``value`` to the current key's list."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        found = self._table.get(key)
        if found is None:
            self._table[key] = [value]
        else:
            found.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        """Append every element of ``values``."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        items = list(values)
        if not items:
            return
        found = self._table.get(key)
        if found is None:
            self._table[key] = items
        else:
            found.extend(items)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's list (an empty iterable clears it)."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        items = list(values)
        if items:
            self._table[key] = items
        else:
            self._table.pop(key, None)


class MapState(_KeyedState):
    """A dict per key (Flink's ``MapState``); ``keys/values/items`` return lists.

    Example::

        pages = backend.get_state(MapStateDescriptor("pages"))
        pages.put("/home", pages.get("/home", 0) + 1)
        pages.items() == [("/home", 1)]
    """

    __slots__ = ()

    def _current(self) -> dict[Any, Any] | None:
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        found: dict[Any, Any] | None = self._table.get(key)
        return found

    def _current_for_write(self) -> dict[Any, Any]:
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        found: dict[Any, Any] | None = self._table.get(key)
        if found is None:
            found = self._table[key] = {}
        return found

    def get(self, user_key: Any, default: Any = None) -> Any:
        """The value under ``user_key``, or ``default``."""
        found = self._current()
        return default if found is None else found.get(user_key, default)

    def put(self, user_key: Any, value: Any) -> None:
        """Set ``user_key`` to ``value``."""
        self._current_for_write()[user_key] = value

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        """Set every entry of ``entries``."""
        if entries:
            self._current_for_write().update(entries)

    def remove(self, user_key: Any) -> None:
        """Remove ``user_key`` if present."""
        found = self._current()
        if found is not None:
            found.pop(user_key, None)
            if not found:
                del self._table[self._ctx.key]

    def contains(self, user_key: Any) -> bool:
        """Whether ``user_key`` is present."""
        found = self._current()
        return found is not None and user_key in found

    def keys(self) -> list[Any]:
        """The user keys (a new list)."""
        found = self._current()
        return [] if found is None else list(found)

    def values(self) -> list[Any]:
        """The values (a new list)."""
        found = self._current()
        return [] if found is None else list(found.values())

    def items(self) -> list[tuple[Any, Any]]:
        """The ``(user_key, value)`` pairs (a new list)."""
        found = self._current()
        return [] if found is None else list(found.items())

    def is_empty(self) -> bool:
        """Whether the current key has no entries."""
        return not self._current()


class ReducingState(_KeyedState):
    """One value per key folded with ``reduce_fn(old, new)`` (Flink's ``ReducingState``).

    Example::

        total = backend.get_state(ReducingStateDescriptor("sum", reduce_fn=operator.add))
        total.add(3)
        total.add(4)
        total.get() == 7
    """

    __slots__ = ("_reduce",)

    def __init__(
        self, descriptor: ReducingStateDescriptor, table: dict[Any, Any], ctx: _KeyContext
    ) -> None:
        super().__init__(descriptor, table, ctx)
        self._reduce: Any = descriptor.reduce_fn

    def get(self) -> Any:
        """The reduced value, or ``None`` when nothing was added."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        return self._table.get(key)

    def add(self, value: Any) -> None:
        """Fold ``value`` into the current key's value."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        found = self._table.get(key, _MISSING)
        self._table[key] = value if found is _MISSING else self._reduce(found, value)


class AggregatingState(_KeyedState):
    """One accumulator per key driven by an ``AggregateFunction``.

    Example::

        avg = backend.get_state(AggregatingStateDescriptor("avg", aggregate_function=Average()))
        avg.add(2)
        avg.add(4)
        avg.get() == 3.0
    """

    __slots__ = ("_fn",)

    def __init__(
        self, descriptor: AggregatingStateDescriptor, table: dict[Any, Any], ctx: _KeyContext
    ) -> None:
        super().__init__(descriptor, table, ctx)
        self._fn: Any = descriptor.aggregate_function

    def get(self) -> Any:
        """``get_result`` of the current key's accumulator, or ``None`` when empty."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        found = self._table.get(key, _MISSING)
        return None if found is _MISSING else self._fn.get_result(found)

    def add(self, value: Any) -> None:
        """Fold ``value`` into the current key's accumulator."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise self._no_key()
        found = self._table.get(key, _MISSING)
        if found is _MISSING:
            found = self._fn.create_accumulator()
        self._table[key] = self._fn.add(value, found)


_STATE_CLASSES: dict[type[StateDescriptor], type[_KeyedState]] = {
    ValueStateDescriptor: ValueState,
    ListStateDescriptor: ListState,
    MapStateDescriptor: MapState,
    ReducingStateDescriptor: ReducingState,
    AggregatingStateDescriptor: AggregatingState,
}
