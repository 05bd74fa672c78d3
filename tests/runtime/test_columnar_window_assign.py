"""Window assignment (TUMBLE/HOP/CUMULATE without aggregation): against DuckDB over
random event times (negative ones too) with offsets, the output's columns and types,
and the errors."""

from __future__ import annotations

import random

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from columnar_support import make_operator

from epochstream.exceptions import ConfigurationError, DataError
from epochstream.graph.specs import WindowAssignSpec, WindowTvf
from epochstream.runtime.operators.columnar_window_assign import TableWindows

KIND = "columnar_window_assign"
WINDOWS = [
    WindowTvf.tumble(10),
    WindowTvf.tumble(10, offset=3),
    WindowTvf.hop(10, 4),
    WindowTvf.hop(10, 5, offset=2),
    WindowTvf.hop(4, 10, offset=1),  # slide > size: some rows in no window
    WindowTvf.cumulate(12, 4),
    WindowTvf.cumulate(12, 3, offset=5),
]


def _duckdb(ts: list[int], window: WindowTvf) -> list[tuple[int, int, int]]:
    """``(row, start, end)`` of every window of each time, by SQL over candidate starts."""
    db = duckdb.connect()
    db.register("t", pa.table({"row": list(range(len(ts))), "ts": ts}))
    off = window.offset
    if window.kind == "cumulate":
        step = int(window.step or 0)
        query = f"""
            SELECT row, base, base + {step} * k FROM (
                SELECT row, ts, ts - (((ts - {off}) % {window.size}) + {window.size})
                    % {window.size} AS base FROM t) x, range(1, {window.size // step + 1}) r(k)
            WHERE base + {step} * k > ts
        """
    else:
        slide = window.period
        query = f"""
            SELECT row, s, s + {window.size} FROM (
                SELECT row, ts, ts - (((ts - {off}) % {slide}) + {slide}) % {slide}
                    - {slide} * j AS s
                FROM t, range(0, {window.size // slide + 2}) r(j)) x
            WHERE s > ts - {window.size} AND s <= ts
        """
    return sorted(db.execute(query).fetchall())


@pytest.mark.parametrize("window", WINDOWS, ids=repr)
def test_windows_equal_duckdb(window: WindowTvf) -> None:
    rng = random.Random(window.size * 31 + window.offset)
    ts = [rng.randint(-50, 50) for _ in range(300)]
    op, out = make_operator(KIND, WindowAssignSpec(window))
    for i in range(0, len(ts), 64):
        part = ts[i : i + 64]
        op.process_batch(pa.record_batch({"row": list(range(i, i + len(part))), "_ts": part}), None)
    got = []
    for batch in out.batches():
        assert batch.schema.names == ["row", "_ts", "window_start", "window_end", "window_time"]
        assert all(batch.schema.field(n).type == pa.timestamp("ms") for n in batch.schema.names[2:])
        starts, ends, times = (
            batch[n].cast(pa.int64()).to_pylist() for n in batch.schema.names[2:]
        )
        assert times == [e - 1 for e in ends]
        assert batch["_ts"].to_pylist() == [ts[r] for r in batch["row"].to_pylist()]
        got += zip(batch["row"].to_pylist(), starts, ends, strict=True)
    assert sorted(got) == _duckdb(ts, window)


def test_a_rows_windows_come_together_by_end() -> None:
    rows, starts, ends = TableWindows(WindowTvf.cumulate(10, 5)).of(np.array([3, 7]))
    assert (rows.tolist(), starts.tolist(), ends.tolist()) == ([0, 0, 1], [0, 0, 0], [5, 10, 10])


def test_bad_input_is_refused() -> None:
    op, _ = make_operator(KIND, WindowAssignSpec(WindowTvf.tumble(10)))
    with pytest.raises(DataError, match="event time"):
        op.process_batch(pa.record_batch({"v": [1]}), None)
    with pytest.raises(DataError, match="window_end"):
        op.process_batch(pa.record_batch({"window_end": [1], "_ts": [1]}), None)
    with pytest.raises(ConfigurationError, match="positive"):
        WindowTvf.hop(10, 0)
