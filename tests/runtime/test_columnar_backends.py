"""Columnar operators on each keyed-state backend (heap and RocksDB, as
``env.set_state_backend`` gives them): rolling and window aggregations equal to a dict
oracle through a snapshot and restore halfway, windows' tables dropped once fired, a
window state file written before windows moved behind the backend restored; session
windows and joins (row tables) equal to an oracle through a restore at another
parallelism."""

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
from epochstream.graph.specs import (
    AggregateSpec,
    JoinSpec,
    SessionWindowSpec,
    WindowAggregateSpec,
)
from epochstream.graph.transformations import (
    COLUMNAR_BACKEND_KINDS,
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
from epochstream.state.keygroups import key_group_range_for_operator
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


def test_every_keyed_columnar_kind_uses_the_backend() -> None:
    assert {
        "columnar_aggregate",
        "columnar_window",
        "columnar_processing_window",
        "columnar_session_window",
        "columnar_join",
        "columnar_window_join",
        "columnar_equi_join",
        "columnar_regular_join",
        "columnar_window_aggregate",
        "columnar_processing_window_aggregate",
        "columnar_window_top_n",
        "columnar_session_aggregate",
        "columnar_group_aggregate",
        "columnar_top_n",
        "columnar_over_aggregate",
    } == COLUMNAR_BACKEND_KINDS


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


# ---------------------------------------------------------------- row tables: sessions, joins


def _subtask_operator(
    backend: str,
    root: Path,
    kind: str,
    payload: Any,
    keys: list[str],
    subtask: int,
    parallelism: int,
) -> tuple[Any, Emitted]:
    """Operator ``kind`` as subtask ``subtask`` of ``parallelism`` on a ``backend`` backend."""
    clock = ManualClock(start=1_000.0)
    key_groups = key_group_range_for_operator(MAX_P, parallelism, subtask)
    keyed = BACKENDS[backend]().create(
        KeyedBackendContext(
            operator_uid="op",
            subtask=subtask,
            max_parallelism=MAX_P,
            key_group_range=key_groups,
            clock=clock,
            local_dir=str(root / f"local-{kind}-{parallelism}-{subtask}-{random.random()}"),
        )
    )
    spec = OperatorSpec(
        uid="op",
        name=kind,
        kind=kind,
        payload=payload,
        key_selector=ColumnKey(keys[0]),
        input_key_selectors=[ColumnKey(k) for k in keys] if len(keys) > 1 else None,
    )
    ctx = OperatorContext(
        subtask_index=subtask,
        parallelism=parallelism,
        max_parallelism=MAX_P,
        attempt=0,
        job_id="job",
        task_name=f"{kind} ({subtask + 1}/{parallelism})",
        operator_state=OperatorStateStore(),
        keyed_backend=keyed,
        checkpointing=True,
        clock=clock,
    )
    op = create_operator(spec, ctx)
    out = Emitted()
    op.output = out
    return op, out


def _snapshot(op: Any, root: Path, checkpoint_id: int) -> OperatorRestore:
    target = SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=checkpoint_id,
        directory=str(root / f"chk-{checkpoint_id}"),
        shared_dir=str(root / "shared"),
        name="op-0",
    )
    handle = op.snapshot(target).keyed.run()
    return OperatorRestore(keyed=[handle] if handle is not None else [])


def _mine(op: Any, keys: list[Any]) -> np.ndarray:
    groups = key_groups_of_column(pa.array(keys), MAX_P)
    return np.isin(groups, np.array(list(op.key_groups)))


def _oracle_sessions(rows: list[tuple[str, int, int]], gap: int) -> set[tuple[Any, ...]]:
    """Every session of ``(key, ts, value)`` rows: ``(key, start, end, sum)``."""
    by_key: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for k, t, v in rows:
        by_key[k].append((t, v))
    sessions = set()
    for k, events in by_key.items():
        events.sort()
        start, end, total = events[0][0], events[0][0] + gap, 0
        for t, v in events:
            if t > end:
                sessions.add((k, start, end, total))
                start, total = t, 0
            end, total = max(end, t + gap), total + v
        sessions.add((k, start, end, total))
    return sessions


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_sessions_through_a_restore_at_another_parallelism_match_a_dict(
    backend: str, tmp_path: Path
) -> None:
    gap = 300
    payload = SessionWindowSpec("sum", "k", "v", gap)
    ops = [_subtask_operator(backend, tmp_path, "columnar_session_window", payload, ["k"], 0, 1)]
    ops[0][0].initialize_state(None, None)
    rng = random.Random(11)
    rows: list[tuple[str, int, int]] = []
    emitted: list[tuple[Any, ...]] = []
    for step in range(14):
        ts = [step * 400 + rng.randrange(400) for _ in range(300)]
        keys = [f"k{rng.randrange(80)}" for _ in ts]
        values = [rng.randrange(1, 50) for _ in ts]
        rows += zip(keys, ts, values, strict=True)
        for op, _ in ops:
            mask = _mine(op, keys)
            batch = pa.record_batch(
                [pa.array(keys), pa.array(values), pa.array(ts, pa.int64())],
                names=["k", "v", "_ts"],
            ).filter(pa.array(mask))
            op.process_batch(batch, None)
            op.process_watermark(step * 400 - 1)  # no row is late
        if step == 6:  # a checkpoint, restored by two subtasks
            restore = _snapshot(ops[0][0], tmp_path, 1)
            emitted += [tuple(r.values())[:4] for r in ops[0][1].take()]
            ops = [
                _subtask_operator(
                    backend, tmp_path, "columnar_session_window", payload, ["k"], i, 2
                )
                for i in range(2)
            ]
            for op, _ in ops:
                op.initialize_state(restore, None)
    for op, out in ops:
        op.process_watermark(2**62)
        emitted += [tuple(r.values())[:4] for r in out.take()]
        assert op.state_table().num_rows == 0, "fired sessions leave no state"
    assert len(set(emitted)) == len(emitted), "a session fired twice"
    assert set(emitted) == _oracle_sessions(rows, gap)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("columnar_join", JoinSpec("seller", "id")),
        ("columnar_window_join", JoinSpec("seller", "id", size=1_000, slide=500)),
    ],
    ids=["regular", "window"],
)
def test_joins_through_a_restore_at_another_parallelism_give_every_pair_once(
    backend: str, kind: str, spec: JoinSpec, tmp_path: Path
) -> None:
    ops = [_subtask_operator(backend, tmp_path, kind, spec, ["seller", "id"], 0, 1)]
    ops[0][0].initialize_state(None, None)
    rng = random.Random(5)
    lefts: list[tuple[int, int, int]] = []  # (auction id, seller, ts)
    rights: list[tuple[int, str, int]] = []  # (person id, name, ts)
    pairs: list[tuple[int, str]] = []
    for step in range(10):
        ts = [step * 400 + rng.randrange(400) for _ in range(60)]
        sellers = [rng.randrange(30) for _ in ts]
        ids = [len(lefts) + i for i in range(len(ts))]
        lefts += zip(ids, sellers, ts, strict=True)
        person_ids = [rng.randrange(30) for _ in range(20)]
        names = [f"p{len(rights) + i}" for i in range(20)]
        person_ts = [step * 400 + rng.randrange(400) for _ in names]
        rights += zip(person_ids, names, person_ts, strict=True)
        for op, _ in ops:
            left = pa.record_batch(
                [pa.array(ids), pa.array(sellers), pa.array(ts, pa.int64())],
                names=["id", "seller", "_ts"],
            ).filter(pa.array(_mine(op, sellers)))
            right = pa.record_batch(
                [pa.array(person_ids), pa.array(names), pa.array(person_ts, pa.int64())],
                names=["id", "name", "_ts"],
            ).filter(pa.array(_mine(op, person_ids)))
            op.process_input(0, left, None)
            op.process_input(1, right, None)
            op.process_watermark(step * 400 - 1)
        if step == 4:
            restore = _snapshot(ops[0][0], tmp_path, 1)
            pairs += [(r["id"], r["name"]) for r in ops[0][1].take()]
            ops = [
                _subtask_operator(backend, tmp_path, kind, spec, ["seller", "id"], i, 2)
                for i in range(2)
            ]
            for op, _ in ops:
                op.initialize_state(restore, None)
    for op, out in ops:
        op.process_watermark(2**62)
        pairs += [(r["id"], r["name"]) for r in out.take()]
    expected = []
    for auction, seller, t in lefts:
        for person, name, u in rights:
            if person != seller:
                continue
            if spec.size is None:
                expected.append((auction, name))
            else:  # every window of size 1000, slide 500, holding both
                expected += [(auction, name)] * len(
                    {t - t % 500 - j * 500 for j in range(2)}
                    & {u - u % 500 - j * 500 for j in range(2)}
                )
    assert sorted(pairs) == sorted(expected)
