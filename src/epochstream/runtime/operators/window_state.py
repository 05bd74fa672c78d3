"""Per-window state of a ProcessWindowFunction: ``ctx.window_state()`` (Flink's
``ProcessWindowFunction.Context.windowState()``).

All per-window state of one key and window is one entry of a namespaced value state
(``window-state``), namespaced by the window: a dict of state name to value. So it is
keyed state like the window's contents (checkpointed, in savepoints, following its key
on rescale), and the window operator drops all of it with one delete when the window
is cleaned up (after the allowed lateness), right after ``ProcessWindowFunction.clear``
ran; it needs no list of the names used, which a restored operator would not have.
The state objects handed out read and write their entry of that dict: per-window
state is meant to be small (a count of firings, the last result), not a buffer.

Example::

    store = PerWindowStateStore(backend)
    fired = store.bind(window).get_state(ValueStateDescriptor("fired", default=0))
    fired.update(fired.value() + 1)
    store.clear_window(window)          # at cleanup
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from epochstream.core.state_descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from epochstream.exceptions import ConfigurationError
from epochstream.state.backends.base import KeyedStateBackend
from epochstream.state.states import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    copy_value,
)

__all__ = ["WINDOW_STATE", "PerWindowStateStore", "WindowStateView", "WindowStates"]

#: The namespaced value state holding every per-window state entry.
WINDOW_STATE = "window-state"
_MISSING: Any = object()


class WindowStates:
    """A window operator's per-window state: whether its windows may have any, made on
    first use, and dropped at window cleanup only once some may exist (the function
    asked for it, or the operator was restored), so windows that never use it pay
    nothing.

    Example::

        states = WindowStates(backend, allowed=True, restored=False)
        states.bind(window, "window (1/1)").get_state(descriptor)
        states.clear(window)
    """

    __slots__ = ("_backend", "_store", "allowed", "live")

    def __init__(self, backend: KeyedStateBackend, *, allowed: bool, restored: bool) -> None:
        self._backend = backend
        self._store: PerWindowStateStore | None = None
        #: False on merging windows, which Flink refuses per-window state too.
        self.allowed = allowed
        self.live = allowed and restored

    def _get_store(self) -> PerWindowStateStore:
        if self._store is None:
            self._store = PerWindowStateStore(self._backend)
        return self._store

    def bind(self, window: Any, task_name: str) -> WindowStateView:
        """State of the current key in ``window`` (``ctx.window_state()``)."""
        if not self.allowed:
            raise ConfigurationError(
                f"{task_name}: per-window state (ctx.window_state()) is not available with "
                "merging (session) windows, as in Flink; use ctx.global_state()"
            )
        self.live = True
        return self._get_store().bind(window)

    def clear(self, window: Any) -> None:
        """``window`` is cleaned up: drop its per-window state of the current key."""
        if self.live:
            self._get_store().clear_window(window)


class PerWindowStateStore:
    """The per-window state of a window operator (see the module docstring)."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._entries = backend.get_namespaced_state(ValueStateDescriptor(WINDOW_STATE))

    def bind(self, window: Any) -> WindowStateView:
        """State of the current key in ``window``."""
        return WindowStateView(self._entries, window)

    def clear_window(self, window: Any) -> None:
        """Drop all per-window state of the current key in ``window``."""
        self._entries.set_namespace(window)
        self._entries.clear()


class WindowStateView:
    """What ``ctx.window_state()`` returns: keyed state of the current key scoped to one
    window. ``get_state`` takes any descriptor; the other getters are Flink's names.

    Example::

        runs = ctx.window_state().get_state(es.state.ValueStateDescriptor("runs", default=0))
    """

    __slots__ = ("_entries", "_window")

    def __init__(self, entries: Any, window: Any) -> None:
        self._entries = entries
        self._window = window

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """Value, list, map, reducing or aggregating state by the descriptor's kind."""
        if descriptor.ttl is not None:
            raise ConfigurationError(
                f"per-window state {descriptor.name!r}: no TTL, it is dropped with its window"
            )
        kind = _KINDS.get(type(descriptor))
        if kind is None:
            raise ConfigurationError(f"unsupported state descriptor {type(descriptor).__name__}")
        return kind(_Entry(self._entries, self._window, descriptor.name), descriptor)

    def get_list_state(self, descriptor: ListStateDescriptor) -> Any:
        """Per-window list state."""
        return self.get_state(descriptor)

    def get_map_state(self, descriptor: MapStateDescriptor) -> Any:
        """Per-window map state."""
        return self.get_state(descriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> Any:
        """Per-window reducing state."""
        return self.get_state(descriptor)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> Any:
        """Per-window aggregating state."""
        return self.get_state(descriptor)


class _Entry:
    """One name's value in the (key, window) dict; ``_MISSING`` when unset."""

    __slots__ = ("_entries", "_name", "_window")

    def __init__(self, entries: Any, window: Any, name: str) -> None:
        self._entries = entries
        self._window = window
        self._name = name

    def read(self) -> Any:
        self._entries.set_namespace(self._window)
        found = self._entries.value()
        return _MISSING if found is None else found.get(self._name, _MISSING)

    def write(self, value: Any) -> None:
        entries = self._entries
        entries.set_namespace(self._window)
        found = entries.value() or {}
        if value is _MISSING:
            found.pop(self._name, None)
        else:
            found[self._name] = value
        entries.update(found or None)  # None deletes the window's entry


class _WindowValue(ValueState):
    def __init__(self, entry: _Entry, descriptor: Any) -> None:
        self._entry = entry
        self._default = descriptor.default

    def value(self) -> Any:
        found = self._entry.read()
        return copy_value(self._default) if found is _MISSING else found

    def update(self, value: Any) -> None:
        self._entry.write(_MISSING if value is None else value)

    def clear(self) -> None:
        self._entry.write(_MISSING)


class _WindowList(ListState):
    def __init__(self, entry: _Entry, descriptor: Any) -> None:
        self._entry = entry

    def get(self) -> list[Any]:
        found = self._entry.read()
        return [] if found is _MISSING else list(found)

    def add(self, value: Any) -> None:
        self._entry.write([*self.get(), value])

    def add_all(self, values: Iterable[Any]) -> None:
        self._entry.write([*self.get(), *values])

    def update(self, values: Iterable[Any]) -> None:
        items = list(values)
        self._entry.write(items if items else _MISSING)

    def clear(self) -> None:
        self._entry.write(_MISSING)


class _WindowMap(MapState):
    def __init__(self, entry: _Entry, descriptor: Any) -> None:
        self._entry = entry

    def _map(self) -> dict[Any, Any]:
        found = self._entry.read()
        return {} if found is _MISSING else dict(found)

    def _store(self, mapping: dict[Any, Any]) -> None:
        self._entry.write(mapping if mapping else _MISSING)

    def get(self, user_key: Any, default: Any = None) -> Any:
        return self._map().get(user_key, default)

    def put(self, user_key: Any, value: Any) -> None:
        self._store({**self._map(), user_key: value})

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        self._store({**self._map(), **entries})

    def remove(self, user_key: Any) -> None:
        mapping = self._map()
        mapping.pop(user_key, None)
        self._store(mapping)

    def contains(self, user_key: Any) -> bool:
        return user_key in self._map()

    def keys(self) -> list[Any]:
        return list(self._map())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def clear(self) -> None:
        self._entry.write(_MISSING)


class _WindowReducing(ReducingState):
    def __init__(self, entry: _Entry, descriptor: Any) -> None:
        self._entry = entry
        self._reduce = descriptor.reduce_fn

    def get(self) -> Any:
        found = self._entry.read()
        return None if found is _MISSING else found

    def add(self, value: Any) -> None:
        found = self._entry.read()
        self._entry.write(value if found is _MISSING else self._reduce(found, value))

    def clear(self) -> None:
        self._entry.write(_MISSING)


class _WindowAggregating(AggregatingState):
    def __init__(self, entry: _Entry, descriptor: Any) -> None:
        self._entry = entry
        self._fn = descriptor.aggregate_function

    def get(self) -> Any:
        found = self._entry.read()
        return None if found is _MISSING else self._fn.get_result(found)

    def add(self, value: Any) -> None:
        found = self._entry.read()
        acc = self._fn.create_accumulator() if found is _MISSING else found
        self._entry.write(self._fn.add(value, acc))

    def clear(self) -> None:
        self._entry.write(_MISSING)


_KINDS: dict[type[StateDescriptor], Any] = {
    ValueStateDescriptor: _WindowValue,
    ListStateDescriptor: _WindowList,
    MapStateDescriptor: _WindowMap,
    ReducingStateDescriptor: _WindowReducing,
    AggregatingStateDescriptor: _WindowAggregating,
}
