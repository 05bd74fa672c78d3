"""The heap state backend: state as Python objects, snapshots proportional to change.

Each state is one dict (``key -> value``) plus the set of keys written since the last
snapshot (see :mod:`~epochstream.state.backends.heap.states`). At a barrier the
synchronous part copies only the entries changed since the latest *completed*
checkpoint (O(changed), not O(state); a table whose keys mostly changed is copied whole
at C speed); the snapshot thread then either

- writes them as a *delta* file and references the completed checkpoint's files
  before it (incremental, the default), or
- merges that chain with the delta into one *full* file ("materialization"): always
  when ``incremental=False``, and in incremental mode whenever the deltas of the chain
  outweigh its full file or the chain reaches ``max_chain`` files.

Delta and materialized files of incremental snapshots go to the job's ``shared/``
directory, since later checkpoints reference them; the coordinator's shared-state
registry deletes them when no retained checkpoint does. Savepoints merge the chain
into the canonical format. Expired TTL entries are dropped whenever state is merged.

Example::

    env.set_state_backend(es.state.HeapStateBackend())            # incremental
    env.set_state_backend(es.state.HeapStateBackend(incremental=False))
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.filesystems import storage_fs
from epochstream.core.serializers import DEFAULT_SERIALIZER
from epochstream.core.state_descriptors import StateDescriptor, ValueStateDescriptor
from epochstream.core.state_schema import StateSchema
from epochstream.core.state_ttl import TtlConfig, TtlValue
from epochstream.exceptions import ConfigurationError, StateError
from epochstream.state.backends.base import (
    NAMESPACED,
    ROWS,
    ColumnSchema,
    KeyedBackendContext,
    KeyedStateBackend,
    RowSchema,
    SnapshotJob,
    SnapshotTarget,
    StateBackend,
    base_kind,
    is_namespaced,
)
from epochstream.state.backends.heap.columns import COLUMNAR, HeapColumnTable
from epochstream.state.backends.heap.files import (
    DELETED,
    merge_chain,
)
from epochstream.state.backends.heap.rows import HeapRowTable, is_row_file, read_row_tables
from epochstream.state.backends.heap.snapshots import (
    ColumnarSnapshotJob,
    HeapSnapshotJob,
    RowsSnapshotJob,
)
from epochstream.state.backends.heap.states import (
    HEAP_STATE_CLASSES,
    NO_KEY,
    HeapTable,
    HeapValueTable,
    KeyContext,
)
from epochstream.state.canonical import (
    StateMeta,
    read_batches,
    read_state_meta,
)
from epochstream.state.columnar_aggregates import (
    accumulator_schema,
    columnar_state_parts,
    read_columnar_state,
    state_file_table,
    state_keys,
    state_of_table,
)
from epochstream.state.columnar_checks import value_type_of
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    ColumnarSnapshotHandle,
    HeapSnapshotHandle,
    KeyedStateHandle,
)
from epochstream.state.keyformat import decode_key
from epochstream.state.keygroups import KeyGroupAssigner, validate_max_parallelism
from epochstream.state.states import copy_value

__all__ = ["HeapKeyedStateBackend", "HeapStateBackend"]

#: State kinds whose stored values change in place: a snapshot copies them. Values of
#: value state are copied on ``update`` and those of built-in value tables are never
#: changed once stored (functions must not change the records they receive), so a
#: snapshot shares them.
#:
#: - list and map state: the backend appends to and puts into the stored container, but
#:   never changes an element (each is a copy made on write, and reads hand out copies),
#:   so a shallow copy of the container is the snapshot's (a deep copy of a list of
#:   dicts per changed key was most of a Nexmark join's synchronous part);
#: - reducing and aggregating state: the user's function gets the stored accumulator
#:   and may change it in place, so it is copied as a whole (``copy_value``).
_CONTAINER_KINDS = frozenset({"list", "map"})
_ACCUMULATOR_KINDS = frozenset({"reducing", "aggregating"})


@dataclass(frozen=True)
class _Written:
    """The keys of one state a snapshot took as written (``every_key``: the table
    stopped tracking, so every key counts as written)."""

    keys: set[Any]
    every_key: bool


@dataclass(frozen=True)
class HeapStateBackend(StateBackend):
    """Keyed state in Python dicts on the slot's heap (the default backend).

    ``incremental`` (default True): checkpoints write only what changed, chaining
    deltas onto earlier files; ``max_chain``: deltas before a full file is written.

    Example::

        env.set_state_backend(es.state.HeapStateBackend(incremental=False))
    """

    NAME: ClassVar[str] = "heap"
    incremental: bool = True
    max_chain: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.max_chain, int) or self.max_chain < 1:
            raise ConfigurationError(f"max_chain must be a positive int, got {self.max_chain!r}")

    def create(self, ctx: KeyedBackendContext) -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(ctx, incremental=self.incremental, max_chain=self.max_chain)


class HeapKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one operator subtask in dicts (see the module docstring)."""

    NAME: ClassVar[str] = "heap"

    def __init__(
        self, ctx: KeyedBackendContext, *, incremental: bool = True, max_chain: int = 16
    ) -> None:
        super().__init__()
        validate_max_parallelism(ctx.max_parallelism)
        kgr = ctx.key_group_range
        if kgr.step != 1 or kgr.start < 0 or kgr.stop > ctx.max_parallelism:
            raise StateError(
                f"key group range {kgr} does not fit max_parallelism {ctx.max_parallelism}"
            )
        self.ctx = ctx
        self.max_parallelism = ctx.max_parallelism
        self.key_group_range = kgr
        self.incremental = incremental
        self.max_chain = max_chain
        self.assigner = KeyGroupAssigner.shared(ctx.max_parallelism)
        self._key = KeyContext()
        self._tables: dict[str, HeapTable] = {}
        self._columns: dict[str, HeapColumnTable] = {}
        self._rows: dict[str, HeapRowTable] = {}
        # What snapshot n took per state, until a completed checkpoint covers it.
        self._unconfirmed: dict[int, dict[str, _Written]] = {}
        # Handles of snapshots whose files are written (filled by the snapshot thread).
        self._handles: dict[int, HeapSnapshotHandle] = {}
        self._base: tuple[int, HeapSnapshotHandle] | None = None

    # ------------------------------------------------------------------ access

    def set_current_key(self, key: Any) -> None:
        self._key.key = key

    @property
    def current_key(self) -> Any:
        key = self._key.key
        if key is NO_KEY:
            raise StateError("no current key is set on this keyed state backend")
        return key

    def _table(self, name: str, kind: str, descriptor: StateDescriptor | None) -> HeapTable:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = HeapTable(name, kind, descriptor)
            return table
        if table.kind != kind:
            raise StateError(
                f"state {name!r} is registered (or restored) as {table.kind} state, cannot "
                f"use it as {kind} state"
            )
        if descriptor is not None and table.descriptor is None:
            _adopt_ttl(table, descriptor.ttl_config, self.ctx.clock.wall())
            table.descriptor = descriptor
            table.serializer = descriptor.value_serializer
            table.ttl = descriptor.ttl_config
        return table

    def _create_state(self, descriptor: StateDescriptor, kind: str) -> Any:
        table = self._table(descriptor.name, kind, descriptor)
        return HEAP_STATE_CLASSES[kind](table, self._key, self.ctx.clock)

    def _value_table(self, descriptor: ValueStateDescriptor, namespaced: bool) -> HeapValueTable:
        kind = NAMESPACED + "value" if namespaced else "value"
        return self._table(descriptor.name, kind, descriptor).data

    def _column_table(self, name: str, schema: ColumnSchema | None) -> HeapColumnTable | None:
        table = self._columns.get(name)
        if schema is None:
            return table
        if table is None:
            table = self._columns[name] = HeapColumnTable(name, schema)
        else:
            table.set_schema(schema)
        return table

    def column_tables(self) -> list[str]:
        return list(self._columns)

    def drop_column_table(self, name: str) -> None:
        self._columns.pop(name, None)

    def _row_table(self, name: str, schema: RowSchema | None) -> HeapRowTable | None:
        table = self._rows.get(name)
        if table is None and schema is not None:
            table = self._rows[name] = HeapRowTable(name, schema)
        return table

    def row_tables(self) -> list[str]:
        return list(self._rows)

    def drop_row_table(self, name: str) -> None:
        self._rows.pop(name, None)

    def keys(self, state_name: str) -> list[Any]:
        table = self._tables.get(state_name)
        return [] if table is None else list(table.data)

    # ------------------------------------------------------------------ snapshots

    def _adopt_base(self, base_id: int | None) -> None:
        if base_id is None:
            return
        handle = self._handles.get(base_id)
        if handle is None:
            return  # not ours (e.g. restored from elsewhere): keep what we had
        self._base = (base_id, handle)
        for n in [n for n in self._unconfirmed if n <= base_id]:
            del self._unconfirmed[n]
        for n in [n for n in self._handles if n < base_id]:
            del self._handles[n]

    def snapshot(self, target: SnapshotTarget) -> SnapshotJob:
        if self._rows:
            return self._snapshot_rows(target)
        if self._columns:
            return self._snapshot_columns(target)
        self._adopt_base(target.base_checkpoint_id)
        taken: dict[str, _Written] = {}
        delta: dict[str, dict[Any, Any]] = {}
        whole: dict[str, set[Any]] = {}  # states whose delta holds every live entry: changed keys
        memo: dict[int, Any] = {}
        for name, table in self._tables.items():
            data = table.data
            written = _Written(set(table.dirty), table.all_dirty)
            table.dirty.clear()
            table.all_dirty = False
            if written.keys or written.every_key:
                taken[name] = written
            # Changed since the base: written now, or by snapshots not yet confirmed.
            earlier = [
                taken_then[name] for taken_then in self._unconfirmed.values() if name in taken_then
            ]
            changed = written.keys.union(*(e.keys for e in earlier)) if earlier else written.keys
            every_key = written.every_key or any(e.every_key for e in earlier)
            if every_key or (len(changed) >= len(data) and changed.issuperset(data)):
                whole[name] = changed
                delta[name] = self._copy_entries(table, data, memo)
            elif changed:
                delta[name] = self._copy_entries(table, changed, memo)
        self._unconfirmed[target.checkpoint_id] = taken
        metas = {
            name: StateMeta(t.kind, t.serializer or DEFAULT_SERIALIZER)
            for name, t in self._tables.items()
        }
        ttls = {name: t.ttl for name, t in self._tables.items() if t.ttl is not None}
        schemas = {name: self.schema_of(name) for name in self._tables}
        base = self._base[1] if self._base is not None else None
        complete = len(whole) == len(self._tables)
        if not complete:
            # Merged onto the base chain: keys gone since the base need their deletion.
            # Only then: finding them costs a lookup per changed key, a third of the
            # synchronous part of a table whose keys all changed.
            for name, changed in whole.items():
                gone = changed.difference(self._tables[name].data)
                delta[name].update(zip(gone, repeat(DELETED)))
        job = HeapSnapshotJob(
            self, target, delta, base, metas, ttls, schemas=schemas, complete=complete
        )
        if complete and not ttls and not target.savepoint:
            job.encode_at_barrier()
        return job

    def _snapshot_rows(self, target: SnapshotTarget) -> SnapshotJob:
        """Row tables: the row file, full each time; the batches are immutable, so the
        barrier only takes the lists of them."""
        if self._tables or self._columns:
            # A columnar join or session operator keeps only row tables; the snapshot
            # formats (heap chain, columnar file, row file) do not share one handle.
            raise StateError(
                "the heap backend holds row tables and other state in one operator: "
                f"rows {sorted(self._rows)}, other {sorted([*self._tables, *self._columns])}"
            )
        tables = {name: (t.schema, t.batches()) for name, t in self._rows.items()}
        return RowsSnapshotJob(tables, target, self.key_group_range)

    def _snapshot_columns(self, target: SnapshotTarget) -> SnapshotJob:
        """Columnar state: the columnar Arrow file, full each time (the format columnar
        state had before it moved behind the backend, so older checkpoints restore)."""
        if self._tables:
            # A columnar operator keeps only columnar state; the two snapshot formats
            # (heap chain, columnar file) do not share one handle.
            raise StateError(
                "the heap backend holds columnar and row state in one operator: "
                f"columnar {sorted(self._columns)}, row {sorted(self._tables)}"
            )
        states = {state_of_table(name) for name in self._columns}
        if len(states) > 1:
            raise StateError(
                f"the heap backend snapshots one columnar state per operator (with its "
                f"windows), not {sorted(states)}"
            )
        tables = [(name, table.table()) for name, table in self._columns.items()]
        schema = next(iter(self._columns.values())).schema
        return ColumnarSnapshotJob(
            state_file_table(tables), target, self.key_group_range, states.pop(), schema
        )

    @staticmethod
    def _copy_entries(
        table: HeapTable, keys: Iterable[Any], memo: dict[int, Any]
    ) -> dict[Any, Any]:
        """The entries of ``keys`` as the snapshot keeps them (absent ones as deleted)."""
        data = table.data
        kind = base_kind(table.kind)
        if kind in _CONTAINER_KINDS:
            return {k: (data[k].copy() if k in data else DELETED) for k in keys}
        if kind in _ACCUMULATOR_KINDS:
            return {k: (_snapshot_copy(data[k], memo) if k in data else DELETED) for k in keys}
        # Never changed in place once stored: the snapshot may share the objects.
        if keys is data:
            return dict(data)
        return dict(zip(keys, map(data.get, keys, repeat(DELETED)), strict=True))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._adopt_base(checkpoint_id)

    def _record_handle(self, checkpoint_id: int, handle: HeapSnapshotHandle) -> None:
        # Called on the snapshot thread; dict assignment is atomic.
        self._handles[checkpoint_id] = handle

    # ------------------------------------------------------------------ restore

    def restore(
        self, handles: list[KeyedStateHandle], *, checkpoint_id: int | None, owned: bool
    ) -> None:
        owned_groups = self.key_group_range
        for handle in handles:
            self.check_restorable(handle)
            fs = storage_fs(handle.files()[0] if handle.files() else "/", self.ctx.storage_options)
            if is_row_file(handle):
                assert isinstance(handle, ColumnarSnapshotHandle)
                self._restore_rows(handle)
            elif isinstance(handle, ColumnarSnapshotHandle):
                self._restore_columns(handle)
            elif isinstance(handle, HeapSnapshotHandle):
                namespaced = [n for n, kind in handle.states.items() if is_namespaced(kind)]
                merged = merge_chain(fs, handle.chain, owned_groups, self.assigner, namespaced)
                for name, entries in merged.items():
                    kind = handle.states.get(name, "value")
                    self._restored_table(name, kind).data.update(entries)
                self._note_schemas(handle.states, handle.schemas, handle.files())
            elif isinstance(handle, CanonicalSnapshotHandle):
                self._restore_canonical(fs, handle)
                self._note_schemas(handle.states, handle.schemas, handle.files())
            else:
                raise StateError(f"cannot restore a {type(handle).__name__} into the heap backend")
        heap = [h for h in handles if isinstance(h, HeapSnapshotHandle)]
        continues = (
            owned
            and checkpoint_id is not None
            and len(handles) == 1
            and len(heap) == 1
            and heap[0].key_groups == owned_groups
        )
        if continues:
            assert checkpoint_id is not None
            self._handles[checkpoint_id] = heap[0]
            self._base = (checkpoint_id, heap[0])
        else:
            # Not a chain of our own: the first snapshot must hold everything.
            for table in self._tables.values():
                table.all_dirty = True

    def _note_schemas(
        self, kinds: dict[str, str], schemas: dict[str, StateSchema], files: list[str]
    ) -> None:
        for name, kind in kinds.items():
            if kind not in (COLUMNAR, ROWS):
                self._note_saved(name, kind, schemas.get(name, StateSchema()), files[0])

    def _migrate(self, descriptor: StateDescriptor, fn: Any) -> None:
        table = self._tables.get(descriptor.name)
        if table is None:
            return
        kind = base_kind(table.kind)
        data = table.data
        for key, value in list(data.items()):
            if kind == "list":
                data[key] = [_migrated(fn, e) for e in value]
            elif kind == "map":
                data[key] = {uk: _migrated(fn, v) for uk, v in value.items()}
            else:
                data[key] = _migrated(fn, value)
        table.all_dirty = True  # the next snapshot writes every migrated value

    def check_restorable(self, handle: KeyedStateHandle) -> None:
        if not isinstance(handle, ColumnarSnapshotHandle):  # columnar files are the heap's
            super().check_restorable(handle)

    def _restore_rows(self, handle: ColumnarSnapshotHandle) -> None:
        options = self.ctx.storage_options
        fs_of = lambda path: storage_fs(path, options)  # noqa: E731
        for name, schema, rows in read_row_tables(fs_of, handle, self.key_group_range):
            table = self.row_table(name, schema)
            assert table is not None
            for batch in rows.to_batches():
                table.append(batch.drop_columns([KG_COLUMN]), batch.column(KG_COLUMN).to_numpy())

    def _restore_columns(self, handle: ColumnarSnapshotHandle) -> None:
        options = self.ctx.storage_options
        rows = read_columnar_state(
            lambda path: storage_fs(path, options), [handle], self.key_group_range, handle.path
        )
        if rows is None:
            return
        name = next(iter(handle.states), "")
        for table_name, part in columnar_state_parts(name, rows, handle.path):
            keys = state_keys(part, handle.path).combine_chunks()
            table = self._columns.get(table_name)
            if table is None:
                schema = accumulator_schema(name, part.column("acc").type, value_type_of(part))
                table = self._columns[table_name] = HeapColumnTable(table_name, schema)
            table.load(part, keys)

    def _restored_table(self, name: str, kind: str | None = None) -> HeapTable:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = HeapTable(name, kind or "value")
        elif kind is not None and table.kind != kind and table.data:
            raise StateError(f"state {name!r} restored as {kind} and as {table.kind} state")
        elif kind is not None:
            table.kind = kind
        return table

    def _restore_canonical(self, fs: Any, handle: CanonicalSnapshotHandle) -> None:
        metas = read_state_meta(fs, handle.path)
        columnar = {n for n, m in metas.items() if m.kind in (COLUMNAR, ROWS)}
        entries: dict[str, list[tuple[Any, int, Any]]] = {n: [] for n in columnar}
        for _kg, batch in read_batches(fs, handle, self.key_group_range):
            if columnar:
                batch = self._columnar_rows(batch, metas, entries)
            columns = batch.to_pydict()
            for name, key, ns, user_key, value, ttl_ts in zip(
                columns["state"],
                columns["key"],
                columns["namespace"],
                columns["user_key"],
                columns["value"],
                columns["ttl_ts"],
                strict=True,
            ):
                meta = metas.get(name)
                if meta is None:
                    raise StateError(f"{handle.path}: rows of state {name!r} without metadata")
                table = self._restored_table(name, meta.kind)
                table.serializer = meta.serializer
                k = decode_key(key)
                if ns is not None:
                    k = (k, decode_key(ns))
                v = meta.serializer.loads(value)
                if ttl_ts is not None:
                    v = TtlValue.of(v, ttl_ts)
                kind = base_kind(meta.kind)
                if kind == "list":
                    table.data.setdefault(k, []).append(v)
                elif kind == "map":
                    assert user_key is not None
                    table.data.setdefault(k, {})[decode_key(user_key)] = v
                else:
                    table.data[k] = v
        for name in columnar:
            schema = metas[name].serializer
            if isinstance(schema, RowSchema):
                self._load_rows(name, schema, entries[name])
                continue
            if not isinstance(schema, ColumnSchema):
                raise StateError(f"{handle.path}: columnar state {name!r} without its schema")
            self._load_columnar(name, schema, entries[name])

    @staticmethod
    def _columnar_rows(
        batch: pa.RecordBatch,
        metas: dict[str, StateMeta],
        entries: dict[str, list[tuple[Any, int, Any]]],
    ) -> pa.RecordBatch:
        """Take the rows of columnar states and row tables (a RocksDB savepoint's) out
        of ``batch``."""
        names = batch.column("state").to_pylist()
        mine = [n in entries for n in names]
        if not any(mine):
            return batch
        rows = batch.filter(pa.array(mine)).to_pydict()
        for name, key, kg, value in zip(
            rows["state"], rows["key"], rows["key_group"], rows["value"], strict=True
        ):
            entries[name].append((decode_key(key), kg, metas[name].serializer.loads(value)))
        return batch.filter(pa.array([not m for m in mine]))

    def _load_rows(
        self, name: str, schema: RowSchema, rows: list[tuple[Any, int, pa.RecordBatch]]
    ) -> None:
        table = self.row_table(name, schema)
        assert table is not None
        for _key, kg, batch in rows:
            table.append(batch, np.full(batch.num_rows, kg, dtype=np.int32))

    def _load_columnar(
        self, name: str, schema: ColumnSchema, rows: list[tuple[Any, int, tuple[Any, ...]]]
    ) -> None:
        table = self._columns.get(name)
        if table is None:
            table = self._columns[name] = HeapColumnTable(name, schema)
        if not rows:
            return
        keys, kgs, values = zip(*rows, strict=True)
        fields = {f: np.array([v[i] for v in values]) for i, f in enumerate(schema.names)}
        table.write(pa.array(list(keys)), np.array(kgs, dtype=np.int32), fields)


def _migrated(fn: Any, stored: Any) -> Any:
    """``fn`` of a stored value, keeping its TTL timestamp."""
    if type(stored) is TtlValue:
        return TtlValue.of(fn(stored.value), stored.timestamp)
    return fn(stored)


def _snapshot_copy(value: Any, memo: dict[int, Any]) -> Any:
    if type(value) is TtlValue:
        inner = copy_value(value.value, memo)
        return value if inner is value.value else TtlValue.of(inner, value.timestamp)
    return copy_value(value, memo)


def _adopt_ttl(table: HeapTable, ttl: TtlConfig | None, now: float) -> None:
    """Restored entries take the TTL setting of the descriptor now registering them."""
    if not table.data:
        return
    wrap = ttl is not None

    def convert(v: Any) -> Any:
        is_wrapped = type(v) is TtlValue
        if wrap and not is_wrapped:
            return TtlValue.of(v, now)
        if not wrap and is_wrapped:
            return v.value
        return v

    kind = base_kind(table.kind)
    for key, value in list(table.data.items()):
        if kind == "list":
            table.data[key] = [convert(e) for e in value]
        elif kind == "map":
            table.data[key] = {uk: convert(v) for uk, v in value.items()}
        else:
            table.data[key] = convert(value)
