"""DeduplicateOperator with an injected clock, on heap and RocksDB backends."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from output_support import RecordingOutput

import epochstream as es
from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import ConfigurationError, UserFunctionError
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import DedupSpec
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.runtime.operators.dedup import BLOOM, DeduplicateOperator
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_for_key
from epochstream.state.operator import OperatorStateStore

MAX_P = 16
SPEC = DedupSpec(dt.timedelta(seconds=60), bloom_capacity=1000, bloom_fp_rate=0.01)


def _id(record: Any) -> Any:
    return record["id"]


class Harness:
    def __init__(self, kind: str, root: Path) -> None:
        self.kind, self.root = kind, root
        self.clock = ManualClock(start=1_000.0)
        self.made = 0

    def operator(
        self, key_groups: range = range(MAX_P), restore: OperatorRestore | None = None
    ) -> tuple[DeduplicateOperator, list[Any]]:
        self.made += 1
        config = (
            HeapStateBackend() if self.kind == "heap" else RocksDBStateBackend(block_cache_mb=8)
        )
        backend = config.create(
            KeyedBackendContext(
                operator_uid="dedup",
                subtask=0,
                max_parallelism=MAX_P,
                key_group_range=key_groups,
                clock=self.clock,
                local_dir=str(self.root / f"local-{self.made}"),
            )
        )
        spec = OperatorSpec(
            uid="dedup", name="dedup", kind="deduplicate", payload=SPEC, key_selector=_id
        )
        ctx = OperatorContext(
            subtask_index=0,
            parallelism=1,
            max_parallelism=MAX_P,
            attempt=0,
            job_id="job",
            task_name="dedup (1/1)",
            operator_state=OperatorStateStore(),
            keyed_backend=backend,
            checkpointing=True,
            clock=self.clock,
        )
        op = create_operator(spec, ctx)
        assert isinstance(op, DeduplicateOperator)
        out: list[Any] = []

        class Pairs(RecordingOutput):
            def collect(self, records: Any, timestamps: list[Any] | None = None) -> None:
                out.extend(zip(records, timestamps or [None] * len(records), strict=True))

        op.output = Pairs()
        op.initialize_state(restore, 1 if restore else None)
        op.open()
        return op, out

    def target(self, n: int) -> SnapshotTarget:
        (self.root / "job").mkdir(parents=True, exist_ok=True)  # as the job master makes it
        fs = storage_fs(str(self.root))
        return SnapshotTarget(
            fs=fs,
            checkpoint_id=n,
            directory=str(self.root / "job" / f"chk-{n}"),
            shared_dir=str(self.root / "job" / "shared"),
            name=f"dedup-{n}",
        )


@pytest.fixture(params=["heap", "rocksdb"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    return Harness(request.param, tmp_path)


def recs(*ids: Any) -> list[dict[str, Any]]:
    return [{"id": i} for i in ids]


def test_each_id_once_in_and_across_batches_with_timestamps_kept(harness: Harness) -> None:
    op, out = harness.operator()
    op.process_batch(recs("a", "b", "a", 1, (2, "x")), [10, 20, 30, 40, 50])
    op.process_batch(recs("b", 1, "c", "c", (2, "x")), [60, 70, 80, 90, 100])
    assert out == [
        ({"id": "a"}, 10),
        ({"id": "b"}, 20),
        ({"id": 1}, 40),
        ({"id": (2, "x")}, 50),
        ({"id": "c"}, 80),
    ]


def test_ids_are_forgotten_after_ttl(harness: Harness) -> None:
    op, out = harness.operator()
    op.process_batch(recs("a"), None)
    harness.clock.advance(59.0)
    op.process_batch(recs("a", "b"), None)
    harness.clock.advance(2.0)  # "a" is 61 s old, "b" 2 s
    op.process_batch(recs("a", "b"), None)
    assert [r["id"] for r, _ in out] == ["a", "b", "a"]


def test_snapshot_restores_catalog_and_filter_at_another_parallelism(harness: Harness) -> None:
    op, _ = harness.operator()
    ids = [f"id-{i}" for i in range(200)]
    op.process_batch(recs(*ids), None)
    parts = op.snapshot(harness.target(1))
    assert parts.keyed is not None and len(parts.union_lists[BLOOM]) == 1
    handle = parts.keyed.run()
    assert handle is not None
    seen: list[Any] = []
    for groups in (range(0, 7), range(7, MAX_P)):  # rescaled to two subtasks
        restored, again = harness.operator(
            groups, OperatorRestore(keyed=[handle], union_lists=parts.union_lists)
        )
        mine = [i for i in [*ids, "new-1", "new-2"] if key_group_for_key(i, MAX_P) in groups]
        restored.process_batch(recs(*mine), None)
        seen += [r["id"] for r, _ in again]
    assert sorted(seen) == ["new-1", "new-2"], "restored ids stay seen; new ids pass"


def test_a_failing_id_function_names_operator_and_record(harness: Harness) -> None:
    op, _ = harness.operator()
    with pytest.raises(UserFunctionError, match="dedup"):
        op.process_batch([{"no-id": 1}], None)


def test_api_validates_ttl_and_filter_settings() -> None:
    env = es.Environment(parallelism=1, runner="local")
    ds = env.from_collection([1, 2])
    with pytest.raises(ConfigurationError, match="ttl"):
        ds.deduplicate(lambda x: x, ttl=dt.timedelta(0))
    with pytest.raises(ConfigurationError, match="fp_rate"):
        ds.deduplicate(lambda x: x, ttl=5.0, bloom_fp_rate=2.0)
