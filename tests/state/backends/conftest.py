"""Fixtures shared by the keyed-state backend tests: one contract, every backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget, StateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.keygroups import key_group_range_for_operator

MAX_P = 128
BACKENDS: dict[str, Callable[[], StateBackend]] = {
    "heap": HeapStateBackend,
    "heap-full": lambda: HeapStateBackend(incremental=False),
    "rocksdb": lambda: RocksDBStateBackend(block_cache_mb=8, write_buffer_mb=4),
    "rocksdb-full": lambda: RocksDBStateBackend(incremental=False, block_cache_mb=8),
}


class Harness:
    """Creates backends of one kind over a scratch directory, and snapshot targets."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.config = BACKENDS[kind]()
        self.root = root
        # The job directory exists before any checkpoint, as the job master makes it.
        (root / "job").mkdir(parents=True, exist_ok=True)
        self.clock = ManualClock(start=1_000.0)
        self.fs = storage_fs(str(root))
        self._made = 0

    def backend(self, parallelism: int = 1, subtask: int = 0, uid: str = "op") -> Any:
        self._made += 1
        ctx = KeyedBackendContext(
            operator_uid=uid,
            subtask=subtask,
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, parallelism, subtask),
            clock=self.clock,
            local_dir=str(self.root / "local" / f"{uid}-{subtask}-{self._made}"),
        )
        return self.config.create(ctx)

    def target(
        self,
        checkpoint_id: int,
        *,
        subtask: int = 0,
        base: int | None = None,
        savepoint: str | None = None,
    ) -> SnapshotTarget:
        if savepoint is not None:
            directory = str(self.root / savepoint)
            return SnapshotTarget(
                fs=self.fs,
                checkpoint_id=checkpoint_id,
                directory=directory,
                shared_dir=None,
                name=f"op-{subtask}",
                savepoint=True,
                base_checkpoint_id=base,
            )
        return SnapshotTarget(
            fs=self.fs,
            checkpoint_id=checkpoint_id,
            directory=str(self.root / "job" / f"chk-{checkpoint_id}"),
            shared_dir=str(self.root / "job" / "shared"),
            name=f"op-{subtask}",
            base_checkpoint_id=base,
        )


@pytest.fixture(params=sorted(BACKENDS))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    """A harness for each backend kind: every contract test runs against all of them."""
    return Harness(request.param, tmp_path)
