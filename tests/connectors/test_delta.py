"""DeltaSink writers and its global committer against real Delta tables (deltalake)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.delta import DeltaFile, DeltaSink
from epochstream.exceptions import ConfigurationError, SinkError

deltalake = pytest.importorskip("deltalake")


def ctx(subtask: int = 0, attempt: int = 0, checkpointing: bool = True) -> SinkContext:
    return SinkContext(subtask, 2, attempt, "cafebabe00", checkpointing)


def rows(path: Path) -> list[dict[str, Any]]:
    table = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def txn_versions(path: Path) -> list[tuple[str, int]]:
    out = []
    for log in sorted((path / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                out.append((action["txn"]["appId"], action["txn"]["version"]))
    return out


def test_one_delta_transaction_per_completed_checkpoint(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "t")
    writers = [sink.create_writer(ctx(subtask=i)) for i in range(2)]
    committer = sink.create_committer("job")
    for w in writers:
        w.restore([])
    writers[0].write_batch([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    writers[1].write_batch([{"id": 3, "v": "c"}])
    entries = [e for w in writers for e in w.snapshot(1)]
    assert {e.checkpoint_id for e in entries} == {1} and len(entries) == 2
    assert not deltalake.DeltaTable.is_deltatable(str(tmp_path / "t")), "nothing before commit"
    committer.commit(1, entries)
    for w in writers:
        w.notify_checkpoint_complete(1)
    assert [r["id"] for r in rows(tmp_path / "t")] == [1, 2, 3]
    writers[1].write_batch([{"id": 4, "v": "d"}])
    committer.commit(2, [e for w in writers for e in w.snapshot(2)])
    assert [r["id"] for r in rows(tmp_path / "t")] == [1, 2, 3, 4]
    assert txn_versions(tmp_path / "t") == [("epochstream-t", 1), ("epochstream-t", 2)]


def test_replayed_commit_is_skipped_and_aborted_checkpoints_roll_into_the_next(
    tmp_path: Path,
) -> None:
    sink = DeltaSink(tmp_path / "t", sink_id="orders")
    w = sink.create_writer(ctx())
    w.restore([])
    w.write_batch([{"id": 1}])
    first = w.snapshot(1)  # checkpoint 1 aborted
    w.write_batch([{"id": 2}])
    second = w.snapshot(2)
    assert [f.checkpoint_id for f in second] == [1, 2], "checkpoint 1's file is still pending"
    committer = sink.create_committer("job")
    committer.commit(2, second)
    committer.commit(2, second)  # a restore replays the commit of the restored checkpoint
    sink.create_committer("job2").commit(2, second)
    assert [r["id"] for r in rows(tmp_path / "t")] == [1, 2]
    assert txn_versions(tmp_path / "t") == [("epochstream-orders", 2)]
    # A writer that never heard of 2's completion re-sends both files with checkpoint 3.
    w.write_batch([{"id": 3}])
    committer.commit(3, w.snapshot(3))
    assert [r["id"] for r in rows(tmp_path / "t")] == [1, 2, 3]
    assert first[0] in second


def test_missing_pre_committed_file_and_bad_settings_fail_clearly(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "t")
    gone = DeltaFile("part-x.parquet", 10, 1, 0, 1)
    with pytest.raises(SinkError, match=r"part-x\.parquet.*is gone") as info:
        sink.create_committer("job").commit(1, [gone])
    assert info.value.suppress_restarts
    with pytest.raises(ConfigurationError, match="append"):
        DeltaSink(tmp_path / "t", mode="overwrite")
    with pytest.raises(ConfigurationError, match="checkpointing"):
        sink.create_writer(ctx(checkpointing=False))
    w = sink.create_writer(ctx())
    w.write_batch([{"id": 1}, 5])
    with pytest.raises(SinkError, match="cannot build an Arrow table"):
        w.snapshot(1)


def test_batches_are_written_with_their_arrow_types_and_replays_are_skipped(
    tmp_path: Path,
) -> None:
    import datetime

    import pyarrow as pa

    from epochstream.core.arrow import KG_FIELD

    when = datetime.datetime(2026, 11, 28, 10, 0, tzinfo=datetime.UTC)
    schema = pa.schema(
        [("id", pa.int32()), ("at", pa.timestamp("us", "UTC")), ("_ts", pa.int64()), KG_FIELD]
    )

    def batch(ids: list[int]) -> pa.RecordBatch:
        n = len(ids)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(ids, pa.int32()),
                pa.array([when] * n, schema.field("at").type),
                pa.array([0] * n, pa.int64()),
                pa.array([0] * n, pa.int32()),
            ],
            schema=schema,
        )

    sink = DeltaSink(tmp_path / "t")
    committer = sink.create_committer("job")
    crashed = sink.create_writer(ctx())
    crashed.restore([])
    idle = sink.create_writer(ctx(subtask=1))
    idle.write_batch(batch([]))
    assert idle.snapshot(1) == [], "an empty batch makes no file"
    crashed.write_batch(batch([1, 2]))
    crashed.write_batch([{"id": 3, "at": when}])  # a row joins in the batches' schema
    first = crashed.snapshot(1)
    assert len(first) == 1
    crashed.write_batch(batch([100]))
    crashed.close()  # crash: checkpoint 1 completed, its commit did not happen
    committer.commit(1, first)  # the restore commits the restored checkpoint ...
    committer.commit(1, first)  # ... and a second restore repeats it: skipped
    restored = sink.create_writer(ctx(attempt=1))
    restored.restore(first)
    restored.write_batch(batch([4]))
    committer.commit(2, restored.snapshot(2))
    table = deltalake.DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert table.schema.names == ["id", "at"]
    assert table.schema.field("id").type == pa.int32()
    assert sorted(table["id"].to_pylist()) == [1, 2, 3, 4]
    assert set(table["at"].to_pylist()) == {when}
    assert txn_versions(tmp_path / "t") == [("epochstream-t", 1), ("epochstream-t", 2)]
    restored.write_batch(batch([5]))  # one file per interval: one schema
    with pytest.raises(SinkError, match="schema differs") as info:
        restored.write_batch(pa.record_batch({"id": pa.array([5], pa.int64())}))
    assert "id: int32" in str(info.value) and "id: int64" in str(info.value)


def test_columnar_job_into_delta_commits_its_input_exactly(tmp_path: Path) -> None:
    import epochstream as es

    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.1, storage=str(tmp_path / "ckpt"))
    (
        env.from_sequence(0, 3_000, batch_size=100, rate=15_000)
        .uid("numbers")
        .sink_to(DeltaSink(tmp_path / "t"))
        .uid("delta")
    )
    env.execute("columnar-delta")
    table = deltalake.DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert table.schema.names == ["value"]
    assert sorted(table["value"].to_pylist()) == list(range(3_000))
    assert len(txn_versions(tmp_path / "t")) > 1, "several checkpoints committed"


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_fresh_job_on_a_table_another_job_wrote_commits_its_own_checkpoints(
    tmp_path: Path, mode: str
) -> None:
    """The committers skip a checkpoint at most the table's last committed one (a replay
    after a restore). A second, fresh job (its own checkpoint storage, ids from 1) on
    the same table must not be taken for a replay: the job master numbers its
    checkpoints above what the table holds."""
    from deltalake import DeltaTable

    import epochstream as es

    table = str(tmp_path / "table")
    key = {"key": ["id"]} if mode == "upsert" else {}
    for run in range(2):
        env = es.Environment(parallelism=1, runner="local")
        env.enable_checkpointing(interval=0.2, storage=str(tmp_path / f"ck{run}"))
        rows = env.from_collection([{"id": run * 100 + i} for i in range(40)]).uid("rows")
        rows.sink_to(DeltaSink(table, mode, **key)).uid("delta")
        env.execute(f"run {run}")
    ids = sorted(r["id"] for r in DeltaTable(table).to_pyarrow_table().to_pylist())
    assert ids == [*range(40), *range(100, 140)]
