"""The keyed-state backend interface every operator, timer and aggregation goes through.

A :class:`StateBackend` is the user's choice (``env.set_state_backend(...)``): small,
picklable configuration shipped to the slots. Each keyed operator subtask gets its own
:class:`KeyedStateBackend` from it, owning the key groups of its range. The two
implementations (heap and RocksDB) behave the same through this interface, which is
what the shared test suite checks.

Access:

- ``set_current_key(key)`` selects the key that state objects from ``get_state``
  (Flink's ValueState, ListState, MapState, ReducingState, AggregatingState) read and
  write; ``value_table(descriptor)`` is the batch-level path of built-in operators
  (``table.get(key)`` and ``table[key] = value``, then ``touched(keys)`` once per batch).
- Values returned to user code are the caller's to change: changing one changes
  state only through ``update``/``put``/``add`` (both backends behave so).

Snapshots (docs/architecture.md, State): ``snapshot(target)`` is the synchronous part, run
at the barrier on the task thread; it returns a :class:`SnapshotJob` whose ``run()``
writes files on the snapshot thread and returns the keyed state handle. Incremental
snapshots build on the latest *completed* checkpoint, whose id travels with the
barrier (``target.base_checkpoint_id``), so a late completion notice never makes a
snapshot reference files that retention already deleted.

Example::

    backend = HeapStateBackend().create(ctx)
    count = backend.get_state(ValueStateDescriptor("count", default=0))
    backend.set_current_key("user-7")
    count.update(count.value() + 1)
    job = backend.snapshot(target)          # task thread, at the barrier
    handle = job.run()                      # snapshot thread
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa

from epochstream.core.clock import Clock
from epochstream.core.state_descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from epochstream.core.state_schema import StateSchema, evolve
from epochstream.exceptions import StateError, short_repr
from epochstream.state.handles import KeyedStateHandle

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS

__all__ = [
    "COLUMN_KEY",
    "NAMESPACED",
    "NAMESPACED_KINDS",
    "ROWS",
    "STATE_KINDS",
    "ColumnSchema",
    "ColumnTable",
    "KeyedBackendContext",
    "KeyedStateBackend",
    "RowSchema",
    "RowTable",
    "SnapshotJob",
    "SnapshotTarget",
    "StateBackend",
    "ValueTable",
    "base_kind",
    "is_namespaced",
    "kind_of",
]

#: State kind of each descriptor type, as recorded in snapshots.
STATE_KINDS: dict[type[StateDescriptor], str] = {
    ValueStateDescriptor: "value",
    ListStateDescriptor: "list",
    MapStateDescriptor: "map",
    ReducingStateDescriptor: "reducing",
    AggregatingStateDescriptor: "aggregating",
}


def kind_of(descriptor: StateDescriptor) -> str:
    """``"value"``, ``"list"``, ``"map"``, ``"reducing"`` or ``"aggregating"``."""
    kind = STATE_KINDS.get(type(descriptor))
    if kind is None:
        raise StateError(f"unsupported state descriptor {type(descriptor).__name__}")
    return kind


#: Prefix of the kinds of namespaced state (``"ns-value"``, ``"ns-list"``): entries are
#: per (key, namespace), the namespace being a window or a timer.
NAMESPACED = "ns-"
#: The kinds a namespaced state may have.
NAMESPACED_KINDS = frozenset({"value", "list"})


def is_namespaced(kind: str) -> bool:
    """True for the kinds of namespaced state. Example: ``is_namespaced("ns-list")``."""
    return kind.startswith(NAMESPACED)


def base_kind(kind: str) -> str:
    """How entries of ``kind`` are stored: ``base_kind("ns-list") == "list"``."""
    return kind[len(NAMESPACED) :] if kind.startswith(NAMESPACED) else kind


@dataclass(frozen=True)
class KeyedBackendContext:
    """Where a keyed backend runs: its operator and subtask, key groups, clock, scratch dir.

    Example::

        KeyedBackendContext(operator_uid="counts", subtask=0, max_parallelism=128,
                            key_group_range=range(0, 64), clock=SystemClock(), local_dir="/tmp/s0")
    """

    operator_uid: str
    subtask: int
    max_parallelism: int
    key_group_range: range
    clock: Clock
    local_dir: str
    #: Endpoint and credentials of object-store checkpoint storage (see ``storage_fs``).
    storage_options: dict[str, Any] | None = None


@dataclass(frozen=True)
class SnapshotTarget:
    """Where one snapshot goes.

    ``directory`` holds files private to this snapshot (``chk-<n>/`` or a savepoint
    directory); ``shared_dir`` (checkpoints only) holds files later checkpoints may
    reference. ``savepoint`` asks for the canonical, self-contained format.
    ``base_checkpoint_id`` is the latest checkpoint completed when this one was
    triggered: an incremental snapshot builds on that one's files.
    """

    fs: StorageFS
    checkpoint_id: int
    directory: str
    shared_dir: str | None
    name: str
    savepoint: bool = False
    base_checkpoint_id: int | None = None


class SnapshotJob(ABC):
    """The asynchronous part of one keyed snapshot (runs on the snapshot thread)."""

    #: Bytes ``run`` wrote (an incremental snapshot reuses earlier files).
    bytes_written: int = 0

    @abstractmethod
    def run(self) -> KeyedStateHandle | None:
        """Write the files; the handle describing them (``None``: no state)."""


class ValueTable(Protocol):
    """Batch-level access to one value state, for built-in operators (no current key).

    ``get`` and item assignment act at once (on the heap backend the table is the
    state's dict, so they cost what a dict's do); ``touched(keys)`` must follow once
    per batch with the keys written, before the next snapshot (it is how the heap
    backend knows what changed without a per-record hook).

    Example::

        table = backend.value_table(ValueStateDescriptor("_sum"))
        for k, v in pairs:
            table[k] = table.get(k, 0) + v
        table.touched([k for k, _ in pairs])
    """

    def get(self, key: Any, default: Any = None, /) -> Any:
        """The value of ``key``, or ``default``."""

    def __setitem__(self, key: Any, value: Any, /) -> None:
        """Store ``value`` for ``key``."""

    def delete(self, key: Any, /) -> None:
        """Remove ``key`` (no-op when absent)."""

    def touched(self, keys: Iterable[Any], /) -> None:
        """Declare the keys written since the last call."""

    def items(self) -> Iterable[tuple[Any, Any]]:
        """Every ``(key, value)`` of this subtask's key groups (do not write meanwhile)."""


#: The key column of :meth:`ColumnTable.table` (and of columnar state files).
COLUMN_KEY = "_key"


@dataclass(frozen=True)
class ColumnSchema:
    """The accumulators of one columnar state: fixed-width NumPy fields, each with the
    identity a key has before its first update, and the aggregated column's Arrow type.

    It is also the state's serializer (``dumps``/``loads`` of one entry's tuple of
    field values), so backends that record a serializer per state (RocksDB) keep the
    schema with the state and offline readers decode entries with it.

    Example::

        schema = ColumnSchema((("acc", "int64", 0), ("count", "int64", 0)), pa.int64())
        schema.loads(schema.dumps((5, 2))) == (5, 2)
    """

    #: ``(name, NumPy dtype name, identity)`` of each field.
    fields: tuple[tuple[str, str, Any], ...]
    value_type: pa.DataType | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The field names, in order. Example: ``schema.names == ("acc", "count")``."""
        return tuple(f[0] for f in self.fields)

    @property
    def record(self) -> np.dtype:
        """The packed little-endian record of one entry (fixed width, no padding)."""
        return np.dtype([(name, np.dtype(kind).newbyteorder("<")) for name, kind, _ in self.fields])

    def identities(self, n: int) -> dict[str, np.ndarray]:
        """``n`` entries at their identities. Example: ``schema.identities(2)["acc"]``."""
        return {name: np.full(n, identity, dtype=kind) for name, kind, identity in self.fields}

    def dumps(self, value: Any) -> bytes:
        """One entry's field values (a tuple, in field order) packed."""
        record = np.zeros(1, dtype=self.record)
        for name, v in zip(self.names, value, strict=True):
            record[name] = v
        return record.tobytes()

    def loads(self, data: bytes) -> tuple[Any, ...]:
        """The field values of one packed entry."""
        record = np.frombuffer(bytes(data), dtype=self.record)[0]
        return tuple(record[name].item() for name in self.names)


class ColumnTable(ABC):
    """Batch access to one columnar state: accumulators per key, read and written for a
    whole batch's distinct keys at once (columnar operators; no current key).

    ``keys`` is an Arrow array of distinct keys and ``key_groups`` their key groups
    (:func:`~epochstream.state.column_keygroups.key_groups_of_column`); values are one
    NumPy array per schema field, aligned with ``keys``.

    Example::

        table = backend.column_table("sum", schema)
        acc = table.read(keys, kgs)                  # missing keys: the identities
        acc["acc"] += partial_sums
        table.write(keys, kgs, acc)
        table.table().column("_key")                 # every entry (firing, tests)
    """

    name: str

    @property
    @abstractmethod
    def schema(self) -> ColumnSchema:
        """The accumulator fields and the aggregated column's type."""

    @abstractmethod
    def set_schema(self, schema: ColumnSchema) -> None:
        """Adopt ``schema`` (the operator's: the identities of new keys, the value type)."""

    @abstractmethod
    def read(self, keys: pa.Array, key_groups: np.ndarray) -> dict[str, np.ndarray]:
        """The accumulators of ``keys`` (the identities for keys without an entry)."""

    @abstractmethod
    def write(self, keys: pa.Array, key_groups: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Store ``values`` as the accumulators of ``keys`` (one call per batch)."""

    @abstractmethod
    def table(self) -> pa.Table:
        """Every entry as columns ``_kg``, ``_key`` and the fields (a copy)."""

    @abstractmethod
    def __len__(self) -> int:
        """The number of keys with an entry."""


#: The state kind of row tables (RocksDB meta column family, savepoints, heap files).
ROWS = "rows"


@dataclass(frozen=True)
class RowSchema:
    """The rows of one row table: their Arrow schema and the column holding each row's
    key (the rows of a key are stored, read and deleted together).

    It is also the state's serializer (``dumps``/``loads`` of a record batch of such
    rows, as an Arrow IPC message without the schema), so RocksDB records it with the
    state and savepoints carry the rows as those bytes.

    Example::

        schema = RowSchema(pa.schema([("id", pa.int64()), ("name", pa.string())]), key="id")
        batch = pa.record_batch([pa.array([7]), pa.array(["ann"])], schema=schema.schema)
        schema.loads(schema.dumps(batch)).equals(batch)
    """

    schema: pa.Schema
    key: str

    def conform(self, rows: pa.RecordBatch) -> pa.RecordBatch:
        """``rows`` in this schema (columns selected in order and cast); a batch that
        does not fit is a :class:`StateError` naming the difference."""
        if rows.schema.equals(self.schema):
            return rows
        try:
            return rows.select(self.schema.names).cast(self.schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            raise StateError(
                f"rows with columns {rows.schema.names} do not fit the row table's schema "
                f"{self.schema}: {exc}"
            ) from exc

    def dumps(self, rows: pa.RecordBatch) -> bytes:
        """``rows`` (in this schema) as one Arrow IPC record batch message."""
        return rows.serialize().to_pybytes()

    def loads(self, data: bytes) -> pa.RecordBatch:
        """The rows of one :meth:`dumps`."""
        return pa.ipc.read_record_batch(pa.py_buffer(data), self.schema)


class RowTable(ABC):
    """Batch access to one table of keyed rows: Arrow rows appended under their key
    (the schema's key column), read back and taken out per key, for whole batches of keys
    at once (columnar joins' buffered rows, session windows' open sessions).

    ``key_groups`` are the key groups of the rows (``append``) or of the distinct
    ``keys`` (``read``, ``pop``); they need not be the key's own (a table may file
    rows under another key, as long as they go with a key of that group). A table whose
    key column is uint64 is also a queue by key: :meth:`pop_until` takes out every row
    up to a key (session windows file their keys by the time their sessions are due).

    Example::

        table = backend.row_table("left", RowSchema(batch.schema, key="id"))
        table.append(batch, key_groups_of_column(batch["id"], 128))
        table.read(pa.array([7]), key_groups_of_column(pa.array([7]), 128))  # a pa.Table
        table.pop(pa.array([7]), key_groups_of_column(pa.array([7]), 128))    # read and removed
    """

    name: str

    @property
    @abstractmethod
    def schema(self) -> RowSchema:
        """The rows' schema and key column."""

    @abstractmethod
    def append(self, rows: pa.RecordBatch, key_groups: np.ndarray) -> None:
        """Keep ``rows`` (in :attr:`schema`), each under its key; ``key_groups`` per row."""

    @abstractmethod
    def read(self, keys: pa.Array, key_groups: np.ndarray) -> pa.Table:
        """Every row of the distinct ``keys`` (in the order they were appended per key)."""

    @abstractmethod
    def pop(self, keys: pa.Array, key_groups: np.ndarray) -> pa.Table:
        """Remove and return every row of the distinct ``keys`` (a read and delete in
        one: what an operator that rewrites its keys' rows needs)."""

    @abstractmethod
    def pop_until(self, bound: int) -> pa.Table:
        """Remove and return the rows whose key is at most ``bound`` (a uint64 key
        column: a queue by key)."""

    @abstractmethod
    def table(self) -> pa.Table:
        """Every row, with its key group as a first column ``_kg`` (snapshots, tests)."""

    @abstractmethod
    def __len__(self) -> int:
        """The number of rows held."""


class KeyedStateBackend(ABC):
    """Keyed state of one operator in one subtask (see the module docstring)."""

    #: ``"heap"`` or ``"rocksdb"``: which snapshot handles it can restore.
    NAME: ClassVar[str]

    ctx: KeyedBackendContext
    max_parallelism: int
    key_group_range: range

    def __init__(self) -> None:
        self._state_objects: dict[str, Any] = {}
        # Restored states not yet asked for: their saved kind and schema (state_schema).
        self._saved: dict[str, tuple[str, StateSchema]] = {}
        # The schema of each state asked for with a descriptor (what snapshots record).
        self._schemas: dict[str, StateSchema] = {}
        self._class_changes: dict[str, list[str]] = {}

    @abstractmethod
    def set_current_key(self, key: Any) -> None:
        """Select the key that state objects read and write (per record)."""

    @property
    @abstractmethod
    def current_key(self) -> Any:
        """The current key; :class:`StateError` when none is set."""

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The state object for ``descriptor``, bound to the current key.

        The same name always gives the same object; asking for it with another kind of
        descriptor raises :class:`StateError`.
        """
        states = self._state_objects
        existing = states.get(descriptor.name)
        if existing is not None:
            if type(existing.descriptor) is not type(descriptor) or existing.namespaced:
                raise StateError(
                    f"state {descriptor.name!r} is registered as "
                    f"{type(existing.descriptor).__name__}, cannot get it as "
                    f"{type(descriptor).__name__}"
                )
            return existing
        kind = kind_of(descriptor)
        self._evolve(descriptor, kind)
        state = states[descriptor.name] = self._create_state(descriptor, kind)
        return state

    def get_namespaced_state(self, descriptor: StateDescriptor) -> Any:
        """A value or list state scoped to the current key *and* a namespace.

        Windows and timers keep their state this way: ``state.set_namespace(ns)``
        selects the namespace (a hashable value with a canonical encoding, such as a
        window) before each access; the entries of one key in different namespaces are
        independent. ``keys(name)`` of such a state lists ``(key, namespace)`` pairs.

        Example::

            contents = backend.get_namespaced_state(ValueStateDescriptor("contents"))
            backend.set_current_key("user-7")
            contents.set_namespace(TimeWindow(0, 5000))
            contents.update(3)
        """
        kind = kind_of(descriptor)
        if kind not in NAMESPACED_KINDS:
            raise StateError(f"state {descriptor.name!r}: namespaced state is value or list state")
        states = self._state_objects
        existing = states.get(descriptor.name)
        if existing is not None:
            if type(existing.descriptor) is not type(descriptor) or not existing.namespaced:
                raise StateError(
                    f"state {descriptor.name!r} is registered as another kind of state"
                )
            return existing
        self._evolve(descriptor, NAMESPACED + kind)
        state = states[descriptor.name] = self._create_state(descriptor, NAMESPACED + kind)
        return state

    # ------------------------------------------------------------------ schema evolution

    def _note_saved(self, name: str, kind: str, schema: StateSchema, where: str) -> None:
        """Restore: state ``name`` was saved as ``kind`` with ``schema`` (by ``where``).
        Parts of one state restored from several snapshot files must agree."""
        known = self._saved.get(name)
        if known is not None and known[1].version != schema.version:
            raise StateError(
                f"operator {self._uid()!r}, state {name!r}: the restored files disagree on its "
                f"version ({known[1].version} and {schema.version} in {where})"
            )
        shapes = schema.shapes | (known[1].shapes if known is not None else frozenset())
        self._saved[name] = (kind, StateSchema(schema.version, shapes))

    def set_class_changes(self, changes: dict[str, list[str]]) -> None:
        """The job master's finding, per restored state, of the value classes whose fields
        changed since the snapshot (:func:`~epochstream.core.state_schema.class_changes`).

        Example: ``backend.set_class_changes({"profile": ["__main__:Profile: field 'email' added"]})``
        """
        self._class_changes = dict(changes)

    def schema_of(self, name: str) -> StateSchema:
        """The schema a snapshot records for state ``name``: its descriptor's version, or
        what was restored when no descriptor asked for it in this run."""
        schema = self._schemas.get(name)
        if schema is not None:
            return schema
        saved = self._saved.get(name)
        return saved[1] if saved is not None else StateSchema()

    def _evolve(self, descriptor: StateDescriptor, kind: str) -> None:
        """The first ask for a restored state: restore it as saved, migrate its values, or
        fail at once (:func:`~epochstream.core.state_schema.evolve`)."""
        name = descriptor.name
        saved = self._saved.pop(name, None)
        if saved is None:
            self._schemas.setdefault(name, StateSchema(descriptor.version))
            return
        saved_kind, schema = saved
        verdict = evolve(
            saved_kind=saved_kind,
            saved=schema,
            kind=kind,
            version=descriptor.version,
            migrate=descriptor.migrate,
            changes=self._class_changes.get(name, []),
        )
        if verdict.action == "fail":
            self._saved[name] = saved
            error = StateError(
                f"operator {self._uid()!r}, state {name!r}: cannot restore it: {verdict.reason}"
            )
            error.suppress_restarts = True  # every attempt restores the same state
            raise error
        if verdict.action == "migrate":
            self._migrate(descriptor, _Migration(self._uid(), descriptor, schema.version))
            self._schemas[name] = StateSchema(descriptor.version)
        else:  # restored as saved: the saved values keep their shapes
            self._schemas[name] = StateSchema(descriptor.version, schema.shapes)

    def _uid(self) -> str:
        return self.ctx.operator_uid

    @abstractmethod
    def _migrate(self, descriptor: StateDescriptor, fn: Callable[[Any], Any]) -> None:
        """Replace every restored value of ``descriptor``'s state (list elements, map
        values) by ``fn(value)``, stored as the descriptor stores values, so the next
        snapshot holds only migrated values."""

    @abstractmethod
    def _create_state(self, descriptor: StateDescriptor, kind: str) -> Any:
        """A new state object of ``kind`` for ``descriptor`` (``kind`` may be namespaced)."""

    def value_table(
        self, descriptor: ValueStateDescriptor, *, namespaced: bool = False
    ) -> ValueTable:
        """Batch-level access to a value state (for built-in operators; no TTL).

        With ``namespaced=True`` the table's keys are ``(key, namespace)`` pairs (a
        window's accumulator of a key, a timer): a namespaced value state.
        """
        if descriptor.ttl is not None:
            raise StateError(f"value table {descriptor.name!r}: TTL is for user state only")
        self._evolve(descriptor, NAMESPACED + "value" if namespaced else "value")
        return self._value_table(descriptor, namespaced)

    @abstractmethod
    def _value_table(self, descriptor: ValueStateDescriptor, namespaced: bool) -> ValueTable:
        """The backend's value table of ``descriptor``."""

    def column_table(self, name: str, schema: ColumnSchema | None = None) -> ColumnTable | None:
        """The columnar state ``name`` (columnar operators' batch access).

        With ``schema`` the table is made if new and adopts ``schema`` if it exists
        (restored); without, it is the existing (restored) table or ``None``, whose
        ``schema`` tells what the restored state holds.

        Example::

            restored = backend.column_table("sum")      # None on a fresh start
            table = backend.column_table("sum", schema)
        """
        return self._column_table(name, schema)

    @abstractmethod
    def _column_table(self, name: str, schema: ColumnSchema | None) -> ColumnTable | None:
        """The backend's column table ``name`` (see :meth:`column_table`)."""

    @abstractmethod
    def column_tables(self) -> list[str]:
        """The names of the columnar states held (restored ones included): a window
        operator finds its open windows' tables by them.

        Example: ``backend.column_tables() == ["sum@0", "sum@5000"]``
        """

    @abstractmethod
    def drop_column_table(self, name: str) -> None:
        """Remove columnar state ``name`` and its entries (a fired window's)."""

    def row_table(self, name: str, schema: RowSchema | None = None) -> RowTable | None:
        """The row table ``name`` (columnar joins and session windows).

        With ``schema`` the table is made if new (a restored one must hold rows of the
        same schema); without, it is the existing (restored) table or ``None``.

        Example::

            sessions = backend.row_table("sessions")            # None on a fresh start
            sessions = backend.row_table("sessions", RowSchema(schema, key="_key"))
        """
        table = self._row_table(name, schema)
        if (
            table is not None
            and schema is not None
            and not table.schema.schema.equals(schema.schema)
        ):
            raise StateError(
                f"row table {name!r} holds rows of schema {table.schema.schema}, not "
                f"{schema.schema}; give the new operator another uid"
            )
        return table

    @abstractmethod
    def _row_table(self, name: str, schema: RowSchema | None) -> RowTable | None:
        """The backend's row table ``name`` (see :meth:`row_table`)."""

    @abstractmethod
    def row_tables(self) -> list[str]:
        """The names of the row tables held (restored ones included).

        Example: ``backend.row_tables() == ["left@0", "right@0"]``
        """

    @abstractmethod
    def drop_row_table(self, name: str) -> None:
        """Remove row table ``name`` and its rows (a fired window's).

        Example: ``backend.drop_row_table("left@0")``
        """

    @abstractmethod
    def keys(self, state_name: str) -> list[Any]:
        """The keys with a value in ``state_name`` (a new list); ``(key, namespace)``
        pairs for namespaced state."""

    @abstractmethod
    def snapshot(self, target: SnapshotTarget) -> SnapshotJob:
        """Synchronous part of a snapshot (task thread, at the barrier)."""

    @abstractmethod
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: later snapshots may build on it."""

    @abstractmethod
    def restore(
        self, handles: list[KeyedStateHandle], *, checkpoint_id: int | None, owned: bool
    ) -> None:
        """Load this subtask's key groups from ``handles`` (before any access).

        ``owned``: the files belong to this job's checkpoint ``checkpoint_id``, so
        snapshots may keep building on them; otherwise the first snapshot is
        self-contained.
        """

    def dispose(self) -> None:  # noqa: B027 - optional hook
        """Release resources (files, native handles); the backend is not used afterwards."""

    def check_restorable(self, handle: KeyedStateHandle) -> None:
        """Raise :class:`StateError` when ``handle`` was written by another backend."""
        if handle.BACKEND is not None and handle.BACKEND != self.NAME:
            error = StateError(
                f"this state was snapshotted by the {handle.BACKEND} backend and cannot be "
                f"restored by the {self.NAME} backend: take a savepoint (the canonical "
                "format both read) and start the new job from it"
            )
            error.suppress_restarts = True  # every attempt would restore the same state
            raise error


class _Migration:
    """``descriptor.migrate(value, old_version)``, its errors naming the operator, the
    state and the value (a bug in the function: restarting would fail the same way)."""

    def __init__(self, uid: str, descriptor: StateDescriptor, old_version: int) -> None:
        assert descriptor.migrate is not None
        self.uid, self.name, self.old = uid, descriptor.name, old_version
        self.fn = descriptor.migrate

    def __call__(self, value: Any) -> Any:
        try:
            return self.fn(value, self.old)
        except Exception as err:  # any failure of user code: name the place, keep the cause
            error = StateError(
                f"operator {self.uid!r}, state {self.name!r}: migrate= raised "
                f"{type(err).__name__}: {err} on a value saved at version {self.old}: "
                f"{short_repr(value, 120)}"
            )
            error.suppress_restarts = True
            raise error from err


class StateBackend(ABC):
    """The user's choice of keyed-state backend (picklable configuration).

    Example::

        env.set_state_backend(es.state.RocksDBStateBackend(incremental=True))
    """

    NAME: ClassVar[str]
    incremental: bool

    @abstractmethod
    def create(self, ctx: KeyedBackendContext) -> KeyedStateBackend:
        """A keyed backend for one operator subtask."""
