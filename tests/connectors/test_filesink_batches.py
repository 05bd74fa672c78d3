"""FileSink writing Arrow record batches: each format's output, schema checks, rolling,
a restore keeping exactly-once, and columnar jobs end to end on the local runner."""

from __future__ import annotations

import csv
import datetime
import decimal
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es
from epochstream.connectors.base import SinkContext
from epochstream.connectors.filesink import FileSink, FileSinkWriter
from epochstream.core.arrow import KG_FIELD
from epochstream.exceptions import SinkError

JOB = "0123456789abcdef"


def ctx(attempt: int = 0) -> SinkContext:
    return SinkContext(0, 1, attempt, JOB, True)


def writer(out: Path, fmt: str, attempt: int = 0, **kwargs: Any) -> FileSinkWriter:
    w = FileSink(out, format=fmt, **kwargs).create_writer(ctx(attempt))
    return w


def batch(start: int, n: int) -> pa.RecordBatch:
    """``k``, ``word`` and the runtime's ``_ts`` and ``_kg`` columns."""
    ks = list(range(start, start + n))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ks, pa.int64()),
            pa.array([f"w{k}" for k in ks]),
            pa.array([1000 + k for k in ks], pa.int64()),
            pa.array([k % 4 for k in ks], pa.int32()),
        ],
        schema=pa.schema([("k", pa.int64()), ("word", pa.string()), ("_ts", pa.int64()), KG_FIELD]),
    )


def visible(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if not p.name.startswith((".", "_")))


def read_back(out: Path, fmt: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in visible(out):
        if fmt == "parquet":
            rows += pq.read_table(path).to_pylist()
        elif fmt == "jsonl":
            rows += [json.loads(line) for line in path.read_text().splitlines()]
        else:
            rows += [{"k": int(r["k"]), "word": r["word"]} for r in csv.DictReader(path.open())]
    return rows


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_batches_are_written_without_runtime_columns_and_roll_by_records(
    tmp_path: Path, fmt: str
) -> None:
    w = writer(tmp_path, fmt, roll_records=4)
    w.restore([])
    w.write_batch(batch(0, 6))  # rolls after 4
    w.write_batch([{"k": 6, "word": "w6"}])  # a union of forms: rows into the same file
    w.write_batch(batch(7, 1))
    assert visible(tmp_path) == []
    w.snapshot(1)
    w.notify_checkpoint_complete(1)
    assert len(visible(tmp_path)) == 2
    assert read_back(tmp_path, fmt) == [{"k": k, "word": f"w{k}"} for k in range(8)]
    if fmt == "parquet":
        schema = pq.read_schema(visible(tmp_path)[0])
        assert schema.names == ["k", "word"] and schema.field("k").type == pa.int64()
    w.close()


def test_csv_batches_roll_by_bytes_with_a_header_per_file(tmp_path: Path) -> None:
    w = writer(tmp_path, "csv", rolling=es.sinks.RollingPolicy(max_bytes=30))
    w.restore([])
    for i in range(4):
        w.write_batch(batch(i * 3, 3))  # about 30 bytes each: a file per batch
    w.snapshot(1)
    w.notify_checkpoint_complete(1)
    files = visible(tmp_path)
    assert len(files) == 4
    assert all(f.read_text().startswith('"k","word"\n') for f in files)
    assert read_back(tmp_path, "csv") == [{"k": k, "word": f"w{k}"} for k in range(12)]


def test_typed_batches_in_jsonl_and_csv(tmp_path: Path) -> None:
    when = datetime.datetime(2026, 11, 28, 10, 0, 0, 123000)
    typed = pa.record_batch(
        {
            "t": pa.array([when], pa.timestamp("ms")),
            "tz": pa.array([when.replace(tzinfo=datetime.UTC)], pa.timestamp("us", "UTC")),
            "d": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
            "day": pa.array([when.date()]),
            "b": pa.array([b"\x00\x01"]),
            "ok": [True],
            "none": pa.array([None], pa.int64()),
        }
    )
    for fmt in ("jsonl", "csv"):
        w = writer(tmp_path / fmt, fmt)
        w.restore([])
        w.write_batch(typed)
        w.snapshot(1)
        w.notify_checkpoint_complete(1)
    (jsonl,) = visible(tmp_path / "jsonl")
    assert json.loads(jsonl.read_text()) == {
        "t": "2026-11-28T10:00:00.123",
        "tz": "2026-11-28T10:00:00.123000Z",
        "d": "1.50",
        "day": "2026-11-28",
        "b": "AAE=",
        "ok": True,
        "none": None,
    }
    (csv_file,) = visible(tmp_path / "csv")
    header, line = csv_file.read_text().splitlines()
    assert header == '"t","tz","d","day","b","ok","none"'
    assert line.startswith("2026-11-28 10:00:00.123,2026-11-28 10:00:00.123000Z,1.50,2026-11-28,")
    assert line.endswith(",true,")


def test_a_batch_of_another_schema_is_refused_naming_path_and_both_schemas(
    tmp_path: Path,
) -> None:
    w = writer(tmp_path, "parquet")
    w.restore([])
    w.write_batch(batch(0, 2))
    other = pa.record_batch({"k": pa.array([1], pa.int32()), "word": ["x"]})
    with pytest.raises(SinkError, match="schema differs") as info:
        w.write_batch(other)
    text = str(info.value)
    assert str(tmp_path) in text and "k: int64" in text and "k: int32" in text
    assert info.value.suppress_restarts
    w.close()
    w = writer(tmp_path / "csv", "csv")
    w.restore([])
    w.write_batch(batch(0, 2))
    with pytest.raises(SinkError, match=r"columns \['k'\] does not fit the file's header"):
        w.write_batch(pa.record_batch({"k": [1]}))
    w = writer(tmp_path / "lists", "csv")
    w.restore([])
    with pytest.raises(SinkError, match=r"cannot write a batch of \['l'\] as CSV") as info:
        w.write_batch(pa.record_batch({"l": [[1]]}))
    assert info.value.suppress_restarts


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_restore_commits_pre_committed_batches_and_drops_the_rest(tmp_path: Path, fmt: str) -> None:
    crashed = writer(tmp_path, fmt)
    crashed.restore([])
    crashed.write_batch(batch(0, 5))
    entries = crashed.snapshot(1)  # checkpoint 1 completes; the notification is lost
    crashed.write_batch(batch(100, 5))  # after the barrier: replayed by the next attempt
    crashed.snapshot(2)  # checkpoint 2 never completes
    crashed.close()
    restored = writer(tmp_path, fmt, attempt=1)
    restored.restore(entries)
    restored.write_batch(batch(5, 3))
    restored.snapshot(2)
    restored.notify_checkpoint_complete(2)
    restored.close()
    assert sorted(r["k"] for r in read_back(tmp_path, fmt)) == list(range(8))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_columnar_job_into_file_sink_writes_its_input_exactly(tmp_path: Path, fmt: str) -> None:
    n = 5_000
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.1, storage=str(tmp_path / "ckpt"))
    (
        env.from_sequence(0, n, batch_size=250, rate=20_000)
        .uid("numbers")
        .sink_to(FileSink(tmp_path / "out", format=fmt))
        .uid("files")
    )
    env.execute(f"columnar-{fmt}")
    out = tmp_path / "out"
    assert len(visible(out)) > 2, "several checkpoints committed files"
    if fmt == "parquet":
        table = pq.read_table(out)  # hidden files are skipped
        assert table.schema.names == ["value"] and table.schema.field(0).type == pa.int64()
        values = table["value"].to_pylist()
    elif fmt == "jsonl":
        values = [r["value"] for r in es.testing.read_committed(out)]
    else:
        values = [int(r["value"]) for p in visible(out) for r in csv.DictReader(p.open())]
    assert sorted(values) == list(range(n))


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_changelog_column_writes_each_change_with_its_kind(tmp_path: Path, fmt: str) -> None:
    from epochstream.core.changelog import RowKind, with_kinds

    out = tmp_path / "out"
    w = writer(out, fmt, changelog_column="op")
    w.restore([])
    kinds = [RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE]
    w.write_batch(with_kinds(batch(0, 4), kinds))
    w.write_batch(batch(4, 1))  # an append-only batch: +I
    w.snapshot(1)
    w.notify_checkpoint_complete(1)
    if fmt == "csv":  # read_back keeps k and word only
        got = [dict(r) for p in visible(out) for r in csv.DictReader(p.open())]
    else:
        got = read_back(out, fmt)
    assert [(r["op"], int(r["k"])) for r in got] == [
        ("+I", 0),
        ("-U", 1),
        ("+U", 2),
        ("-D", 3),
        ("+I", 4),
    ]
    assert list(got[0]) == ["op", "k", "word"], "the kinds first, then the row"


def test_changelog_column_on_rows_and_bad_settings(tmp_path: Path) -> None:
    w = writer(tmp_path / "out", "jsonl", changelog_column="op")
    w.restore([])
    w.write_batch([{"k": 1}])
    w.snapshot(1)
    w.notify_checkpoint_complete(1)
    assert read_back(tmp_path / "out", "jsonl") == [{"op": "+I", "k": 1}]
    with pytest.raises(SinkError, match="without a 'op' key") as info:
        w.write_batch([{"op": "x", "k": 1}])
    assert info.value.suppress_restarts
    clash = pa.record_batch({"op": ["x"]})
    with pytest.raises(SinkError, match="has a column 'op' already"):
        w.write_batch(clash)
    with pytest.raises(es.ConfigurationError, match="must name a new column"):
        FileSink(tmp_path, changelog_column="_op")
    with pytest.raises(es.ConfigurationError, match="is a partition column"):
        FileSink(tmp_path, changelog_column="op", partition_by=["op"])
