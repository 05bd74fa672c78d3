"""The window operator rig: builds window operators as the API would, over a real keyed
backend (heap or RocksDB), feeds them, snapshots and restores them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from output_support import RecordingOutput

import epochstream as es
from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.runtime.operators import OperatorContext, WindowOperator, create_operator
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_range_for_operator
from epochstream.state.operator import OperatorStateStore

MAX_P = 128
LATE = es.OutputTag("late")


class Out(RecordingOutput):
    """Records (with timestamps) an operator emitted, per output."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Any] = []
        self.timestamps: list[Any] = []

    def collect(self, records: list[Any], timestamps: list[Any] | None = None) -> None:
        self.records.extend(records)
        self.timestamps.extend(timestamps if timestamps is not None else [None] * len(records))

    def take(self) -> list[Any]:
        records, self.records, self.timestamps = self.records, [], []
        return records


class Rig:
    """Builds window operators over one backend kind; snapshots and restores them."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.clock = ManualClock(start=0.0)
        self.made = 0

    def operator(
        self,
        configure: Any,
        *,
        parallelism: int = 1,
        subtask: int = 0,
        restore: Any = None,
    ) -> tuple[WindowOperator, Out, Out]:
        """``configure(windowed_stream) -> DataStream`` builds the payload, as the API would."""
        self.made += 1
        env = es.Environment(parallelism=1, runner="local")
        keyed = env.from_collection([]).key_by(first)
        configure(keyed).print()
        spec_t = next(t for t in env._graph.transformations if t.kind == "window")
        config = (
            HeapStateBackend() if self.kind == "heap" else RocksDBStateBackend(block_cache_mb=8)
        )
        backend = config.create(
            KeyedBackendContext(
                operator_uid="w",
                subtask=subtask,
                max_parallelism=MAX_P,
                key_group_range=key_group_range_for_operator(MAX_P, parallelism, subtask),
                clock=self.clock,
                local_dir=str(self.root / f"local-{self.made}"),
            )
        )
        spec = OperatorSpec(
            uid="w", name="window", kind="window", payload=spec_t.payload, key_selector=first
        )
        ctx = OperatorContext(
            subtask_index=subtask,
            parallelism=parallelism,
            max_parallelism=MAX_P,
            attempt=0,
            job_id="job",
            task_name="window (1/1)",
            operator_state=OperatorStateStore(),
            keyed_backend=backend,
            checkpointing=True,
            clock=self.clock,
        )
        op = create_operator(spec, ctx)
        assert isinstance(op, WindowOperator)
        out, late = Out(), Out()
        op.output = out
        op.side_outputs[LATE.name] = late
        if restore is not None:
            mine = restore.restricted_to(backend.key_group_range)
            op.initialize_state(OperatorRestore(keyed=[mine] if mine else []), checkpoint_id=None)
        op.open()
        return op, out, late

    def snapshot(self, op: WindowOperator, n: int) -> Any:
        target = SnapshotTarget(
            fs=storage_fs(str(self.root)),
            checkpoint_id=n,
            directory=str(self.root / f"chk-{n}"),
            shared_dir=str(self.root / "shared"),
            name=f"w-{n}",
        )
        parts = op.snapshot(target)
        assert parts.keyed is not None
        return parts.keyed.run()


def first(t: Any) -> Any:
    """The key of the rig's records: their first field."""
    return t[0]


def feed(op: WindowOperator, *items: tuple[Any, Any]) -> None:
    """Give ``op`` one batch of ``(record, timestamp)`` pairs."""
    op.process_batch([r for r, _ in items], [ts for _, ts in items])
