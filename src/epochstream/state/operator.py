"""Operator (non-keyed) list state: one list per name per subtask.

Two flavours, as in Flink: plain list state is split round-robin across subtasks when
the parallelism changes; union list state is given whole to every subtask on restore
(each subtask then picks what it needs, e.g. source offsets). Both are small and travel
inline in the checkpoint acknowledgement (see :mod:`epochstream.state.handles`).

Example::

    store = OperatorStateStore()
    offsets = store.get_list_state("offsets")
    offsets.update([("part-0", 120)])
    operator_lists, union_lists = store.snapshot()
    operator_lists == {"offsets": [("part-0", 120)]}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from epochstream.exceptions import StateError
from epochstream.state.states import copy_value

__all__ = ["OperatorListState", "OperatorStateStore"]


class OperatorListState:
    """A named list of an operator subtask; ``get()`` returns a copy.

    Example::

        state = store.get_list_state("pending")
        state.add("txn-4")
        state.get() == ["txn-4"]
    """

    __slots__ = ("_items", "name", "union")

    def __init__(self, name: str, items: list[Any], *, union: bool) -> None:
        self.name = name
        self.union = union
        self._items = items

    def get(self) -> list[Any]:
        """A copy of the list."""
        return list(self._items)

    def add(self, value: Any) -> None:
        """Append ``value``."""
        self._items.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        """Append every element of ``values``."""
        self._items.extend(values)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the contents with ``values``."""
        self._items[:] = list(values)

    def clear(self) -> None:
        """Remove every element."""
        self._items.clear()


class OperatorStateStore:
    """The operator list states of one operator in one subtask.

    A name is either plain list state or union list state, never both.

    Example::

        store = OperatorStateStore()
        store.restore({"offsets": [3]}, {"splits": ["a", "b"]})
        store.get_list_state("offsets").get() == [3]
        store.get_union_list_state("splits").get() == ["a", "b"]
    """

    def __init__(self) -> None:
        self._lists: dict[str, list[Any]] = {}
        self._unions: dict[str, list[Any]] = {}
        self._states: dict[str, OperatorListState] = {}

    def _get(self, name: str, *, union: bool) -> OperatorListState:
        if not isinstance(name, str) or not name:
            raise StateError(f"operator state name must be a non-empty str, got {name!r}")
        existing = self._states.get(name)
        if existing is not None:
            if existing.union != union:
                raise StateError(self._conflict(name, registered_union=existing.union))
            return existing
        mine, other = (self._unions, self._lists) if union else (self._lists, self._unions)
        if name in other:
            raise StateError(self._conflict(name, registered_union=not union))
        items = mine.get(name)
        if items is None:
            items = mine[name] = []
        state = self._states[name] = OperatorListState(name, items, union=union)
        return state

    @staticmethod
    def _conflict(name: str, *, registered_union: bool) -> str:
        kinds = ("union list state", "list state")
        have, want = kinds if registered_union else kinds[::-1]
        return f"operator state {name!r} is {have}, cannot use it as {want}"

    def get_list_state(self, name: str) -> OperatorListState:
        """The list state ``name`` (split round-robin on rescale)."""
        return self._get(name, union=False)

    def get_union_list_state(self, name: str) -> OperatorListState:
        """The union list state ``name`` (every subtask gets all elements on restore)."""
        return self._get(name, union=True)

    def snapshot(self) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """``(operator_lists, union_lists)``: copies of every non-empty list."""
        memo: dict[int, Any] = {}
        lists = {n: copy_value(v, memo) for n, v in self._lists.items() if v}
        unions = {n: copy_value(v, memo) for n, v in self._unions.items() if v}
        return lists, unions

    def restore(
        self, operator_lists: dict[str, list[Any]], union_lists: dict[str, list[Any]]
    ) -> None:
        """Replace the named lists' contents with the restored ones."""
        clash = sorted(operator_lists.keys() & union_lists.keys())
        if clash:
            raise StateError(
                f"operator state {clash[0]!r} is restored both as list and as union list state"
            )
        for source, union in ((operator_lists, False), (union_lists, True)):
            for name, values in source.items():
                self._get(name, union=union).update(values)
