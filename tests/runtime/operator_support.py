"""What the stream operator tests share: operators built as a task builds them (spec,
context) with a recording emit, and keyed-state backends of either kind (the
``backends`` fixture in conftest.py gives one of each).

Example::

    op, out = make("reduce", add_pairs, key=first_field, backend=backends.create())
    op.process_batch([("a", 1), ("a", 2)], None)
    out.batches         # [[("a", 1), ("a", 3)]]
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from output_support import RecordingOutput

from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.runtime.operators import Operator, OperatorContext, create_operator
from epochstream.state.backends.base import KeyedBackendContext, KeyedStateBackend, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.operator import OperatorStateStore

MAX_P = 128


class Emitted(RecordingOutput):
    """Fake output: records every batch an operator hands on."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[Any]] = []
        self.timestamps: list[list[Any] | None] = []

    def collect(self, batch: list[Any], timestamps: list[Any] | None = None) -> None:
        self.batches.append(list(batch))
        self.timestamps.append(None if timestamps is None else list(timestamps))

    @property
    def records(self) -> list[Any]:
        return [r for b in self.batches for r in b]


class Backends:
    """Creates keyed backends of one kind (heap or RocksDB) under ``root``."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.clock = ManualClock(start=1_000.0)
        self.fs = storage_fs(str(root))
        self._made = 0

    def create(self, uid: str = "op") -> KeyedStateBackend:
        self._made += 1
        config = (
            HeapStateBackend()
            if self.kind == "heap"
            else RocksDBStateBackend(block_cache_mb=8, write_buffer_mb=4)
        )
        return config.create(
            KeyedBackendContext(
                operator_uid=uid,
                subtask=0,
                max_parallelism=MAX_P,
                key_group_range=range(0, MAX_P),
                clock=self.clock,
                local_dir=str(self.root / "local" / f"{uid}-{self._made}"),
            )
        )

    def target(self, checkpoint_id: int, base: int | None = None) -> SnapshotTarget:
        (self.root / "job").mkdir(parents=True, exist_ok=True)  # as the job master makes it
        return SnapshotTarget(
            fs=self.fs,
            checkpoint_id=checkpoint_id,
            directory=str(self.root / "job" / f"chk-{checkpoint_id}"),
            shared_dir=str(self.root / "job" / "shared"),
            name="op-0",
            base_checkpoint_id=base,
        )


def make(
    kind: str,
    payload: Any,
    *,
    key: Callable[[Any], Any] | None = None,
    backend: KeyedStateBackend | None = None,
    open_now: bool = True,
) -> tuple[Operator, Emitted]:
    """An operator of ``kind`` with a recording emit, opened unless ``open_now`` is False."""
    spec = OperatorSpec(uid=f"{kind}-1", name=kind, kind=kind, payload=payload, key_selector=key)
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=MAX_P,
        attempt=0,
        job_id="job",
        task_name=f"{kind} (1/1)",
        operator_state=OperatorStateStore(),
        keyed_backend=backend,
        checkpointing=True,
    )
    op = create_operator(spec, ctx)
    out = Emitted()
    op.output = out
    if open_now:
        op.open()
    return op, out


def add_pairs(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    """Reduce function of ``(key, count)`` pairs: the key and the running sum."""
    return (a[0], a[1] + b[1])


def first_field(t: tuple[str, int]) -> str:
    """Key selector of the pairs: the key."""
    return t[0]
