"""A join operator's subtasks driven directly, on one backend kind (shared by the equi-join
and regular-join tests): rows routed by the key group of their key tuple, snapshots
restored at another parallelism.

Example::

    cluster = Cluster("heap", tmp_path, spec, 2)
    cluster.send(0, left_batch); cluster.rows()
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from columnar_support import MAX_P, Emitted

from epochstream.core.arrow import KG
from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import EquiJoinSpec
from epochstream.graph.transformations import ColumnKeys
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.column_keygroups import key_groups_of_columns
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_range_for_operator
from epochstream.state.operator import OperatorStateStore

BACKENDS = {
    "heap": HeapStateBackend,
    "rocksdb": lambda: RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1),
}


class Cluster:
    """The join's subtasks at one parallelism on one backend kind; rows routed to them
    by the key group of their key tuple, as ``key_by([...])`` does."""

    def __init__(
        self,
        backend: str,
        root: Path,
        spec: EquiJoinSpec,
        parallelism: int,
        clock: ManualClock | None = None,
    ) -> None:
        self.backend, self.root, self.spec = backend, root, spec
        #: The subtasks' processing-time clock (state TTL), shared and injectable.
        self.clock = clock or ManualClock(start=1_000.0)
        self.ops = [self._operator(i, parallelism) for i in range(parallelism)]

    def _operator(self, subtask: int, parallelism: int) -> tuple[Any, Emitted]:
        clock = self.clock
        key_groups = key_group_range_for_operator(MAX_P, parallelism, subtask)
        keyed = BACKENDS[self.backend]().create(
            KeyedBackendContext(
                operator_uid="join",
                subtask=subtask,
                max_parallelism=MAX_P,
                key_group_range=key_groups,
                clock=clock,
                local_dir=str(self.root / f"local-{parallelism}-{subtask}-{random.random()}"),
            )
        )
        spec = OperatorSpec(
            uid="join",
            name="join",
            kind=self.spec.operator_kind,
            payload=self.spec,
            key_selector=ColumnKeys(self.spec.left_keys),
            input_key_selectors=[ColumnKeys(self.spec.left_keys), ColumnKeys(self.spec.right_keys)],
        )
        ctx = OperatorContext(
            subtask_index=subtask,
            parallelism=parallelism,
            max_parallelism=MAX_P,
            attempt=0,
            job_id="job",
            task_name=f"join ({subtask + 1}/{parallelism})",
            operator_state=OperatorStateStore(),
            keyed_backend=keyed,
            checkpointing=True,
            clock=clock,
        )
        op = create_operator(spec, ctx)
        out = Emitted()
        op.output = out
        return op, out

    def send(self, index: int, batch: pa.RecordBatch) -> None:
        """Route ``batch``'s rows to their subtasks with ``_kg`` attached, as the hash edge
        of ``key_by([...])`` does."""
        keys = self.spec.left_keys if index == 0 else self.spec.right_keys
        groups = key_groups_of_columns([batch.column(k) for k in keys], MAX_P)
        keyed = batch.append_column(KG, pa.array(groups.astype(np.int32)))
        for op, _ in self.ops:
            mine = pa.array(np.isin(groups, np.array(list(op.key_groups))))
            op.process_input(index, keyed.filter(mine), None)

    def watermark(self, mark: int) -> None:
        for op, _ in self.ops:
            op.process_watermark(mark)

    def rescaled(self, parallelism: int, checkpoint_id: int) -> Cluster:
        """Snapshot every subtask, restore the state at ``parallelism``."""
        handles = []
        for i, (op, _) in enumerate(self.ops):
            target = SnapshotTarget(
                fs=storage_fs(str(self.root)),
                checkpoint_id=checkpoint_id,
                directory=str(self.root / f"chk-{checkpoint_id}"),
                shared_dir=str(self.root / "shared"),
                name=f"join-{i}",
            )
            handle = op.snapshot(target).keyed.run()
            if handle is not None:
                handles.append(handle)
        restored = Cluster(self.backend, self.root, self.spec, parallelism, self.clock)
        for op, _ in restored.ops:
            op.initialize_state(OperatorRestore(keyed=list(handles)), checkpoint_id)
        return restored

    def rows(self) -> list[dict[str, Any]]:
        return [r for _, out in self.ops for r in out.take()]

    def tables(self) -> list[str]:
        return [n for op, _ in self.ops for n in op.keyed.row_tables()]
