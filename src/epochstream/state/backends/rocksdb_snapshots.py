"""RocksDB snapshots: uploading a database checkpoint, writing it as a savepoint, and
reading a snapshot's database offline.

Example::

    job = RocksSnapshotJob(backend, target, local_checkpoint_dir, base_files, kinds, metas, ttls)
    handle = job.run()          # on the snapshot thread
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import uuid
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import cloudpickle

from epochstream.core.storage_faults import unavailable_or
from epochstream.exceptions import StateError
from epochstream.state.backends.base import SnapshotJob, SnapshotTarget, base_kind
from epochstream.state.backends.rocksdb_states import decode_prefix, key_group_bounds, split_value
from epochstream.state.canonical import CanonicalRow, StateMeta, write_canonical
from epochstream.state.handles import KeyedStateHandle, RocksDBSnapshotHandle, StateFile
from epochstream.state.keyformat import decode_key
from epochstream.state.ttl import TtlConfig

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS

__all__ = [
    "META_CF",
    "RocksSnapshotJob",
    "canonical_rows",
    "crc_file",
    "read_database_rows",
    "read_meta",
]

#: The column family recording each state's kind and serializer.
META_CF = "__epochstream_meta"
_SST = ".sst"


def crc_file(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def read_meta(meta_cf: Any) -> dict[str, StateMeta]:
    """Kind and serializer of every state of a database (its meta column family)."""
    metas = {}
    for name, raw in list(meta_cf.items()):
        doc = json.loads(raw)
        serializer = cloudpickle.loads(base64.b64decode(doc["serializer"]))
        metas[name.decode("utf-8")] = StateMeta(doc["kind"], serializer)
    return metas



def encode_meta(kind: str, serializer: Any) -> bytes:
    """The meta column family's value for a state."""
    doc = {"kind": kind, "serializer": base64.b64encode(cloudpickle.dumps(serializer)).decode("ascii")}
    return json.dumps(doc).encode("utf-8")


def read_database_rows(path: str, state_name: str) -> Iterator[tuple[Any, ...]]:
    """Offline: ``(key, value, key group, namespace, user key, ttl)`` of one state of the
    RocksDB database (checkpoint files) at ``path``, opened read-only."""
    import rocksdict

    raw = rocksdict.Options(raw_mode=True)
    names = [n for n in rocksdict.Rdict.list_cf(path) if n != "default"]
    families = {n: rocksdict.Options(raw_mode=True) for n in names}
    access = rocksdict.AccessType.read_only(False)
    db = rocksdict.Rdict(path, raw, column_families=families, access_type=access)
    try:
        meta_cf = db.get_column_family(META_CF)
        meta = read_meta(meta_cf).get(state_name)
        del meta_cf
        if meta is None:
            return
        cf = db.get_column_family(state_name)
        entries: list[Any] = list(cf.items())
        for db_key, stored in entries:
            kg, key, ns, rest = decode_prefix(db_key)
            kind = base_kind(meta.kind)
            if kind == "list" and not rest:
                continue  # the element counter
            data, ts = split_value(stored)
            user_key = decode_key(rest) if kind == "map" else None
            namespace = decode_key(ns) if ns else None
            yield (decode_key(key), meta.serializer.loads(data), kg, namespace, user_key, ts)
        del cf
    finally:
        db.close()


def canonical_rows(
    db: Any, kinds: dict[str, str], ttls: dict[str, TtlConfig | None], kg: int, now: float
) -> list[CanonicalRow]:
    """Every entry of key group ``kg`` in ``db`` as canonical rows (expired ones left out)."""
    import rocksdict

    rows: list[CanonicalRow] = []
    lo, hi = key_group_bounds(kg, kg + 1)
    for name, state_kind in sorted(kinds.items()):
        kind = base_kind(state_kind)
        ttl = ttls.get(name)
        cf = db.get_column_family(name)
        options = rocksdict.ReadOptions()
        options.set_iterate_upper_bound(hi)
        for db_key, stored in cf.items(from_key=lo, read_opt=options):
            _kg, key, ns, rest = decode_prefix(db_key)
            if kind == "list" and not rest:
                continue  # the element counter
            data, ts = split_value(stored)
            if ttl is not None and ts is not None and now - ts >= ttl.seconds:
                continue
            user_key = rest if kind == "map" else None
            rows.append((name, key, ns or None, user_key, data, ts))
        del cf
    return rows




class RocksSnapshotJob(SnapshotJob):
    """Uploads a RocksDB checkpoint (or writes it as a savepoint) on the snapshot thread."""

    def __init__(
        self,
        backend: Any,
        target: SnapshotTarget,
        local: str,
        base: dict[str, StateFile],
        kinds: dict[str, str],
        metas: dict[str, StateMeta],
        ttls: dict[str, TtlConfig | None],
    ) -> None:
        self.backend = backend
        self.target = target
        self.local = local
        self.base = base
        self.kinds = kinds
        self.metas = metas
        self.ttls = ttls

    def run(self) -> KeyedStateHandle | None:
        try:
            if self.target.savepoint:
                return self._savepoint()
            return self._upload()
        finally:
            shutil.rmtree(self.local)

    def _upload(self) -> KeyedStateHandle | None:
        backend, target = self.backend, self.target
        fs: StorageFS = target.fs
        files: dict[str, StateFile] = {}
        incremental = backend.config.incremental and target.shared_dir is not None
        for name in sorted(os.listdir(self.local)):
            local = os.path.join(self.local, name)
            size = os.path.getsize(local)
            reused = self.base.get(name)
            if incremental and name.endswith(_SST) and reused is not None and reused.size == size:
                files[name] = reused
                continue
            crc = crc_file(local)
            if incremental and name.endswith(_SST):
                assert target.shared_dir is not None
                stem = name[: -len(_SST)]
                unique = f"{target.checkpoint_id}-{target.name}-{stem}-{uuid.uuid4().hex[:8]}{_SST}"
                path = fs.join(target.shared_dir, unique)
                shared = True
            else:
                path = fs.join(target.directory, f"{target.name}-db", name)
                shared = False
            try:
                fs.upload(local, path)
            except OSError as err:
                # An outage fails the checkpoint as storage unavailable (core.storage_faults).
                raise unavailable_or(
                    err, what="upload RocksDB file", path=path, other=StateError
                ) from err
            self.bytes_written += size
            files[name] = StateFile(path, size, shared, crc)
        backend._uploads[target.checkpoint_id] = files
        if not self.kinds:
            return None
        return RocksDBSnapshotHandle(backend.key_group_range, files, dict(self.kinds))

    def _savepoint(self) -> KeyedStateHandle | None:
        backend, target = self.backend, self.target
        if not self.kinds:
            return None
        db = backend._open(self.local, read_only=True)
        try:
            now = backend.ctx.clock.wall()
            groups = (
                (kg, canonical_rows(db, self.kinds, self.ttls, kg, now))
                for kg in backend.key_group_range
            )
            path = target.fs.join(target.directory, f"{target.name}.arrow")
            handle = write_canonical(
                target.fs, path, self.metas, groups, key_groups=backend.key_group_range
            )
        finally:
            db.close()
        self.bytes_written = 0 if handle is None else handle.size
        return handle
