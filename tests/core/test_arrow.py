"""The Arrow helpers of :mod:`epochstream.core.arrow`: IPC frames, rows, schema checks."""

from __future__ import annotations

import pickle

import pyarrow as pa

from epochstream.core.arrow import decode_ipc, encode_ipc, is_ipc_frame, rows_of, same_columns


def test_ipc_frames_round_trip_and_are_told_apart_from_pickles() -> None:
    batch = pa.record_batch({"k": ["a", "b"], "v": [1, 2], "_ts": pa.array([5, 6], pa.int64())})
    frame = encode_ipc(batch)
    assert is_ipc_frame(frame)
    assert not is_ipc_frame(pickle.dumps([1, 2], protocol=5))
    assert decode_ipc(frame).equals(batch)


def test_rows_of_gives_what_to_pylist_gives() -> None:

    batch = pa.record_batch(
        {
            "i": pa.array([1, None, 3], pa.int32()),
            "s": ["a", None, "c"],
            "l": pa.array([[1, 2], None, []], pa.list_(pa.int64())),
            "st": pa.array([{"x": 1}, None, {"x": None}], pa.struct([("x", pa.int64())])),
            "t": pa.array([0, 1_000, None], pa.timestamp("ms")),
        }
    )
    assert rows_of(batch) == batch.to_pylist()
    assert rows_of(pa.Table.from_batches([batch, batch])) == batch.to_pylist() * 2
    assert rows_of(batch.slice(0, 0)) == []


def test_same_columns_lets_order_integer_widths_and_nullability_through() -> None:
    first = pa.schema([("k", pa.string()), pa.field("v", pa.int64(), nullable=False)])
    assert same_columns(pa.schema([("v", pa.int8()), ("k", pa.string())]), first)
    assert not same_columns(pa.schema([("k", pa.string()), ("v", pa.float64())]), first)
    assert not same_columns(pa.schema([("k", pa.large_string()), ("v", pa.int64())]), first)
    assert not same_columns(pa.schema([("k", pa.string())]), first)
