"""RocksDB snapshots: uploading a database checkpoint and writing it as a savepoint.

Example::

    job = RocksSnapshotJob(backend, target, local_checkpoint_dir, base_files, kinds, metas, ttls)
    handle = job.run()          # on the snapshot thread
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from epochstream.core.state_schema import StateSchema, shapes_of_types
from epochstream.core.state_ttl import TtlConfig
from epochstream.core.storage_faults import unavailable_or
from epochstream.exceptions import StateError
from epochstream.state.backends.base import SnapshotJob, SnapshotTarget
from epochstream.state.backends.rocksdb.files import SST_SUFFIX, canonical_rows, crc_file
from epochstream.state.canonical import CanonicalRow, StateMeta, write_canonical
from epochstream.state.handles import KeyedStateHandle, RocksDBSnapshotHandle, StateFile

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS

__all__ = ["RocksSnapshotJob"]


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
        *,
        schemas: dict[str, StateSchema],
    ) -> None:
        self.backend = backend
        self.schemas = schemas
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
            if (
                incremental
                and name.endswith(SST_SUFFIX)
                and reused is not None
                and reused.size == size
            ):
                files[name] = reused
                continue
            crc = crc_file(local)
            if incremental and name.endswith(SST_SUFFIX):
                assert target.shared_dir is not None
                stem = name[: -len(SST_SUFFIX)]
                unique = f"{target.checkpoint_id}-{target.name}-{stem}-{uuid.uuid4().hex[:8]}{SST_SUFFIX}"
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
        return RocksDBSnapshotHandle(
            backend.key_group_range, files, dict(self.kinds), dict(self.schemas)
        )

    def _savepoint(self) -> KeyedStateHandle | None:
        backend, target = self.backend, self.target
        if not self.kinds:
            return None
        db = backend._open(self.local, read_only=True)
        try:
            now = backend.ctx.clock.wall()
            seen: dict[str, set[type]] = {name: set() for name in self.schemas}
            groups = (
                (kg, self._noting_classes(canonical_rows(db, self.kinds, self.ttls, kg, now), seen))
                for kg in backend.key_group_range
            )
            path = target.fs.join(target.directory, f"{target.name}.arrow")
            handle = write_canonical(
                target.fs, path, self.metas, groups, key_groups=backend.key_group_range
            )
        finally:
            db.close()
        if handle is None:
            self.bytes_written = 0
            return None
        self.bytes_written = handle.size
        # A savepoint records the shapes of the values it holds (core.state_schema).
        schemas = {
            name: StateSchema(schema.version, shapes_of_types(seen[name]))
            for name, schema in self.schemas.items()
        }
        return replace(handle, schemas=schemas)

    def _noting_classes(
        self, rows: list[CanonicalRow], seen: dict[str, set[type]]
    ) -> list[CanonicalRow]:
        """``rows``, adding the classes of their values to ``seen`` per state. RocksDB
        holds values serialized: a savepoint reads each once for its shape."""
        for name, _key, _ns, _user_key, data, _ts in rows:
            classes = seen.get(name)
            if classes is not None:
                classes.add(type(self.metas[name].serializer.loads(data)))
        return rows
