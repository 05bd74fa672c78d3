"""A keyed-state backend that holds no state: what ``epochstream check-upgrade`` opens a
new job's operators against, to learn each restored state's fate without loading it.

:class:`DryRunKeyedBackend` is a :class:`~epochstream.state.backends.base.KeyedStateBackend`
whose ``restore`` only notes the kind and schema each handle records (through the base
class's ``_note_saved``, as the real backends do) and reads no file. When the operator's
``open()`` asks for a state, the base class's ``_evolve`` applies the one evolution rule
(:func:`~epochstream.core.state_schema.evolve`) exactly as on a real restore; this
backend writes down the outcome (:class:`StateOutcome`) instead of failing, so one
check reports every state, and ``_migrate`` records that a migration would run instead
of running it. The state objects it hands out are inert: reading or writing them is a
:class:`StateError` (an operator's ``open()`` declares state, it does not use it).

Columnar and row tables (SQL operators' batch state) are not modelled: the backend
presents none, and the check reports those saved states as unchecked.

Example::

    backend = DryRunKeyedBackend(ctx, state_backend_name="heap")
    backend.restore(handles, checkpoint_id=7, owned=False)
    backend.get_state(ValueStateDescriptor("profile", version=2, migrate=fn))
    backend.outcomes["profile"].action == "migrate"
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from epochstream.core.state_descriptors import StateDescriptor, ValueStateDescriptor
from epochstream.core.state_schema import StateSchema
from epochstream.exceptions import StateError
from epochstream.state.backends.base import (
    STATE_KINDS,
    KeyedBackendContext,
    KeyedStateBackend,
    SnapshotJob,
    SnapshotTarget,
    ValueTable,
    base_kind,
    is_namespaced,
)
from epochstream.state.handles import KeyedStateHandle

__all__ = ["DryRunKeyedBackend", "StateOutcome", "is_descriptor_kind"]

#: Handle backends any keyed backend restores (savepoints' canonical format: None) and
#: the columnar files the heap backend writes for SQL operators.
_ANY_BACKEND = (None, "columnar")
#: Kinds of state asked for through descriptors (columnar files name their columns'
#: types instead, row tables ``"rows"``).
_DESCRIPTOR_KINDS = frozenset(STATE_KINDS.values())


@dataclass(frozen=True)
class StateOutcome:
    """What restoring one state does when the new job asks for it.

    ``action``: ``"restore"``, ``"migrate"``, ``"fail"`` (the restore's own rule) or
    ``"new"`` (nothing saved under that name); ``error`` is the restore's error message
    when it fails. ``kind`` and ``descriptor`` are the new job's.

    Example: ``StateOutcome("profile", "value", descriptor, "migrate")``
    """

    name: str
    kind: str
    descriptor: StateDescriptor
    action: str
    error: str = ""


class DryRunKeyedBackend(KeyedStateBackend):
    """See the module docstring. ``state_backend_name`` is the job's backend
    (``"heap"`` or ``"rocksdb"``): handles written by another one are refused the way
    that backend refuses them."""

    def __init__(self, ctx: KeyedBackendContext, *, state_backend_name: str) -> None:
        super().__init__()
        self.ctx = ctx
        self.max_parallelism = ctx.max_parallelism
        self.key_group_range = ctx.key_group_range
        self.NAME = state_backend_name  # type: ignore[misc]
        self._key: Any = None
        self._migrating = False
        #: The outcome of each state the operator asked for, in the order it asked.
        self.outcomes: dict[str, StateOutcome] = {}

    # ------------------------------------------------------------------ restore

    def restore(
        self, handles: list[KeyedStateHandle], *, checkpoint_id: int | None, owned: bool
    ) -> None:
        """Note each handle's saved states (kind and schema); read nothing."""
        for handle in handles:
            if handle.BACKEND not in _ANY_BACKEND:
                self.check_restorable(handle)
            schemas: dict[str, StateSchema] = getattr(handle, "schemas", {})
            kinds: dict[str, str] = getattr(handle, "states", {})
            where = handle.files()[0] if handle.files() else type(handle).__name__
            for name, kind in kinds.items():
                if is_descriptor_kind(kind):
                    self._note_saved(name, kind, schemas.get(name, StateSchema()), where)

    # ------------------------------------------------------------------ the rule

    def _evolve(self, descriptor: StateDescriptor, kind: str) -> None:
        name = descriptor.name
        restored = name in self._saved
        self._migrating = False
        try:
            super()._evolve(descriptor, kind)
        except StateError as err:  # the restore's verdict: recorded, and the check goes on
            self.outcomes[name] = StateOutcome(name, kind, descriptor, "fail", str(err))
            return
        if not restored:
            action = "new"
        else:
            action = "migrate" if self._migrating else "restore"
        self.outcomes[name] = StateOutcome(name, kind, descriptor, action)

    def _migrate(self, descriptor: StateDescriptor, fn: Callable[[Any], Any]) -> None:
        self._migrating = True  # a dry run converts nothing: it notes that it would

    def _create_state(self, descriptor: StateDescriptor, kind: str) -> Any:
        return _InertState(descriptor, is_namespaced(kind))

    def _value_table(self, descriptor: ValueStateDescriptor, namespaced: bool) -> ValueTable:
        return _InertTable(descriptor.name)

    # ------------------------------------------------------------------ keys

    def set_current_key(self, key: Any) -> None:
        self._key = key

    @property
    def current_key(self) -> Any:
        if self._key is None:
            raise StateError("no current key is set on this keyed state backend")
        return self._key

    def keys(self, state_name: str) -> list[Any]:
        _refuse(state_name, "list its keys")

    # ------------------------------------------------------------------ columnar (not modelled)

    def _column_table(self, name: str, schema: Any) -> Any:
        if schema is None:
            return None  # presented as fresh: the check reports saved ones unchecked
        _refuse(name, "make a column table")

    def column_tables(self) -> list[str]:
        return []

    def drop_column_table(self, name: str) -> None:
        _refuse(name, "drop a column table")

    def _row_table(self, name: str, schema: Any) -> Any:
        if schema is None:
            return None
        _refuse(name, "make a row table")

    def row_tables(self) -> list[str]:
        return []

    def drop_row_table(self, name: str) -> None:
        _refuse(name, "drop a row table")

    # ------------------------------------------------------------------ never snapshotted

    def snapshot(self, target: SnapshotTarget) -> SnapshotJob:
        _refuse("*", "snapshot")

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        _refuse("*", "complete a checkpoint")


def is_descriptor_kind(kind: str) -> bool:
    """Whether state of ``kind`` is asked for by a descriptor (and so goes through the
    evolution rule); columnar and row state are not.

    Example: ``is_descriptor_kind("ns-list") and not is_descriptor_kind("rows")``
    """
    return base_kind(kind) in _DESCRIPTOR_KINDS


def _refuse(name: str, what: str) -> NoReturn:
    raise StateError(
        f"state {name!r}: check-upgrade holds no state and cannot {what}; an operator's "
        "open() should declare its state, not use it"
    )


class _InertState:
    """A state object of the dry run: it remembers its descriptor (the base class
    compares it when the same name is asked for again) and refuses any use."""

    def __init__(self, descriptor: StateDescriptor, namespaced: bool) -> None:
        self.descriptor = descriptor
        self.namespaced = namespaced

    def __getattr__(self, attribute: str) -> NoReturn:
        if attribute.startswith("__"):  # protocols (copy, pickle) probe these: not a use
            raise AttributeError(attribute)
        _refuse(self.descriptor.name, f"run {attribute}()")


class _InertTable:
    """A value table of the dry run: empty (timer services list their timers when they
    open), refusing writes."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, key: Any, default: Any = None, /) -> Any:
        return default

    def __setitem__(self, key: Any, value: Any, /) -> None:
        _refuse(self.name, "write a value")

    def delete(self, key: Any, /) -> None:
        _refuse(self.name, "delete a value")

    def touched(self, keys: Iterable[Any], /) -> None:
        _refuse(self.name, "write values")

    def items(self) -> Iterable[tuple[Any, Any]]:
        return []
