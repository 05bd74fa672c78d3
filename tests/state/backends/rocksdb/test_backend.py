"""RocksDB-backend specifics: state several times larger than its memory, incremental
SST reuse, and a rescale that copies key-group ranges out of old databases."""

from __future__ import annotations

import os
from typing import Any

from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.handles import RocksDBSnapshotHandle

from ..conftest import Harness

BLOBS = ValueStateDescriptor("blobs")


def _harness(tmp_path: Any, **config: Any) -> Harness:
    h = Harness("rocksdb", tmp_path)
    h.config = RocksDBStateBackend(**config)
    return h


def test_state_larger_than_memory(tmp_path: Any) -> None:
    """About 48 MB of values through a database with an 8 MB cache and 4 MB write buffers."""
    h = _harness(tmp_path, block_cache_mb=8, write_buffer_mb=4)
    backend = h.backend()
    blobs = backend.get_state(BLOBS)
    n = 12_000
    for k in range(n):
        backend.set_current_key(k)
        blobs.update(os.urandom(16) + k.to_bytes(4, "big") + os.urandom(4_000))
    handle = backend.snapshot(h.target(1)).run()
    assert isinstance(handle, RocksDBSnapshotHandle) and handle.size > 40 * 2**20
    restored = h.backend()
    restored.restore([handle], checkpoint_id=1, owned=True)
    values = restored.get_state(BLOBS)
    for k in range(0, n, 997):
        restored.set_current_key(k)
        assert values.value()[16:20] == k.to_bytes(4, "big")
    assert len(restored.keys("blobs")) == n


def test_incremental_checkpoint_uploads_only_new_sst_files(tmp_path: Any) -> None:
    h = _harness(tmp_path, block_cache_mb=8)
    backend = h.backend()
    table = backend.value_table(ValueStateDescriptor("_sum"))
    for k in range(50_000):
        table[k] = (k, 0)
    first = backend.snapshot(h.target(1))
    h1 = first.run()
    backend.notify_checkpoint_complete(1)
    for k in range(500):  # 1 % of the keys change
        table[k] = (k, 1)
    second = backend.snapshot(h.target(2, base=1))
    h2 = second.run()
    assert isinstance(h1, RocksDBSnapshotHandle) and isinstance(h2, RocksDBSnapshotHandle)
    reused = {f.path for f in h1.db_files.values()} & {f.path for f in h2.db_files.values()}
    assert reused and all(f.shared for f in h1.db_files.values() if f.path in reused)
    assert second.bytes_written < first.bytes_written / 5
