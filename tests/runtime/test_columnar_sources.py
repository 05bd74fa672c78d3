"""Columnar sources: sequence and Parquet batches, resumable, and columnar event time."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es
from epochstream.connectors.base import SourceContext
from epochstream.connectors.formats import FileSource
from epochstream.connectors.generators import SequenceSource
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, DataError
from epochstream.runtime.watermarks import TimestampsAndWatermarks


def _drain(source: Any, splits: list[Any], *, restarts: bool) -> list[pa.RecordBatch]:
    """Poll to the end; with ``restarts`` rebuild the reader from a pickled snapshot each poll."""
    out: list[pa.RecordBatch] = []
    while True:
        reader = source.create_reader(SourceContext(0, 1, ManualClock()))
        reader.add_splits(splits)
        if reader.exhausted:
            return out
        got = reader.poll(7)  # the row hint; a columnar reader fills its own batch size
        if len(got):
            assert isinstance(got, pa.RecordBatch)
            out.append(got)
        splits = pickle.loads(pickle.dumps(reader.snapshot(1))) if restarts else reader.snapshot(1)
        if not restarts:
            while not reader.exhausted:
                out.append(reader.poll(7))
            return out


def test_sequence_batches_are_int64_value_columns_and_resume_exactly() -> None:
    source = SequenceSource(0, 1_000, batch_size=128)
    batches = _drain(source, source.create_splits(3), restarts=True)
    assert all(b.schema == pa.schema([("value", pa.int64())]) for b in batches)
    assert all(b.num_rows <= 128 for b in batches)
    assert sorted(v for b in batches for v in b.column(0).to_pylist()) == list(range(1_000))
    with pytest.raises(ConfigurationError, match="batch_size must be a positive int"):
        SequenceSource(0, 10, batch_size=0)


def test_parquet_batches_follow_row_groups_and_resume_exactly(tmp_path: Path) -> None:
    rows = [{"id": i, "s": f"r{i}"} for i in range(50)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=20)
    source = FileSource(tmp_path, "parquet", batch_size=8)
    assert source.columnar
    for restarts in (False, True):
        batches = _drain(source, source.create_splits(1), restarts=restarts)
        assert [r for b in batches for r in b.to_pylist()] == rows
        assert max(b.num_rows for b in batches) == 8
    with pytest.raises(ConfigurationError, match=r"batch_size .* is for Parquet"):
        FileSource(tmp_path, "jsonl", batch_size=8)


class _Out:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def batch(self, batch: Any, timestamps: Any) -> None:
        self.items.append(batch)

    def mark(self, mark: int) -> None:
        self.items.append(mark)


def _tw(strategy: es.WatermarkStrategy) -> tuple[TimestampsAndWatermarks, _Out]:
    out = _Out()
    tw = TimestampsAndWatermarks(
        strategy,
        "source 'events'",
        out.batch,
        out.mark,
        lambda idle: None,
        now_ms=lambda: 0,
        interval_ms=0,
    )
    return tw, out


def test_columnar_event_time_copies_the_column_and_advances_by_the_batch_maximum() -> None:
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(100).with_timestamp_column("t")
    tw, out = _tw(strategy)
    tw.add_split("s")
    tw.process("s", pa.record_batch([pa.array([1_000, 3_000, 2_000])], names=["t"]), None)  # type: ignore[arg-type]
    batch, mark = out.items
    assert batch.column("_ts").to_pylist() == [1_000, 3_000, 2_000]
    assert mark == 3_000 - 100 - 1
    stamped = pa.array([5_000], pa.timestamp("ms"))
    tw.process("s", pa.record_batch([stamped], names=["t"]), None)  # type: ignore[arg-type]
    assert out.items[-2].column("_ts").to_pylist() == [5_000]


@pytest.mark.parametrize(
    ("unit", "values", "ms"),
    [
        ("s", [1, -2], [1_000, -2_000]),
        ("ms", [1_500, -1], [1_500, -1]),
        ("us", [1_000_000_500, 1_999, -500], [1_000_000, 1, -1]),
        ("ns", [1_000_000_500_000, 999_999, -1], [1_000_000, 0, -1]),
    ],
)
def test_columnar_event_time_floors_every_timestamp_unit_to_milliseconds(
    unit: str, values: list[int], ms: list[int]
) -> None:
    """Parquet from pandas or Spark holds microseconds: sub-millisecond values are
    floored (towards the earlier millisecond, before the epoch too), not refused."""
    tw, out = _tw(es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("t"))
    tw.add_split("s")
    tw.process("s", pa.record_batch([pa.array(values, pa.timestamp(unit))], names=["t"]), None)  # type: ignore[arg-type]
    assert out.items[0].column("_ts").to_pylist() == ms
    assert out.items[0].column("_ts").type == pa.int64()


def test_columnar_event_time_errors_name_the_source_and_the_column() -> None:
    tw, _ = _tw(es.WatermarkStrategy.bounded_out_of_orderness(0))
    with pytest.raises(DataError, match=r"source 'events'.*with_timestamp_column"):
        tw.process("s", pa.record_batch([pa.array([1])], names=["t"]), None)  # type: ignore[arg-type]
    tw, _ = _tw(es.WatermarkStrategy.bounded_out_of_orderness(0).with_timestamp_column("t"))
    with pytest.raises(DataError, match="column 't' is string"):
        tw.process("s", pa.record_batch([pa.array(["x"])], names=["t"]), None)  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"split s: timestamp column .t. is int64 with 1 nulls"):
        tw.process("s", pa.record_batch([pa.array([1, None])], names=["t"]), None)  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"column 't' is timestamp\[ms\] with 1 nulls"):
        tw.process(
            "s", pa.record_batch([pa.array([5, None], pa.timestamp("ms"))], names=["t"]), None
        )  # type: ignore[arg-type]


class _ViewBatches(es.sources.Source):
    """A columnar source whose one batch has a string_view column (as Polars makes)."""

    columnar = True

    def create_splits(self, parallelism: int) -> list[Any]:
        return []

    def create_reader(self, ctx: SourceContext) -> es.sources.SourceReader:
        return _ViewReader()


class _ViewReader(es.sources.SourceReader):
    def __init__(self) -> None:
        self.left = [pa.record_batch([pa.array(["a", "b"], pa.string_view())], names=["s"])]

    def add_splits(self, splits: list[Any]) -> None:
        pass

    def poll(self, max_records: int) -> Any:
        return self.left.pop() if self.left else []

    @property
    def exhausted(self) -> bool:
        return not self.left

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def test_a_columnar_sources_view_columns_leave_it_as_plain_strings() -> None:
    """string_view crashed the key_by exchange with a raw Arrow error."""
    from columnar_support import make_operator

    op, out = make_operator("source", _ViewBatches())
    op.assign_splits([])
    assert op.poll(10) == 2
    (batch,) = out.items
    assert batch.schema.field("s").type == pa.string() and batch.column("s").to_pylist() == [
        "a",
        "b",
    ]
