"""Columnar rolling and window aggregations on each keyed-state backend (heap and
RocksDB, as ``env.set_state_backend`` gives them): output equal to a dict oracle
through a snapshot and restore halfway, windows' tables dropped once fired, and a
window state file written before windows moved behind the backend restored."""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from columnar_support import MAX_P, Emitted

from epochstream.core.arrow import KG
from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import AggregateSpec, WindowAggregateSpec
from epochstream.graph.transformations import (
    COLUMNAR_BACKEND_KINDS,
    COLUMNAR_STATE_KINDS,
    ColumnKey,
)
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.columnar_aggregates import write_columnar_state
from epochstream.state.columnar_checks import with_value_type
from epochstream.state.handles import OperatorRestore
from epochstream.state.operator import OperatorStateStore

BACKENDS = {
    "heap": HeapStateBackend,
    "rocksdb": lambda: RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1),
}


class Job:
    """Makes operators of one kind on one backend kind, and snapshot targets."""

    def __init__(self, backend: str, root: Path, kind: str, payload: Any) -> None:
        self.config = BACKENDS[backend]()
        self.root = root
        self.kind = kind
        self.payload = payload
        self.made = 0

    def operator(self) -> tuple[Any, Emitted]:
        self.made += 1
        clock = ManualClock(start=1_000.0)
        backend = self.config.create(
            KeyedBackendContext(
                operator_uid="agg",
                subtask=0,
                max_parallelism=MAX_P,
                key_group_range=range(0, MAX_P),
                clock=clock,
                local_dir=str(self.root / f"local-{self.made}"),
            )
        )
        spec = OperatorSpec(
            uid="agg",
            name=self.kind,
            kind=self.kind,
            payload=self.payload,
            key_selector=ColumnKey("k"),
        )
        ctx = OperatorContext(
            subtask_index=0,
            parallelism=1,
            max_parallelism=MAX_P,
            attempt=0,
            job_id="job",
            task_name=f"{self.kind} (1/1)",
            operator_state=OperatorStateStore(),
            keyed_backend=backend,
            checkpointing=True,
            clock=clock,
        )
        op = create_operator(spec, ctx)
        out = Emitted()
        op.output = out
        return op, out

    def snapshot(self, op: Any, checkpoint_id: int) -> OperatorRestore:
        target = SnapshotTarget(
            fs=storage_fs(str(self.root)),
            checkpoint_id=checkpoint_id,
            directory=str(self.root / f"chk-{checkpoint_id}"),
            shared_dir=str(self.root / "shared"),
            name="agg-0",
        )
        handle = op.snapshot(target).keyed.run()
        return OperatorRestore(keyed=[handle] if handle is not None else [])


def test_the_columnar_aggregations_use_the_backend() -> None:
    assert {"columnar_aggregate", "columnar_window"} <= COLUMNAR_BACKEND_KINDS
    assert not COLUMNAR_BACKEND_KINDS & COLUMNAR_STATE_KINDS


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_window_sums_through_a_restore_match_a_dict(backend: str, tmp_path: Path) -> None:
    size, slide = 1_000, 500
    job = Job(
        backend,
        tmp_path,
        "columnar_window",
        WindowAggregateSpec("sum", key="k", value="v", size=size, slide=slide),
    )
    op, out = job.operator()
    op.initialize_state(None, None)
    rng = random.Random(3)
    expected: dict[tuple[str, int], int] = collections.defaultdict(int)
    emitted: list[dict[str, Any]] = []
    for step in range(12):
        ts = [step * 400 + rng.randrange(400) for _ in range(300)]
        keys = [f"k{rng.randrange(50)}" for _ in ts]
        values = [rng.randrange(1, 100) for _ in ts]
        for t, k, v in zip(ts, keys, values, strict=True):
            last = t - t % slide
            for start in (last, last - slide):
                if start > t - size:
                    expected[(k, start)] += v
        op.process_batch(
            pa.record_batch(
                [pa.array(keys), pa.array(values), pa.array(ts, pa.int64())],
                names=["k", "v", "_ts"],
            ),
            None,
        )
        op.process_watermark(step * 400 - 1)
        if step == 6:  # crash and restore from a checkpoint of open windows
            restore = job.snapshot(op, 1)
            assert restore.keyed, "open windows are in the snapshot"
            emitted += out.take()
            op, out = job.operator()
            op.initialize_state(restore, 1)
            assert op.windows, "the open windows came back"
    op.process_watermark(2**62)
    emitted += out.take()
    got = {(r["k"], r["window_start"]): r["v"] for r in emitted}
    assert len(got) == len(emitted), "a window fired twice"
    assert got == dict(expected)
    assert op.keyed.column_tables() == [], "fired windows' tables are dropped"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_window_state_file_from_before_the_backend_restores(backend: str, tmp_path: Path) -> None:
    keys = pa.array([1, 2, 1])
    rows = pa.table(
        {
            KG: pa.array(key_groups_of_column(keys, MAX_P)),
            "_key": keys,
            "acc": pa.array([10, 20, 30]),
            "count": pa.array([1, 1, 1]),
            "_window_start": pa.array([0, 0, 1_000]),
        }
    )
    handle = write_columnar_state(
        storage_fs(str(tmp_path)),
        str(tmp_path / "old.columnar.arrow"),
        with_value_type(rows, pa.int64()),
        key_groups=range(0, MAX_P),
        state="sum",
    )
    job = Job(
        backend,
        tmp_path,
        "columnar_window",
        WindowAggregateSpec("sum", key="k", value="v", size=1_000, slide=1_000),
    )
    op, out = job.operator()
    op.initialize_state(OperatorRestore(keyed=[handle]), None)
    assert sorted(op.windows) == [0, 1_000]
    op.process_watermark(5_000)
    got = sorted((r["k"], r["window_start"], r["v"]) for r in out.take())
    assert got == [(1, 0, 10), (1, 1_000, 30), (2, 0, 20)]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_rolling_min_keeps_its_value_type_through_a_restore(backend: str, tmp_path: Path) -> None:
    job = Job(backend, tmp_path, "columnar_aggregate", AggregateSpec("min", key="k", value="v"))
    op, out = job.operator()
    op.initialize_state(None, None)
    batch = pa.record_batch(
        [pa.array([1, 2, 1]), pa.array([5, 7, 3], pa.int16())], names=["k", "v"]
    )
    op.process_batch(batch, None)
    restore = job.snapshot(op, 1)
    op, out = job.operator()
    op.initialize_state(restore, 1)
    op.process_batch(
        pa.record_batch([pa.array([2]), pa.array([9], pa.int16())], names=["k", "v"]), None
    )
    (emitted,) = out.batches()
    assert emitted.schema.field("v").type == pa.int16()
    assert emitted.to_pylist() == [{"k": 2, "v": 7}]
    assert np.array_equal(np.sort(op.state_table().column("acc").to_numpy()), np.array([3, 7]))
