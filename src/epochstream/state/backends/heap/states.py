"""The heap backend's state objects: live Python objects in one dict per state.

Every write also records the key in the table's ``dirty`` set, which is how a
snapshot knows what changed since the last one without copying all state. Reads and
writes copy mutable values (see :mod:`epochstream.state.states` for why).

Built-in operators reach a value state as a whole through :class:`HeapValueTable`, the
table's dict itself: one ``get`` and one item assignment per record at dict speed, and
the written keys declared once per batch. Once more than half of a table's keys (and at
least ``UNTRACKED_MIN_KEYS``) were written since the last snapshot, tracking them costs
more than it saves (the snapshot copies the whole table then anyway), so the table
stops recording writes until the next snapshot (``all_dirty``); deletions are always
recorded.

Example::

    table = HeapTable("count", "value", descriptor)
    count = HeapValueState(table, ctx, clock)
    ctx.key = "user-7"
    count.update(count.value() + 1)
    table.dirty == {"user-7"}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from epochstream.core.clock import Clock
from epochstream.core.serializers import Serializer
from epochstream.core.state_descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from epochstream.core.state_ttl import TtlConfig, TtlValue
from epochstream.exceptions import StateError
from epochstream.state.backends.base import is_namespaced
from epochstream.state.states import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    copy_value,
)

__all__ = [
    "NO_KEY",
    "HeapAggregatingState",
    "HeapListState",
    "HeapMapState",
    "HeapReducingState",
    "HeapTable",
    "HeapValueState",
    "HeapValueTable",
    "KeyContext",
]

NO_KEY: Any = object()
NO_NAMESPACE: Any = object()

#: Tables with fewer written keys keep tracking them: a small set is cheap to update,
#: and their incremental snapshots stay deltas.
UNTRACKED_MIN_KEYS = 8192
_MISSING: Any = object()


class KeyContext:
    """The backend's current key, shared by all its state objects."""

    __slots__ = ("key",)

    def __init__(self) -> None:
        self.key: Any = NO_KEY


class HeapTable:
    """One state's entries (``data``), the keys changed since the last snapshot
    (``dirty``, or every key while ``all_dirty``), and how its values are stored (kind,
    serializer, TTL)."""

    __slots__ = ("all_dirty", "data", "descriptor", "dirty", "kind", "name", "serializer", "ttl")

    def __init__(
        self,
        name: str,
        kind: str,
        descriptor: StateDescriptor | None = None,
        serializer: Serializer | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.descriptor = descriptor
        self.serializer = serializer or (descriptor.value_serializer if descriptor else None)
        self.ttl: TtlConfig | None = descriptor.ttl_config if descriptor else None
        self.data = HeapValueTable(self)
        self.dirty: set[Any] = set()
        self.all_dirty = False


class HeapValueTable(dict[Any, Any]):
    """A heap table's entries, and the :class:`~epochstream.state.backends.base.ValueTable`
    of a value state: a dict, so a built-in operator's per-record ``get`` and item
    assignment cost what a dict's do.

    Example::

        table = HeapTable("_sum", "value")
        sums = table.data
        sums["a"] = sums.get("a", 0) + 1
        sums.touched(["a"])
        table.dirty == {"a"}
    """

    __slots__ = ("_table",)

    def __init__(self, table: HeapTable) -> None:
        super().__init__()
        self._table = table

    def touched(self, keys: Iterable[Any], /) -> None:
        """Declare the keys written since the last call (see the module docstring)."""
        table = self._table
        if table.all_dirty:
            return
        dirty = table.dirty
        dirty.update(keys)
        if len(dirty) >= UNTRACKED_MIN_KEYS and 2 * len(dirty) > len(self):
            table.all_dirty = True

    def delete(self, key: Any, /) -> None:
        """Remove ``key`` (no-op when absent)."""
        if self.pop(key, _MISSING) is not _MISSING:
            self._table.dirty.add(key)


class _HeapState:
    """Entries keyed by the current key, or by (current key, namespace) when namespaced."""

    __slots__ = ("_clock", "_ctx", "_data", "_dirty", "_ns", "_table", "_ttl", "namespaced")

    def __init__(self, table: HeapTable, ctx: KeyContext, clock: Clock) -> None:
        self._table = table
        self._data = table.data
        self._dirty = table.dirty
        self._ctx = ctx
        self._ttl = table.ttl
        self._clock = clock
        self.namespaced = is_namespaced(table.kind)
        self._ns: Any = NO_NAMESPACE

    @property
    def descriptor(self) -> StateDescriptor | None:
        return self._table.descriptor

    def set_namespace(self, namespace: Any) -> None:
        if not self.namespaced:
            raise StateError(f"state {self._table.name!r} is not namespaced")
        self._ns = namespace

    def _key(self) -> Any:
        key = self._ctx.key
        if key is NO_KEY:
            raise StateError(
                f"state {self._table.name!r} accessed with no current key; keyed state is "
                "only available while processing a keyed record or timer"
            )
        if self.namespaced:
            if self._ns is NO_NAMESPACE:
                raise StateError(f"state {self._table.name!r} accessed with no namespace set")
            return (key, self._ns)
        return key

    def _wrap(self, value: Any) -> Any:
        return value if self._ttl is None else TtlValue.of(value, self._clock.wall())

    def _live(self, key: Any, stored: Any) -> Any:
        """``stored`` unwrapped, or ``_MISSING`` when it expired (then it is deleted)."""
        ttl = self._ttl
        if ttl is None:
            return stored
        now = self._clock.wall()
        if ttl.expired(stored, now):
            del self._data[key]
            self._dirty.add(key)
            return _MISSING
        if ttl.update_on_read:
            self._data[key] = TtlValue.of(stored.value, now)
            self._dirty.add(key)
        return stored.value

    def clear(self) -> None:
        """Remove the current key's entry."""
        key = self._key()
        if self._data.pop(key, _MISSING) is not _MISSING:
            self._dirty.add(key)


class HeapValueState(_HeapState, ValueState):
    """See :class:`~epochstream.state.states.ValueState`."""

    __slots__ = ("_default",)

    def __init__(self, table: HeapTable, ctx: KeyContext, clock: Clock) -> None:
        super().__init__(table, ctx, clock)
        descriptor = table.descriptor
        assert isinstance(descriptor, ValueStateDescriptor)
        self._default = descriptor.default

    def value(self) -> Any:
        key = self._key()
        stored = self._data.get(key, _MISSING)
        if stored is not _MISSING:
            stored = self._live(key, stored)
        if stored is _MISSING:
            return copy_value(self._default)
        return copy_value(stored)

    def update(self, value: Any) -> None:
        key = self._key()
        if value is None:
            self.clear()
            return
        self._data[key] = self._wrap(copy_value(value))
        self._dirty.add(key)


class HeapListState(_HeapState, ListState):
    """See :class:`~epochstream.state.states.ListState`; with TTL, elements expire one by one."""

    __slots__ = ()

    def _elements(self, key: Any) -> list[Any] | None:
        found: list[Any] | None = self._data.get(key)
        ttl = self._ttl
        if found is None or ttl is None:
            return found
        now = self._clock.wall()
        live = [e for e in found if not ttl.expired(e, now)]
        if ttl.update_on_read:
            live = [TtlValue.of(e.value, now) for e in live]
        if len(live) != len(found) or ttl.update_on_read:
            self._dirty.add(key)
            if live:
                self._data[key] = live
            else:
                del self._data[key]
                return None
            return live
        return found

    def get(self) -> list[Any]:
        found = self._elements(self._key())
        if found is None:
            return []
        if self._ttl is not None:
            return copy_value([e.value for e in found])
        return copy_value(found)

    def add(self, value: Any) -> None:
        key = self._key()
        element = self._wrap(copy_value(value))
        found = self._data.get(key)
        if found is None:
            self._data[key] = [element]
        else:
            found.append(element)
        self._dirty.add(key)

    def add_all(self, values: Iterable[Any]) -> None:
        key = self._key()
        items = [self._wrap(v) for v in copy_value(list(values))]
        if not items:
            return
        found = self._data.get(key)
        if found is None:
            self._data[key] = items
        else:
            found.extend(items)
        self._dirty.add(key)

    def update(self, values: Iterable[Any]) -> None:
        key = self._key()
        items = [self._wrap(v) for v in copy_value(list(values))]
        if items:
            self._data[key] = items
            self._dirty.add(key)
        else:
            self.clear()


class HeapMapState(_HeapState, MapState):
    """See :class:`~epochstream.state.states.MapState`; with TTL, entries expire per user key."""

    __slots__ = ()

    def _map(self, key: Any) -> dict[Any, Any] | None:
        found: dict[Any, Any] | None = self._data.get(key)
        ttl = self._ttl
        if found is None or ttl is None:
            return found
        now = self._clock.wall()
        expired = [uk for uk, v in found.items() if ttl.expired(v, now)]
        if expired or ttl.update_on_read:
            for uk in expired:
                del found[uk]
            if ttl.update_on_read:
                for uk, v in found.items():
                    found[uk] = TtlValue.of(v.value, now)
            self._dirty.add(key)
            if not found:
                del self._data[key]
                return None
        return found

    def _unwrapped(self, value: Any) -> Any:
        return value if self._ttl is None else value.value

    def get(self, user_key: Any, default: Any = None) -> Any:
        found = self._map(self._key())
        if found is None or user_key not in found:
            return default
        return copy_value(self._unwrapped(found[user_key]))

    def put(self, user_key: Any, value: Any) -> None:
        key = self._key()
        found = self._data.get(key)
        if found is None:
            found = self._data[key] = {}
        found[user_key] = self._wrap(copy_value(value))
        self._dirty.add(key)

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        if not entries:
            return
        key = self._key()
        found = self._data.get(key)
        if found is None:
            found = self._data[key] = {}
        for user_key, value in copy_value(dict(entries)).items():
            found[user_key] = self._wrap(value)
        self._dirty.add(key)

    def remove(self, user_key: Any) -> None:
        key = self._key()
        found = self._data.get(key)
        if found is not None and user_key in found:
            del found[user_key]
            if not found:
                del self._data[key]
            self._dirty.add(key)

    def contains(self, user_key: Any) -> bool:
        found = self._map(self._key())
        return found is not None and user_key in found

    def keys(self) -> list[Any]:
        found = self._map(self._key())
        return [] if found is None else list(found)

    def values(self) -> list[Any]:
        found = self._map(self._key())
        return [] if found is None else [copy_value(self._unwrapped(v)) for v in found.values()]

    def items(self) -> list[tuple[Any, Any]]:
        found = self._map(self._key())
        if found is None:
            return []
        return [(uk, copy_value(self._unwrapped(v))) for uk, v in found.items()]


class HeapReducingState(_HeapState, ReducingState):
    """See :class:`~epochstream.state.states.ReducingState`."""

    __slots__ = ("_reduce",)

    def __init__(self, table: HeapTable, ctx: KeyContext, clock: Clock) -> None:
        super().__init__(table, ctx, clock)
        descriptor = table.descriptor
        assert isinstance(descriptor, ReducingStateDescriptor)
        self._reduce: Any = descriptor.reduce_fn

    def _current(self, key: Any) -> Any:
        stored = self._data.get(key, _MISSING)
        return stored if stored is _MISSING else self._live(key, stored)

    def get(self) -> Any:
        found = self._current(self._key())
        return None if found is _MISSING else copy_value(found)

    def add(self, value: Any) -> None:
        key = self._key()
        found = self._current(key)
        value = copy_value(value)
        self._data[key] = self._wrap(value if found is _MISSING else self._reduce(found, value))
        self._dirty.add(key)


class HeapAggregatingState(_HeapState, AggregatingState):
    """See :class:`~epochstream.state.states.AggregatingState`."""

    __slots__ = ("_fn",)

    def __init__(self, table: HeapTable, ctx: KeyContext, clock: Clock) -> None:
        super().__init__(table, ctx, clock)
        descriptor = table.descriptor
        assert isinstance(descriptor, AggregatingStateDescriptor)
        self._fn: Any = descriptor.aggregate_function

    def _current(self, key: Any) -> Any:
        stored = self._data.get(key, _MISSING)
        return stored if stored is _MISSING else self._live(key, stored)

    def get(self) -> Any:
        found = self._current(self._key())
        return None if found is _MISSING else copy_value(self._fn.get_result(found))

    def add(self, value: Any) -> None:
        key = self._key()
        found = self._current(key)
        if found is _MISSING:
            found = self._fn.create_accumulator()
        self._data[key] = self._wrap(self._fn.add(copy_value(value), found))
        self._dirty.add(key)


HEAP_STATE_CLASSES: dict[str, type[_HeapState]] = {
    "value": HeapValueState,
    "list": HeapListState,
    "map": HeapMapState,
    "reducing": HeapReducingState,
    "aggregating": HeapAggregatingState,
    "ns-value": HeapValueState,
    "ns-list": HeapListState,
}
