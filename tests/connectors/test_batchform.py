"""The helpers sinks share for Arrow record batches (connectors/batchform.py)."""

from __future__ import annotations

import datetime
import decimal
import json

import pyarrow as pa
import pytest

from epochstream.connectors.batchform import (
    is_batch,
    json_default,
    json_rows,
    row_dicts,
    user_columns,
)
from epochstream.core.arrow import KG_FIELD


def test_user_columns_leave_out_the_runtime_columns_only() -> None:
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1]), pa.array([7]), pa.array([0], pa.int32())],
        schema=pa.schema([("k", pa.int64()), ("_ts", pa.int64()), KG_FIELD]),
    )
    assert user_columns(batch).schema.names == ["k"]
    plain = pa.record_batch({"k": [1]})
    assert user_columns(plain) is plain, "nothing to drop: the same batch"
    assert row_dicts(batch) == [{"k": 1}]
    assert is_batch(batch) and not is_batch([{"k": 1}])


def test_json_rows_map_arrow_types_as_documented() -> None:
    when = datetime.datetime(2026, 11, 28, 10, 0, 0, 5)
    batch = pa.record_batch(
        {
            "t": pa.array([when], pa.timestamp("us")),
            "time": pa.array([when.time()], pa.time64("us")),
            "d": pa.array([decimal.Decimal("-0.10")], pa.decimal128(4, 2)),
            "dur": pa.array([datetime.timedelta(milliseconds=1500)], pa.duration("ms")),
            "b": pa.array([b"hi"]),
            "l": pa.array([[1, 2]]),
            "s": pa.array([{"x": 1.5}]),
            "_ts": [3],
        }
    )
    (line,) = json_rows(batch, separators=(",", ":"))
    assert json.loads(line) == {
        "t": "2026-11-28T10:00:00.000005",
        "time": "10:00:00.000005",
        "d": "-0.10",
        "dur": 1.5,
        "b": "aGk=",
        "l": [1, 2],
        "s": {"x": 1.5},
    }
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        json_default({1})
    with pytest.raises(ValueError, match="Out of range float"):
        json_rows(pa.record_batch({"f": [float("nan")]}), allow_nan=False)


def test_json_rows_keep_nanoseconds_and_name_time_zones() -> None:
    batch = pa.record_batch(
        {
            "ns": pa.array([1_764_324_000_000_000_001], pa.timestamp("ns")),
            "paris": pa.array([1_764_324_000], pa.timestamp("s", "Europe/Paris")),
            "l": pa.array([[datetime.date(2026, 1, 2)]]),  # nested: Python's isoformat
        }
    )
    (line,) = json_rows(batch)
    assert json.loads(line) == {
        "ns": "2025-11-28T10:00:00.000000001",
        "paris": "2025-11-28T11:00:00+0100",
        "l": ["2026-01-02"],
    }
