"""The RocksDB state backend: keyed state on the slot's local disk, larger than memory.

Each keyed operator subtask owns one RocksDB database (through ``rocksdict``) in the
slot's scratch directory, one column family per state (key layout in
:mod:`~epochstream.state.backends.rocksdb.states`). The write-ahead log is off: state
is recovered from checkpoints, never from the local disk.

Snapshots:

- synchronous part: a RocksDB checkpoint (memtables flushed, SST files hard-linked)
  into the scratch directory;
- asynchronous part (incremental, the default): upload only the SST files that the
  latest *completed* checkpoint does not already hold, into the job's ``shared/``
  directory, plus the small per-checkpoint files (MANIFEST, CURRENT, OPTIONS) into the
  checkpoint's own directory. The coordinator's shared-state registry deletes an SST
  once no retained checkpoint references it. ``incremental=False`` uploads every file
  into the checkpoint directory each time;
- savepoints: the checkpoint is read back and written in the canonical format.

Restore downloads the files (checking size and CRC-32) and opens the database; a
rescale instead copies the key-group ranges the subtask now owns out of each old
database. Uploaded files are named ``<checkpoint>-<operator>-<subtask>-<random>.sst``:
SST numbers restart after a restore, so names alone would clash across runs.

Example::

    env.set_state_backend(es.state.RocksDBStateBackend(incremental=True, block_cache_mb=64))
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from epochstream.core.arrow import KG
from epochstream.core.filesystems import storage_fs
from epochstream.core.serializers import DEFAULT_SERIALIZER, Serializer
from epochstream.core.state_descriptors import StateDescriptor, ValueStateDescriptor
from epochstream.core.state_schema import StateSchema
from epochstream.core.storage_faults import READ_RETRY, read_error
from epochstream.exceptions import ConfigurationError, CorruptStateError, StateError
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
from epochstream.state.backends.heap.columns import COLUMNAR as HEAP_COLUMNAR
from epochstream.state.backends.heap.rows import is_row_file, read_row_tables
from epochstream.state.backends.rocksdb.columns import RocksColumnTable
from epochstream.state.backends.rocksdb.files import META_CF, crc_file, encode_meta, read_meta
from epochstream.state.backends.rocksdb.rows import RocksRowTable
from epochstream.state.backends.rocksdb.snapshots import RocksSnapshotJob
from epochstream.state.backends.rocksdb.states import (
    NO_KEY,
    ROCKS_STATE_CLASSES,
    KeyAccess,
    RocksColumn,
    decode_prefix,
    encode_prefix,
    encode_value,
    key_group_bounds,
    split_value,
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
    state_keys,
)
from epochstream.state.columnar_checks import value_type_of
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    ColumnarSnapshotHandle,
    KeyedStateHandle,
    RocksDBSnapshotHandle,
    StateFile,
)
from epochstream.state.keyformat import decode_key, encode_key
from epochstream.state.keygroups import KeyGroupAssigner, validate_max_parallelism

if TYPE_CHECKING:
    pass

__all__ = ["COLUMNAR", "RocksDBKeyedStateBackend", "RocksDBStateBackend"]

#: The kind of columnar state in the meta column family (its serializer: the schema);
#: the heap backend's constant, so savepoints name it alike.
COLUMNAR = HEAP_COLUMNAR

log = logging.getLogger(__name__)

#: Key encodings a value table remembers (then it starts over).
_DB_KEY_CACHE = 1 << 16


@dataclass(frozen=True)
class RocksDBStateBackend(StateBackend):
    """Keyed state in RocksDB on each slot's local disk.

    ``incremental`` (default True): checkpoints upload only new SST files.
    ``block_cache_mb``/``write_buffer_mb`` bound the memory of each operator subtask's
    database; state beyond them lives on disk.

    Example::

        env.set_state_backend(es.state.RocksDBStateBackend(block_cache_mb=32))
    """

    NAME: ClassVar[str] = "rocksdb"
    incremental: bool = True
    block_cache_mb: int = 64
    write_buffer_mb: int = 16

    def __post_init__(self) -> None:
        for name in ("block_cache_mb", "write_buffer_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"RocksDBStateBackend.{name} must be an int >= 1")

    def create(self, ctx: KeyedBackendContext) -> RocksDBKeyedStateBackend:
        return RocksDBKeyedStateBackend(ctx, self)


class _RocksValueTable:
    """Batch access to a value state by explicit key (no current key); with
    ``namespaced`` the keys are ``(key, namespace)`` pairs."""

    def __init__(self, column: RocksColumn, key_group: Any, namespaced: bool = False) -> None:
        self._col = column
        self._key_group = key_group
        self._namespaced = namespaced
        self._cf = column.cf
        self._dumps = column.serializer.dumps
        self._loads = column.serializer.loads
        self._db_keys: dict[Any, bytes] = {}

    def _encode(self, key: Any) -> bytes:
        if self._namespaced:
            k, ns = key
            return encode_prefix(self._key_group(k), encode_key(k), encode_key(ns))
        return encode_prefix(self._key_group(key), encode_key(key))

    def _db_key(self, key: Any) -> bytes:
        # Encoding a key costs more than the RocksDB write; a built-in operator reads
        # then writes each key, and hot keys recur: remember recent encodings.
        try:
            db_key = self._db_keys.get(key)
        except TypeError:  # unhashable (a list): encoded every time
            return self._encode(key)
        if db_key is None:
            db_key = self._encode(key)
            if len(self._db_keys) >= _DB_KEY_CACHE:
                self._db_keys.clear()
            self._db_keys[key] = db_key
        return db_key

    def get(self, key: Any, default: Any = None) -> Any:
        stored = self._cf.get(self._db_key(key))
        if stored is None:
            return default
        return self._loads(split_value(stored)[0])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._cf.put(self._db_key(key), encode_value(self._dumps(value), None))

    def delete(self, key: Any) -> None:
        self._cf.delete(self._db_key(key))

    def touched(self, keys: Iterable[Any]) -> None:
        """Nothing to do: every write is in the database already."""

    def items(self) -> Iterator[tuple[Any, Any]]:
        for db_key, stored in list(self._cf.items()):
            _kg, key, ns, _rest = decode_prefix(db_key)
            entry = (decode_key(key), decode_key(ns)) if self._namespaced else decode_key(key)
            yield entry, self._loads(split_value(stored)[0])


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one operator subtask in a local RocksDB (see the module docstring)."""

    NAME: ClassVar[str] = "rocksdb"

    def __init__(self, ctx: KeyedBackendContext, config: RocksDBStateBackend) -> None:
        import rocksdict

        super().__init__()
        validate_max_parallelism(ctx.max_parallelism)
        self._rd = rocksdict
        self.ctx = ctx
        self.config = config
        self.max_parallelism = ctx.max_parallelism
        self.key_group_range = ctx.key_group_range
        self.assigner = KeyGroupAssigner.shared(ctx.max_parallelism)
        self._access = KeyAccess()
        self._access.key_group = self.assigner.key_group
        if not ctx.local_dir:
            raise ConfigurationError("the RocksDB backend needs a local directory for its database")
        self._root = ctx.local_dir
        if os.path.exists(self._root):
            shutil.rmtree(self._root)  # left by an earlier backend of this subtask in this process
        os.makedirs(self._root)
        self._db_path = os.path.join(self._root, "db")
        self._cache = rocksdict.Cache(config.block_cache_mb << 20)
        self._write = rocksdict.WriteOptions()
        self._write.disable_wal = True  # type: ignore[method-assign,assignment]  # a property
        self._db: Any = None
        self._columns: dict[str, RocksColumn] = {}
        # Files uploaded for each snapshot (snapshot thread), and for the latest completed one.
        self._uploads: dict[int, dict[str, StateFile]] = {}
        self._base: dict[str, StateFile] = {}
        self._snapshots = 0

    # ------------------------------------------------------------------ database

    def _options(self) -> Any:
        rd = self._rd
        options = rd.Options(raw_mode=True)
        options.create_if_missing(True)
        table = rd.BlockBasedOptions()
        table.set_block_cache(self._cache)
        # Index and filter blocks stay out of the block cache: the cache is split into
        # shards, and a large SST's filter bigger than a shard would be re-read from disk
        # on every lookup. Outside it they cost about a tenth of the data in memory.
        table.set_cache_index_and_filter_blocks(False)
        table.set_bloom_filter(10, False)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_size(self.config.write_buffer_mb << 20)
        options.set_max_write_buffer_number(2)
        options.set_keep_log_file_num(2)
        return options

    def _open(self, path: str, *, read_only: bool = False) -> Any:
        rd = self._rd
        names = [n for n in rd.Rdict.list_cf(path) if n != "default"] if os.path.isdir(path) else []
        families = {n: self._options() for n in names}
        access = rd.AccessType.read_only(False) if read_only else rd.AccessType.read_write()
        db = rd.Rdict(path, self._options(), column_families=families or None, access_type=access)
        if not read_only:
            db.set_write_options(self._write)
        return db

    def _ensure_db(self) -> Any:
        if self._db is None:
            self._db = self._open(self._db_path)
        return self._db

    def _column(self, name: str, kind: str, descriptor: StateDescriptor | None) -> RocksColumn:
        column = self._columns.get(name)
        serializer = descriptor.value_serializer if descriptor is not None else DEFAULT_SERIALIZER
        ttl = descriptor.ttl_config if descriptor is not None else None
        if column is None:
            db = self._ensure_db()
            try:
                cf = db.get_column_family(name)
            except Exception:  # rocksdict raises a bare Exception for a missing family
                cf = db.create_column_family(name, self._options())
            cf.set_write_options(self._write)
            column = self._columns[name] = RocksColumn(name, kind, cf, serializer, ttl)
            self._remember(column)
            return column
        if column.kind != kind:
            raise StateError(
                f"state {name!r} is registered (or restored) as {column.kind} state, cannot "
                f"use it as {kind} state"
            )
        if descriptor is not None:
            if column.serializer != serializer:
                self._reserialize(column, serializer)
                column.serializer = serializer
                self._remember(column)
            column.ttl = ttl
        return column

    def _restored_column(self, name: str, kind: str, serializer: Any) -> RocksColumn:
        """State ``name`` with a restored serializer, recorded as such in the meta column
        family (``_column`` records the default serializer of a new state: a later
        snapshot of a restored row table then could not be restored)."""
        column = self._column(name, kind, None)
        if column.serializer is not serializer:
            column.serializer = serializer
            self._remember(column)
        return column

    def _remember(self, column: RocksColumn) -> None:
        """Record the state's kind and serializer in the database (restores need them)."""
        self._meta_cf()[column.name.encode("utf-8")] = encode_meta(column.kind, column.serializer)

    def _meta_cf(self) -> Any:
        db = self._ensure_db()
        try:
            return db.get_column_family(META_CF)
        except Exception:  # a missing family raises a bare Exception
            cf = db.create_column_family(META_CF, self._options())
            cf.set_write_options(self._write)
            return cf

    def _reserialize(self, column: RocksColumn, serializer: Serializer, fn: Any = None) -> None:
        """Rewrite a restored state's values: read with its saved serializer, ``fn``
        applied (a migration), written with ``serializer``."""
        old = column.serializer
        cf = column.cf
        batch = self._rd.WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._ensure_db().get_column_family_handle(column.name))
        for db_key, stored in cf.items():
            data, ts = split_value(stored)
            if base_kind(column.kind) == "list" and len(decode_prefix(db_key)[3]) == 0:
                continue  # a list's element counter
            value = old.loads(data)
            if fn is not None:
                value = fn(value)
            batch.put(db_key, encode_value(serializer.dumps(value), ts))
            if batch.len() >= 10_000:  # bounded memory (iterators read a snapshot)
                self._db.write(batch, self._write)
                batch = self._rd.WriteBatch(raw_mode=True)
                batch.set_default_column_family(self._db.get_column_family_handle(column.name))
        self._db.write(batch, self._write)

    def _migrate(self, descriptor: StateDescriptor, fn: Any) -> None:
        column = self._columns.get(descriptor.name)
        if column is not None:
            serializer = descriptor.value_serializer
            self._reserialize(column, serializer, fn)
            column.serializer = serializer
            self._remember(column)

    # ------------------------------------------------------------------ access

    def set_current_key(self, key: Any) -> None:
        access = self._access
        access.key = key
        access.prefix_cache = None

    @property
    def current_key(self) -> Any:
        key = self._access.key
        if key is NO_KEY:
            raise StateError("no current key is set on this keyed state backend")
        return key

    def _create_state(self, descriptor: StateDescriptor, kind: str) -> Any:
        column = self._column(descriptor.name, kind, descriptor)
        state_class: Any = ROCKS_STATE_CLASSES[kind]
        return state_class(column, self._access, self.ctx.clock, descriptor)

    def _value_table(self, descriptor: ValueStateDescriptor, namespaced: bool) -> _RocksValueTable:
        kind = NAMESPACED + "value" if namespaced else "value"
        column = self._column(descriptor.name, kind, descriptor)
        return _RocksValueTable(column, self.assigner.key_group, namespaced)

    def _column_table(self, name: str, schema: ColumnSchema | None) -> RocksColumnTable | None:
        column = self._columns.get(name)
        if schema is None:
            if column is None:
                return None
            return RocksColumnTable(column, self._db, self._write, self._remember)
        if column is None:
            column = self._column(name, COLUMNAR, None)
            column.serializer = schema
            self._remember(column)
        elif column.kind != COLUMNAR:
            raise StateError(
                f"state {name!r} is registered (or restored) as {column.kind} state, cannot "
                "use it as columnar state"
            )
        table = RocksColumnTable(column, self._db, self._write, self._remember)
        table.set_schema(schema)
        return table

    def column_tables(self) -> list[str]:
        return [name for name, column in self._columns.items() if column.kind == COLUMNAR]

    def _row_table(self, name: str, schema: RowSchema | None) -> RocksRowTable | None:
        column = self._columns.get(name)
        if column is None:
            if schema is None:
                return None
            column = self._column(name, ROWS, None)
            column.serializer = schema
            self._remember(column)
        elif column.kind != ROWS:
            raise StateError(
                f"state {name!r} is registered (or restored) as {column.kind} state, cannot "
                "use it as a row table"
            )
        return RocksRowTable(column, self._db, self._write, self.key_group_range)

    def row_tables(self) -> list[str]:
        return [name for name, column in self._columns.items() if column.kind == ROWS]

    def drop_row_table(self, name: str) -> None:
        self._drop(name)

    def drop_column_table(self, name: str) -> None:
        self._drop(name)

    def _drop(self, name: str) -> None:
        column = self._columns.pop(name, None)
        if column is None:
            return
        column.cf = None  # the family's handle must be gone before the family is dropped
        self._meta_cf().delete(name.encode("utf-8"))
        self._ensure_db().drop_column_family(name)

    def keys(self, state_name: str) -> list[Any]:
        column = self._columns.get(state_name)
        if column is None:
            return []
        namespaced = is_namespaced(column.kind)
        keys: list[Any] = []
        last = None
        for db_key in column.cf.keys():
            _kg, key, ns, _rest = decode_prefix(bytes(db_key))
            entry = (key, ns) if namespaced else key
            if entry != last:
                keys.append((decode_key(key), decode_key(ns)) if namespaced else decode_key(key))
                last = entry
        return keys

    # ------------------------------------------------------------------ snapshots

    def snapshot(self, target: SnapshotTarget) -> SnapshotJob:
        base_id = target.base_checkpoint_id
        if base_id is not None and base_id in self._uploads:
            self._base = self._uploads[base_id]
            for n in [n for n in self._uploads if n < base_id]:
                del self._uploads[n]
        db = self._ensure_db()
        self._snapshots += 1
        local = os.path.join(self._root, f"snapshot-{target.checkpoint_id}-{self._snapshots}")
        checkpoint = self._rd.Checkpoint(db)
        try:
            checkpoint.create_checkpoint(local)
        finally:
            del checkpoint  # it keeps the database open otherwise
        kinds = {name: c.kind for name, c in self._columns.items()}
        metas = {name: StateMeta(c.kind, c.serializer) for name, c in self._columns.items()}
        ttls = {name: c.ttl for name, c in self._columns.items()}
        schemas = {
            name: self.schema_of(name)
            for name, kind in kinds.items()
            if kind not in (COLUMNAR, ROWS)
        }
        return RocksSnapshotJob(
            self, target, local, dict(self._base), kinds, metas, ttls, schemas=schemas
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        uploaded = self._uploads.get(checkpoint_id)
        if uploaded is not None:
            self._base = uploaded

    # ------------------------------------------------------------------ restore

    def restore(
        self, handles: list[KeyedStateHandle], *, checkpoint_id: int | None, owned: bool
    ) -> None:
        for handle in handles:
            self.check_restorable(handle)
            if isinstance(handle, RocksDBSnapshotHandle | CanonicalSnapshotHandle):
                for name, kind in handle.states.items():
                    if kind not in (COLUMNAR, ROWS):
                        schema = handle.schemas.get(name, StateSchema())
                        self._note_saved(name, kind, schema, handle.files()[0])
        mine = self.key_group_range
        rocks = [h for h in handles if isinstance(h, RocksDBSnapshotHandle)]
        whole = len(handles) == 1 and len(rocks) == 1 and rocks[0].key_groups == mine
        if whole:
            self._download(rocks[0], self._db_path)
            self._db = self._open(self._db_path)
            self._load_columns()
            if owned and checkpoint_id is not None:
                self._base = dict(rocks[0].db_files)
                self._uploads[checkpoint_id] = self._base
            return
        self._ensure_db()
        for handle in handles:
            if isinstance(handle, RocksDBSnapshotHandle):
                self._copy_ranges(handle)
            elif is_row_file(handle):
                assert isinstance(handle, ColumnarSnapshotHandle)
                self._restore_row_file(handle)
            elif isinstance(handle, ColumnarSnapshotHandle):
                self._restore_columnar_file(handle)
            elif isinstance(handle, CanonicalSnapshotHandle):
                self._restore_canonical(handle)
            else:
                raise StateError(f"cannot restore a {type(handle).__name__} into RocksDB")
        self._load_columns()

    def check_restorable(self, handle: KeyedStateHandle) -> None:
        # The heap backend's columnar files are canonical for columnar state: read here too.
        if not isinstance(handle, ColumnarSnapshotHandle):
            super().check_restorable(handle)

    def _restore_row_file(self, handle: ColumnarSnapshotHandle) -> None:
        """A heap backend's row tables: the rows of this subtask's key groups."""
        options = self.ctx.storage_options
        fs_of = lambda path: storage_fs(path, options)  # noqa: E731
        for name, schema, rows in read_row_tables(fs_of, handle, self.key_group_range):
            table = self.row_table(name, schema)
            assert table is not None
            for batch in rows.to_batches():
                table.append(batch.drop_columns([KG]), batch.column(KG).to_numpy())

    def _restore_columnar_file(self, handle: ColumnarSnapshotHandle) -> None:
        """A heap backend's columnar state file (or a checkpoint of columnar state from
        before it moved behind the backend): its key groups of this subtask's range."""
        options = self.ctx.storage_options
        rows = read_columnar_state(
            lambda path: storage_fs(path, options), [handle], self.key_group_range, handle.path
        )
        if rows is None:
            return
        name = next(iter(handle.states), "")
        for table_name, part in columnar_state_parts(name, rows, handle.path):
            schema = accumulator_schema(name, part.column("acc").type, value_type_of(part))
            table = self._column_table(table_name, schema)
            assert table is not None
            keys = state_keys(part, handle.path).combine_chunks()
            values = {f: part.column(f).to_numpy() for f in schema.names}
            table.write(keys, part.column(KG).to_numpy(), values)

    def _load_columns(self) -> None:
        for name, meta in read_meta(self._meta_cf()).items():
            if name not in self._columns:
                self._restored_column(name, meta.kind, meta.serializer)

    def _download(self, handle: RocksDBSnapshotHandle, into: str) -> None:
        os.makedirs(into, exist_ok=True)
        for name, file in handle.db_files.items():
            fs = storage_fs(file.path, self.ctx.storage_options)
            local = os.path.join(into, name)
            try:
                READ_RETRY.run(
                    lambda: fs.download(file.path, local),  # noqa: B023 (run at once)
                    what="download RocksDB file",
                    path=file.path,
                )
            except OSError as err:
                raise read_error(err, what="download RocksDB file", path=file.path) from err
            size = os.path.getsize(local)
            if size != file.size or (file.crc is not None and crc_file(local) != file.crc):
                raise CorruptStateError(
                    f"RocksDB file {file.path}: size or checksum differs from the snapshot's "
                    f"(got {size} bytes, expected {file.size}); the file is corrupt",
                    path=file.path,
                )

    def _copy_ranges(self, handle: RocksDBSnapshotHandle) -> None:
        """Copy the key groups of this subtask's range out of another subtask's database."""
        scratch = os.path.join(self._root, f"restore-{uuid.uuid4().hex}")
        self._download(handle, scratch)
        source = self._open(scratch, read_only=True)
        try:
            lo, hi = key_group_bounds(
                max(self.key_group_range.start, handle.key_groups.start),
                min(self.key_group_range.stop, handle.key_groups.stop),
            )
            meta = source.get_column_family(META_CF)
            metas = read_meta(meta)
            for name, state_meta in metas.items():
                src = source.get_column_family(name)
                dst = self._restored_column(name, state_meta.kind, state_meta.serializer)
                options = self._rd.ReadOptions()
                options.set_iterate_upper_bound(hi)
                batch = self._rd.WriteBatch(raw_mode=True)
                batch.set_default_column_family(self._ensure_db().get_column_family_handle(name))
                for db_key, value in src.items(from_key=lo, read_opt=options):
                    batch.put(db_key, value)
                    if batch.len() >= 10_000:
                        self._db.write(batch, self._write)
                        batch = self._rd.WriteBatch(raw_mode=True)
                        batch.set_default_column_family(self._db.get_column_family_handle(name))
                self._db.write(batch, self._write)
                del src, dst
            del meta
        finally:
            source.close()
            shutil.rmtree(scratch)

    def _restore_canonical(self, handle: CanonicalSnapshotHandle) -> None:
        fs = storage_fs(handle.path, self.ctx.storage_options)
        metas = read_state_meta(fs, handle.path)
        for name, meta in metas.items():
            self._restored_column(name, meta.kind, meta.serializer)
        for _kg, batch in read_batches(fs, handle, self.key_group_range):
            columns = batch.to_pydict()
            counters: dict[tuple[str, bytes], int] = {}
            for name, key, ns, user_key, value, ttl_ts, kg in zip(
                columns["state"],
                columns["key"],
                columns["namespace"],
                columns["user_key"],
                columns["value"],
                columns["ttl_ts"],
                columns["key_group"],
                strict=True,
            ):
                column = self._columns[name]
                prefix = encode_prefix(kg, key, ns or b"")
                stored = encode_value(value, ttl_ts)
                kind = base_kind(column.kind)
                if kind in ("list", ROWS):
                    seq = counters.get((name, prefix), 0)
                    column.cf.put(prefix + struct.pack(">Q", seq), stored)
                    counters[(name, prefix)] = seq + 1
                    column.cf.put(prefix, struct.pack(">Q", seq + 1))
                elif kind == "map":
                    assert user_key is not None
                    column.cf.put(prefix + user_key, stored)
                else:
                    column.cf.put(prefix, stored)

    def dispose(self) -> None:
        self._state_objects.clear()
        for column in self._columns.values():
            column.cf = None
        self._columns.clear()
        if self._db is not None:
            self._db.close()
            self._db = None
        try:
            shutil.rmtree(self._root)
        except OSError as exc:  # local scratch only; state lives in checkpoints
            log.warning("cannot remove RocksDB directory %s: %r", self._root, exc)

    # ------------------------------------------------------------------ canonical rows
