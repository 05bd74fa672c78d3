"""File source formats (JSON lines, CSV, Parquet), bad records, monitored directories."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from epochstream.connectors.base import SourceContext, SourceReader
from epochstream.connectors.formats import FileSource, MonitoringFileEnumerator, ParquetSplit
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, SourceDecodeError


def ctx(dead: list[Any] | None = None) -> SourceContext:
    return SourceContext(0, 1, ManualClock(), dead_letter=None if dead is None else dead.append)


def read_all(source: FileSource, dead: list[Any] | None = None, batch: int = 3) -> list[Any]:
    reader = source.create_reader(ctx(dead))
    reader.add_splits(source.create_splits(1))
    out: list[Any] = []
    while not reader.exhausted:
        out += reader.poll(batch)
    reader.close()
    return out


def read_with_restarts(source: FileSource, batch: int) -> list[Any]:
    """Read ``batch`` records at a time, recreating the reader from a pickled snapshot each time."""
    splits = source.create_splits(2)
    out: list[Any] = []
    while True:
        reader: SourceReader = source.create_reader(ctx())
        reader.add_splits(splits)
        if reader.exhausted:
            return out
        out += reader.poll(batch)
        splits = pickle.loads(pickle.dumps(reader.snapshot(1)))
        reader.close()


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)


def test_jsonl_reads_values_skips_blank_lines_and_resumes_from_snapshots(tmp_path: Path) -> None:
    rows = [{"id": i, "name": f"n{i}", "ü": "é" * (i % 3)} for i in range(25)]
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in rows[:10])
    text += "\n\n" + "\r\n".join(json.dumps(r) for r in rows[10:]) + "\n"
    (tmp_path / "a.jsonl").write_text(text, encoding="utf-8")
    source = FileSource(tmp_path, "jsonl")
    assert read_all(source) == rows
    assert read_with_restarts(source, batch=4) == rows


def test_jsonl_bad_line_fails_naming_file_offset_and_reason(tmp_path: Path) -> None:
    good = b'{"a": 1}\n'
    path = tmp_path / "a.jsonl"
    path.write_bytes(good * 3 + b"{not json\n" + good)
    source = FileSource(path, "jsonl")
    reader = source.create_reader(ctx())
    reader.add_splits(source.create_splits(1))
    assert reader.poll(100) == [{"a": 1}] * 3, "records before the bad one go out first"
    with pytest.raises(SourceDecodeError, match=r"a\.jsonl.*byte offset 27: not JSON") as info:
        reader.poll(100)
    assert info.value.offset == 3 * len(good)
    assert info.value.suppress_restarts


def test_jsonl_dead_letters_hold_exactly_the_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a": 1}\n[1,\n{"a": 2}\n\xff\xfe\n{"a": 3}')
    dead: list[Any] = []
    assert read_all(FileSource(path, "jsonl", on_error="dead_letter"), dead) == [
        {"a": 1},
        {"a": 2},
        {"a": 3},
    ]
    assert [(d["offset"], d["line"]) for d in dead] == [(9, "[1,"), (22, "\\xff\\xfe")]
    assert all(d["file"] == str(path) and d["error"] for d in dead)


def test_dead_letter_mode_without_a_consumer_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")
    with pytest.raises(ConfigurationError, match="DEAD_LETTERS"):
        FileSource(tmp_path, "jsonl", on_error="dead_letter").create_reader(ctx())


def test_csv_rows_are_dicts_by_header_and_resume_after_the_header(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text('id,name\n1,ann\n2,"b, c"\n\n3,dee\n')
    (tmp_path / "b.csv").write_text("id,name\r\n4,eve\r\n")
    source = FileSource(tmp_path, "csv")
    expected = [
        {"id": "1", "name": "ann"},
        {"id": "2", "name": "b, c"},
        {"id": "3", "name": "dee"},
        {"id": "4", "name": "eve"},
    ]
    assert read_all(source) == expected
    assert read_with_restarts(source, batch=1) == expected


def test_csv_wrong_field_count_fails_or_is_dead_lettered(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text('id,name\n1,ann\n2\n3,"open\n4,dee\n')
    with pytest.raises(
        SourceDecodeError, match=r"as CSV: line at byte offset 14: expected 2 fields"
    ):
        read_all(FileSource(path, "csv"))
    dead: list[Any] = []
    rows = read_all(FileSource(path, "csv", on_error="dead_letter"), dead)
    assert rows == [{"id": "1", "name": "ann"}, {"id": "4", "name": "dee"}]
    assert [d["line"] for d in dead] == ["2", '3,"open']


def test_parquet_row_groups_are_splits_read_as_dicts(tmp_path: Path) -> None:
    rows = [{"id": i, "v": i * 0.5, "s": f"r{i}"} for i in range(23)]
    write_parquet(tmp_path / "a.parquet", rows[:17], row_group_size=5)
    write_parquet(tmp_path / "b.parquet", rows[17:], row_group_size=100)
    source = FileSource(tmp_path, "parquet")
    splits = source.create_splits(2)
    assert [(os.path.basename(s.path), s.row_group) for s in splits] == [
        ("a.parquet", 0),
        ("a.parquet", 1),
        ("a.parquet", 2),
        ("a.parquet", 3),
        ("b.parquet", 0),
    ]
    assert read_all(source, batch=4) == rows
    assert read_with_restarts(source, batch=3) == rows


def test_parquet_unreadable_file_fails_naming_it_or_is_dead_lettered(tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", [{"id": 1}], row_group_size=10)
    (tmp_path / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(SourceDecodeError, match=r"b\.parquet.*as Parquet: row group 0"):
        read_all(FileSource(tmp_path, "parquet"))
    dead: list[Any] = []
    assert read_all(FileSource(tmp_path, "parquet", on_error="dead_letter"), dead) == [{"id": 1}]
    assert [(os.path.basename(d["file"]), d["row_group"]) for d in dead] == [("b.parquet", 0)]


def test_columnar_parquet_of_another_schema_fails_naming_the_file(tmp_path: Path) -> None:
    """A file whose column had another type failed at an edge downstream, naming no file."""
    pq.write_table(
        pa.table({"id": pa.array([1], pa.int32()), "price": [1]}), tmp_path / "a.parquet"
    )
    # Other integer widths and another column order are the same schema.
    pq.write_table(
        pa.table({"price": [2], "id": pa.array([2], pa.int64())}), tmp_path / "b.parquet"
    )
    pq.write_table(pa.table({"id": [3], "price": [2.5]}), tmp_path / "c.parquet")

    def batches(source: FileSource, dead: list[Any] | None = None) -> list[Any]:
        reader = source.create_reader(ctx(dead))
        reader.add_splits(source.create_splits(1))
        out: list[Any] = []
        while not reader.exhausted:
            got = reader.poll(10)
            if len(got):
                out.append(got)
        return out

    other_type = r"c\.parquet.*row group 0: .*column 'price' is double in one batch and int64"
    with pytest.raises(SourceDecodeError, match=other_type):
        batches(FileSource(tmp_path, "parquet", batch_size=10))
    dead: list[Any] = []
    read = batches(FileSource(tmp_path, "parquet", batch_size=10, on_error="dead_letter"), dead)
    assert [b.num_rows for b in read] == [1, 1]
    assert [os.path.basename(d["file"]) for d in dead] == ["c.parquet"]
    # Rows have no schema to keep: every file reads.
    assert [r["price"] for r in read_all(FileSource(tmp_path, "parquet"))] == [1, 2, 2.5]


def test_bad_settings_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="format"):
        FileSource(tmp_path, "xml")
    with pytest.raises(ConfigurationError, match="on_error"):
        FileSource(tmp_path, "text", on_error="ignore")
    with pytest.raises(ConfigurationError, match="monitor_interval"):
        FileSource(tmp_path, "text", monitor_interval=0)
    with pytest.raises(ConfigurationError, match="does not exist"):
        FileSource(tmp_path / "missing", "text")


def test_monitoring_enumerator_turns_new_files_into_splits_once(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("1\n")
    source = FileSource(tmp_path, "jsonl", monitor_interval=2.0)
    assert not source.bounded
    enum = source.create_enumerator(2, None)
    assert isinstance(enum, MonitoringFileEnumerator)
    assert [s.path for s in enum.initial_splits()] == [str(tmp_path / "a.jsonl")]
    assert enum.next_discovery() == 0.0
    assert enum.discover(10.0) == []
    assert enum.next_discovery() == 12.0
    (tmp_path / ".b.jsonl").write_text("2\n")  # being written: hidden
    assert enum.discover(12.0) == []
    os.replace(tmp_path / ".b.jsonl", tmp_path / "b.jsonl")
    assert [s.path for s in enum.discover(14.0)] == [str(tmp_path / "b.jsonl")]
    state = enum.snapshot()
    assert state == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    (tmp_path / "c.jsonl").write_text("3\n")
    restored = source.create_enumerator(2, pickle.loads(pickle.dumps(state)))
    assert [s.path for s in restored.initial_splits()] == [str(tmp_path / "c.jsonl")]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_monitored_reader_asks_for_splits_when_it_read_all_it_has(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"x.{fmt}"
    if fmt == "parquet":
        write_parquet(path, [{"a": 1}, {"a": 2}], row_group_size=5)
    else:
        path.write_text('{"a": 1}\n{"a": 2}\n')
    source = FileSource(tmp_path, fmt, monitor_interval=1.0)
    reader = source.create_reader(ctx())
    assert reader.needs_splits, "nothing assigned yet"
    reader.add_splits(source.create_splits(1))
    assert not reader.needs_splits
    assert reader.poll(1) == [{"a": 1}]
    assert not reader.needs_splits, "a split is still being read"
    assert reader.poll(10) == [{"a": 2}]
    assert reader.poll(10) == []
    assert reader.needs_splits and not reader.exhausted


def test_monitored_reader_never_ends_and_an_empty_glob_is_allowed(tmp_path: Path) -> None:
    source = FileSource(str(tmp_path / "*.parquet"), "parquet", monitor_interval=1.0)
    assert source.create_splits(2) == []
    reader = source.create_reader(ctx())
    assert not reader.exhausted
    write_parquet(tmp_path / "x.parquet", [{"a": 1}], row_group_size=5)
    reader.add_splits([ParquetSplit("x", str(tmp_path / "x.parquet"), 0, 0)])
    assert reader.poll(10) == [{"a": 1}]
    assert not reader.exhausted
