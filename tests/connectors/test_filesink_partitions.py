"""FileSink(partition_by=...): rows under ``<col>=<value>/`` directories, one file per
partition per transaction, committed together; a restore commits what the checkpoint
covers and removes the crashed attempt's files in every partition directory."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.filesink import FileSink, FileSinkWriter, partition_directory
from epochstream.exceptions import ConfigurationError, SinkError

JOB = "0123456789abcdef"


def writer(out: Path, attempt: int = 0, fmt: str = "parquet", subtask: int = 0) -> FileSinkWriter:
    sink = FileSink(out, fmt, partition_by=("day", "city"))
    return sink.create_writer(SinkContext(subtask, 2, attempt, JOB, checkpointing=True))


def batch(rows: list[tuple[str, str | None, int]]) -> pa.RecordBatch:
    day, city, n = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.RecordBatch.from_pydict(
        {"day": list(day), "n": pa.array(n, pa.int64()), "city": list(city)}
    )


def files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def committed(out: Path) -> list[tuple[str, str, int]]:
    """The visible rows, partition columns read back from the directory names."""
    dataset = ds.dataset(
        out,
        format="parquet",
        partitioning=ds.partitioning(
            pa.schema([("day", pa.string()), ("city", pa.string())]), flavor="hive"
        ),
        exclude_invalid_files=False,
        ignore_prefixes=[".", "_"],
    )
    table = dataset.to_table()
    return sorted(zip(*(table.column(c).to_pylist() for c in ("day", "city", "n")), strict=True))


def test_rows_go_to_their_partition_directories_without_the_partition_columns(
    tmp_path: Path,
) -> None:
    w = writer(tmp_path)
    w.restore([])
    w.write_batch(batch([("d1", "Paris", 1), ("d2", "Paris", 2), ("d1", "Oslo", 3)]))
    w.write_batch(batch([("d1", "Paris", 4)]))
    entries = w.snapshot(1)
    assert [f for f in files(tmp_path) if not Path(f).name.startswith(".")] == []
    w.notify_checkpoint_complete(1)
    assert files(tmp_path) == [
        "day=d1/city=Oslo/part-0-01234567-a0-000001.parquet",
        "day=d1/city=Paris/part-0-01234567-a0-000001.parquet",
        "day=d2/city=Paris/part-0-01234567-a0-000001.parquet",
    ]
    paris = pq.read_table(tmp_path / files(tmp_path)[1])
    assert paris.column_names == ["n"] and paris.column("n").to_pylist() == [1, 4]
    assert len(entries[0]) == 3, "one entry per partition file of the transaction"
    w.close()


def test_a_restore_commits_the_checkpoint_and_removes_the_crashed_attempts_files(
    tmp_path: Path,
) -> None:
    w = writer(tmp_path)
    w.restore([])
    w.write_batch(batch([("d1", "Paris", 1), ("d2", "Oslo", 2)]))
    covered = pickle.loads(pickle.dumps(w.snapshot(1)))  # checkpoint 1 completes...
    # ... but the slot dies before the notification: checkpoint 2's files are pending
    # (it never completed), and a part file was being written in a third partition.
    w.write_batch(batch([("d1", "Paris", 10), ("d3", "Rome", 11)]))
    w.snapshot(2)
    writing = tmp_path / "day=d4" / "city=Kyiv"
    writing.mkdir(parents=True)
    (writing / ".part-1-01234567-a0-000003.parquet.inprogress").write_bytes(b"PAR1")
    assert sum(f.endswith(".pending") for f in files(tmp_path)) == 4

    restored = writer(tmp_path, attempt=1)
    restored.restore(covered)
    assert committed(tmp_path) == [("d1", "Paris", 1), ("d2", "Oslo", 2)]
    assert [f for f in files(tmp_path) if Path(f).name.startswith(".")] == [], (
        "the crashed attempt's pending and in-progress files are gone"
    )
    # The replay writes checkpoint 2's rows again: each row is visible once.
    restored.write_batch(batch([("d1", "Paris", 10), ("d3", "Rome", 11)]))
    restored.snapshot(2)
    restored.notify_checkpoint_complete(2)
    assert committed(tmp_path) == [
        ("d1", "Paris", 1),
        ("d1", "Paris", 10),
        ("d2", "Oslo", 2),
        ("d3", "Rome", 11),
    ]
    restored.close()
    w.close()


def test_restore_is_idempotent_when_the_commit_happened_already(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.restore([])
    w.write_batch(batch([("d1", "Paris", 1), ("d1", "Oslo", 2)]))
    covered = w.snapshot(1)
    w.notify_checkpoint_complete(1)
    w.close()
    again = writer(tmp_path, attempt=1)
    again.restore(covered)
    assert committed(tmp_path) == [("d1", "Oslo", 2), ("d1", "Paris", 1)]
    again.close()


def test_dict_rows_nulls_and_unsafe_values(tmp_path: Path) -> None:
    w = writer(tmp_path, fmt="jsonl")
    w.restore([])
    w.write_batch(
        [
            {"day": "d/1", "city": None, "n": 1},
            {"day": "d/1", "city": "", "n": 2},
            {"day": "a=b%", "city": "x", "n": 3},
        ]
    )
    w.snapshot(1)
    w.notify_checkpoint_complete(1)
    assert files(tmp_path) == [
        "day=a%3Db%25/city=x/part-0-01234567-a0-000001.jsonl",
        "day=d%2F1/city=__DEFAULT_PARTITION__/part-0-01234567-a0-000001.jsonl",
    ]
    lines = (tmp_path / files(tmp_path)[1]).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"n": 1}, {"n": 2}]
    assert partition_directory("c", None) == "c=__DEFAULT_PARTITION__"


def test_partition_errors_name_the_sink_and_the_columns(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.restore([])
    with pytest.raises(SinkError, match=r"lacks the partition column\(s\) \['city'\]") as info:
        w.write_batch(pa.RecordBatch.from_pydict({"day": ["d"], "n": [1]}))
    assert str(tmp_path) in str(info.value) and info.value.suppress_restarts
    with pytest.raises(SinkError, match="is not a dict"):
        w.write_batch([("d", "x", 1)])
    with pytest.raises(ConfigurationError, match="sequence of column names"):
        FileSink(tmp_path, partition_by="day")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="names a column twice"):
        FileSink(tmp_path, partition_by=("day", "day"))
