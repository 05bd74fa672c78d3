"""The asynchronous part of a heap snapshot: the job that writes the files.

:meth:`HeapKeyedStateBackend.snapshot <epochstream.state.backends.heap.backend.HeapKeyedStateBackend.snapshot>`
(the synchronous part, at the barrier) hands it the entries changed since the base;
on the snapshot thread :meth:`HeapSnapshotJob.run` checks that every key belongs to
the subtask's key groups, then writes a delta file onto the base's chain, a full
file (materialization), or a savepoint in the canonical format. A snapshot whose
delta is the whole state is pickled at the barrier already
(:meth:`HeapSnapshotJob.encode_at_barrier`), so the snapshot thread only writes it.

Example::

    job = backend.snapshot(target)   # task thread: a HeapSnapshotJob
    handle = job.run()               # snapshot thread
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import replace
from itertools import islice
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from epochstream.core.filesystems import storage_fs
from epochstream.core.state_schema import StateSchema, shapes_of_types
from epochstream.core.state_ttl import TtlConfig, TtlValue
from epochstream.exceptions import StateError
from epochstream.state.backends.base import (
    ColumnSchema,
    RowSchema,
    SnapshotJob,
    SnapshotTarget,
    base_kind,
    is_namespaced,
)
from epochstream.state.backends.heap.files import (
    CHUNK_ENTRIES,
    EncodedBlock,
    KeyGroupState,
    apply_segment,
    encode_block,
    merge_chain,
    split_key_groups,
    write_encoded,
)
from epochstream.state.backends.heap.rows import write_row_tables
from epochstream.state.canonical import CanonicalRow, StateMeta, write_canonical
from epochstream.state.columnar_aggregates import write_columnar_state
from epochstream.state.columnar_checks import with_value_type
from epochstream.state.handles import HeapSnapshotHandle, HeapStateFile, KeyedStateHandle
from epochstream.state.keyformat import encode_key

if TYPE_CHECKING:
    from epochstream.state.backends.heap.backend import HeapKeyedStateBackend

__all__ = ["ColumnarSnapshotJob", "HeapSnapshotJob", "RowsSnapshotJob"]


class ColumnarSnapshotJob(SnapshotJob):
    """Writes columnar state, copied at the barrier, as a columnar Arrow file
    (:class:`~epochstream.state.handles.ColumnarSnapshotHandle`): the heap backend's
    column tables, with the value column cast to ``schema``'s type.

    Example::

        job = ColumnarSnapshotJob(table.table(), target, range(0, 64), "sum", table.schema)
        handle = job.run()   # snapshot thread
    """

    def __init__(
        self,
        table: pa.Table,
        target: SnapshotTarget,
        key_groups: range,
        state: str,
        schema: ColumnSchema,
    ) -> None:
        self.table = with_value_type(table, schema.value_type)
        self.target = target
        self.key_groups = key_groups
        self.state = state

    def run(self) -> KeyedStateHandle | None:
        target = self.target
        path = target.fs.join(target.directory, f"{target.name}.columnar.arrow")
        handle = write_columnar_state(
            target.fs, path, self.table, key_groups=self.key_groups, state=self.state
        )
        self.bytes_written = handle.size if handle is not None else 0
        return handle


class RowsSnapshotJob(SnapshotJob):
    """Writes the heap backend's row tables, as they were at the barrier, as one row
    file (:func:`~epochstream.state.backends.heap.rows.write_row_tables`), full each time.

    Example::

        job = RowsSnapshotJob({"left": (schema, table.batches())}, target, range(0, 64))
        handle = job.run()   # snapshot thread
    """

    def __init__(
        self,
        tables: dict[str, tuple[RowSchema, list[pa.RecordBatch]]],
        target: SnapshotTarget,
        key_groups: range,
    ) -> None:
        self.tables = tables
        self.target = target
        self.key_groups = key_groups

    def run(self) -> KeyedStateHandle | None:
        target = self.target
        path = target.fs.join(target.directory, f"{target.name}.rows.arrow")
        handle = write_row_tables(target.fs, path, self.tables, self.key_groups)
        self.bytes_written = handle.size if handle is not None else 0
        return handle


class HeapSnapshotJob(SnapshotJob):
    """Writes a heap snapshot on the snapshot thread (see the module docstring)."""

    def __init__(
        self,
        backend: HeapKeyedStateBackend,
        target: SnapshotTarget,
        delta: dict[str, dict[Any, Any]],
        base: HeapSnapshotHandle | None,
        metas: dict[str, StateMeta],
        ttls: dict[str, TtlConfig],
        *,
        schemas: dict[str, StateSchema],
        complete: bool = False,
    ) -> None:
        self.backend = backend
        self.schemas = schemas
        self.target = target
        self.delta = delta
        self.base = base
        self.metas = metas
        self.ttls = ttls
        # The delta holds every live entry of every state: it is a full snapshot itself.
        self.complete = complete
        # The block of a complete snapshot pickled at the barrier (encode_at_barrier).
        self.encoded: EncodedBlock | None = None

    def _namespaced(self) -> list[str]:
        return [name for name, m in self.metas.items() if is_namespaced(m.kind)]

    def _check_owned(self) -> None:
        """A key outside the backend's key groups was set on the wrong subtask; its
        state would be lost (or restored twice) at the next rescale. Checked a chunk of
        keys at a time (one C call over every key would hold the GIL for milliseconds),
        on the set of a chunk's key groups (at most the subtask's few dozen)."""
        owned = self.backend.key_group_range
        assigner = self.backend.assigner
        for name, entries in self.delta.items():
            namespaced = is_namespaced(self.metas[name].kind)
            keys = iter(entries)  # a chunk at a time: no second list of the whole state
            for _ in range(0, len(entries), CHUNK_ENTRIES):
                part = list(islice(keys, CHUNK_ENTRIES))
                if namespaced:  # (key, namespace) pairs: the key alone places them
                    part = [k[0] for k in part]
                groups = assigner.key_group_set(part)
                if min(groups) < owned.start or max(groups) >= owned.stop:
                    kg, key = next(
                        (g, k) for k in part if (g := assigner.key_group(k)) not in owned
                    )
                    raise StateError(
                        f"state {name!r}: key {key!r:.80} is in key group {kg}, outside this "
                        f"backend's range {owned.start}..{owned.stop - 1}; the key was set on "
                        "the wrong subtask"
                    )

    def encode_at_barrier(self) -> None:
        """Pickle a complete snapshot now, on the task thread, and drop the copy.

        A complete snapshot (every live entry changed since the base, so the delta is
        the whole state) is written whole anyway. Pickled here it costs the task thread
        a few milliseconds more at the barrier (about 100 ns per entry), and leaves the
        snapshot thread only the file to write: no copy of the whole state for the young
        collections to walk while it waits, and no pickling that shares the GIL with the
        task threads for the 50-200 ms it took there (docs/benchmarks.md, "Row latency
        at checkpoints, found"). Not for states with a TTL (expired entries are dropped
        when written). A key outside the key groups is left to :meth:`run`, which fails
        the snapshot as for any other.
        """
        state = {name: entries for name, entries in self.delta.items() if entries}
        if not state:
            return
        try:
            self._check_owned()
        except StateError:
            return
        self.encoded = encode_block(state)
        self.delta = {}

    def _full(self) -> KeyGroupState:
        if self.complete:
            merged = self.delta  # every live entry, no deletions: nothing to merge
        else:
            base = self.base.chain if self.base is not None else ()
            # The chain lives in checkpoint storage; the target (a savepoint) may be elsewhere.
            fs = (
                storage_fs(base[0].path, self.backend.ctx.storage_options)
                if base
                else self.target.fs
            )
            merged = merge_chain(
                fs, base, self.backend.key_group_range, self.backend.assigner, self._namespaced()
            )
            apply_segment(merged, self.delta)
        now = self.backend.ctx.clock.wall()
        for name, ttl in self.ttls.items():
            entries = merged.get(name)
            if entries:
                _drop_expired(entries, self.metas[name].kind, ttl, now)
        return {name: entries for name, entries in merged.items() if entries}

    def run(self) -> KeyedStateHandle | None:
        target = self.target
        backend = self.backend
        self._check_owned()
        if target.savepoint:
            return self._write_canonical(self._full())
        base = self.base
        chain = base.chain if base is not None else ()
        deltas = sum(f.size for f in chain if not f.full)
        full_size = sum(f.size for f in chain if f.full)
        materialize = (
            self.complete
            or not backend.incremental
            or not chain
            or len(chain) >= backend.max_chain
            or deltas > full_size
        )
        kgr = backend.key_group_range
        kinds = {name: m.kind for name, m in self.metas.items()}
        if self.encoded is not None:  # complete, so materialized: pickled at the barrier
            file = self._write(self.encoded, full_file=True)
            handle = HeapSnapshotHandle(kgr, (file,), kinds, self.schemas)
        elif materialize:
            full = self._full()
            handle = HeapSnapshotHandle(kgr, (), kinds, self.schemas)
            if full:
                file = self._write(encode_block(full), full_file=True)
                handle = HeapSnapshotHandle(kgr, (file,), kinds, self.schemas)
        elif any(self.delta.values()):
            changed = {name: entries for name, entries in self.delta.items() if entries}
            delta = self._write(encode_block(changed), full_file=False)
            handle = HeapSnapshotHandle(kgr, (*chain, delta), kinds, self.schemas)
        else:
            assert base is not None
            handle = HeapSnapshotHandle(kgr, chain, kinds, self.schemas)
        backend._record_handle(target.checkpoint_id, handle)
        return handle if handle.chain else None

    def _write(self, block: EncodedBlock, *, full_file: bool) -> HeapStateFile:
        target = self.target
        shared = self.backend.incremental and target.shared_dir is not None
        if shared:
            assert target.shared_dir is not None
            name = f"{target.checkpoint_id}-{target.name}-{uuid.uuid4().hex[:12]}.kst"
            path = target.fs.join(target.shared_dir, name)
        else:
            path = target.fs.join(target.directory, f"{target.name}.kst")
        spans, size = write_encoded(target.fs, path, block, self.backend.key_group_range)
        self.bytes_written += size
        return HeapStateFile(path=path, full=full_file, segments=spans, size=size, shared=shared)

    def _write_canonical(self, state: KeyGroupState) -> KeyedStateHandle | None:
        if not state:
            return None
        full = split_key_groups(state, self.backend.assigner, self._namespaced())
        target = self.target
        path = target.fs.join(target.directory, f"{target.name}.arrow")
        metas = self.metas
        seen: dict[str, set[type]] = {name: set() for name in metas}
        handle = write_canonical(
            target.fs,
            path,
            {name: metas[name] for name in metas},
            ((kg, _rows(full[kg], metas, seen)) for kg in sorted(full)),
            key_groups=self.backend.key_group_range,
        )
        if handle is None:
            self.bytes_written = 0
            return None
        self.bytes_written = handle.size
        # A savepoint records the shapes of the values it holds (core.state_schema).
        schemas = {
            name: StateSchema(self.schemas[name].version, shapes_of_types(seen[name]))
            for name in metas
            if name in self.schemas
        }
        return replace(handle, schemas=schemas)


def _drop_expired(entries: dict[Any, Any], kind: str, ttl: TtlConfig, now: float) -> None:
    kind = base_kind(kind)
    for key in list(entries):
        value = entries[key]
        if kind == "list":
            live = [e for e in value if not ttl.expired(e, now)]
            if live:
                entries[key] = live
            else:
                del entries[key]
        elif kind == "map":
            live_map = {uk: v for uk, v in value.items() if not ttl.expired(v, now)}
            if live_map:
                entries[key] = live_map
            else:
                del entries[key]
        elif ttl.expired(value, now):
            del entries[key]


def _rows(
    segment: KeyGroupState, metas: dict[str, StateMeta], seen: dict[str, set[type]]
) -> list[CanonicalRow]:
    """The canonical rows of one key group's entries; the classes of the values written
    are added to ``seen`` per state."""
    rows: list[CanonicalRow] = []
    for name, entries in sorted(segment.items()):
        meta = metas[name]
        classes = seen[name]
        dumps = meta.serializer.dumps
        namespaced = is_namespaced(meta.kind)
        kind = base_kind(meta.kind)
        for key, value in entries.items():
            ns_bytes = None
            if namespaced:
                key, ns = key
                ns_bytes = encode_key(ns)
            key_bytes = encode_key(key)
            for user_key, element in _elements(kind, value):
                ttl_ts = None
                if type(element) is TtlValue:
                    ttl_ts, element = element.timestamp, element.value
                classes.add(type(element))
                rows.append((name, key_bytes, ns_bytes, user_key, dumps(element), ttl_ts))
    return rows


def _elements(kind: str, value: Any) -> Iterable[tuple[bytes | None, Any]]:
    if kind == "list":
        return ((None, e) for e in value)
    if kind == "map":
        return ((encode_key(uk), v) for uk, v in value.items())
    return ((None, value),)
