"""The OVER aggregation operator: examples (ROWS, RANGE and UNBOUNDED frames, ties, late
rows, NULL and NaN), a property test against DuckDB's window functions with the same
frames over random rows, batches and watermarks on both backends, and snapshot/restore
at another parallelism on both backends."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from columnar_support import MAX_P, Emitted, make_operator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochstream.core.clock import ManualClock
from epochstream.core.events import MAX_WATERMARK
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import AggCall, OverAggregateSpec
from epochstream.graph.transformations import ColumnKey
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.runtime.operators.columnar_over_aggregates import frame_bounds
from epochstream.state.backends.base import KeyedBackendContext, RowSchema, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_range_for_operator
from epochstream.state.operator import OperatorStateStore

KIND = "columnar_over_aggregate"
SCHEMA = pa.schema(
    [
        ("k", pa.string()),
        ("i", pa.int64()),
        ("f", pa.float64()),
        ("id", pa.int64()),
        ("_ts", pa.int64()),
    ]
)
AGGS = (
    AggCall("count_star", None, "n"),
    AggCall("count", "i", "ci"),
    AggCall("sum", "i", "si"),
    AggCall("avg", "i", "ai"),
    AggCall("min", "i", "mini"),
    AggCall("max", "i", "maxi"),
    AggCall("sum", "f", "sf"),
    AggCall("avg", "f", "af"),
    AggCall("min", "f", "minf"),
    AggCall("max", "f", "maxf"),
)
BACKENDS = {
    "heap": HeapStateBackend,
    "rocksdb": lambda: RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1),
}


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.Table.from_pylist(rows, schema=SCHEMA).combine_chunks().to_batches()[0]


def _row(
    k: str, ts: int, i: int | None = None, f: float | None = None, id_: int = 0
) -> dict[str, Any]:
    return {"k": k, "i": i, "f": f, "id": id_, "_ts": ts}


def _op(spec: OverAggregateSpec, **kw: Any) -> tuple[Any, Emitted]:
    return make_operator(KIND, spec, keys=list(spec.partition_by) or None, **kw)


def _by_id(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in rows}


def test_rows_frame_sees_the_n_preceding_rows_ties_by_arrival() -> None:
    spec = OverAggregateSpec(
        ("k",), (AggCall("sum", "i", "s"), AggCall("count_star", None, "n")), "rows", 1
    )
    op, out = _op(spec)
    op.process_batch(
        _batch([_row("a", 5, 1, id_=0), _row("a", 5, 10, id_=1), _row("b", 5, 7, id_=2)]), None
    )
    op.process_batch(_batch([_row("a", 3, 100, id_=3)]), None)
    assert out.rows() == []  # nothing before the watermark passes
    op.process_watermark(5)
    got = _by_id(out.take())
    # a: 100 (ts 3), then 1 and 10 (ts 5, by arrival): each with the one before it.
    assert {i: (r["s"], r["n"]) for i, r in got.items()} == {
        3: (100, 1),
        0: (101, 2),
        1: (11, 2),
        2: (7, 1),
    }
    # By partition, time and arrival, each with its own time as _ts.
    assert [(i, r["_ts"]) for i, r in got.items()] == [(3, 3), (0, 5), (1, 5), (2, 5)]
    op.process_batch(_batch([_row("a", 9, 1000, id_=4)]), None)
    op.process_watermark(20)
    assert [(r["id"], r["s"]) for r in out.take()] == [(4, 1010)]  # history: the last row


def test_range_frame_takes_peers_and_the_interval() -> None:
    spec = OverAggregateSpec(("k",), (AggCall("sum", "i", "s"),), "range", 10)
    op, out = _op(spec)
    op.process_batch(
        _batch([_row("a", 0, 1, id_=0), _row("a", 10, 2, id_=1), _row("a", 10, 4, id_=2)]), None
    )
    op.process_watermark(10)
    assert {r["id"]: r["s"] for r in out.take()} == {0: 1, 1: 7, 2: 7}
    op.process_batch(_batch([_row("a", 11, 8, id_=3), _row("a", 21, 16, id_=4)]), None)
    op.process_watermark(30)
    # ts 11 sees 1..11 (ts 0 is 11 ms older: out); ts 21 sees 11..21.
    assert {r["id"]: r["s"] for r in out.take()} == {3: 14, 4: 24}


def test_unbounded_frames_keep_an_accumulator_per_key() -> None:
    aggs = (AggCall("sum", "i", "s"), AggCall("max", "i", "m"), AggCall("count", "i", "c"))
    for frame, expected in (("rows", {2: 3, 3: 6}), ("range", {2: 6, 3: 6})):
        op, out = _op(OverAggregateSpec(("k",), aggs, frame, None))
        op.process_batch(_batch([_row("a", 1, 1, id_=0), _row("a", 2, 2, id_=1)]), None)
        op.process_watermark(2)
        assert {r["id"]: r["s"] for r in out.take()} == {0: 1, 1: 3}
        op.process_batch(_batch([_row("a", 3, None, id_=2), _row("a", 3, 3, id_=3)]), None)
        op.process_watermark(3)
        got = _by_id(out.take())
        assert {i: r["s"] for i, r in got.items()} == expected
        assert got[3]["m"] == 3 and got[3]["c"] == 3


def test_late_rows_are_dropped_and_counted() -> None:
    op, out = _op(OverAggregateSpec(("k",), (AggCall("count_star", None, "n"),), "rows", None))
    op.process_batch(_batch([_row("a", 5, id_=0)]), None)
    op.process_watermark(5)
    op.process_batch(_batch([_row("a", 5, id_=1), _row("a", 4, id_=2), _row("a", 6, id_=3)]), None)
    op.process_watermark(MAX_WATERMARK)
    assert [(r["id"], r["n"]) for r in out.rows()] == [(0, 1), (3, 2)]
    assert op.counters.late_records_dropped == 2


def test_nulls_and_nans() -> None:
    aggs = (
        AggCall("sum", "f", "s"),
        AggCall("avg", "f", "a"),
        AggCall("min", "f", "lo"),
        AggCall("max", "f", "hi"),
        AggCall("sum", "i", "si"),
    )
    op, out = _op(OverAggregateSpec(("k",), aggs, "rows", 1))
    rows = [
        _row("a", 1, None, None, 0),
        _row("a", 2, None, math.nan, 1),
        _row("a", 3, None, 2.0, 2),
        _row("a", 4, None, 3.0, 3),
        _row("a", 5, None, math.inf, 4),
        _row("a", 6, None, -math.inf, 5),
    ]
    op.process_batch(_batch(rows), None)
    op.process_watermark(MAX_WATERMARK)
    got = _by_id(out.rows())
    assert got[0]["s"] is None and got[0]["lo"] is None and got[0]["si"] is None
    assert math.isnan(got[1]["s"]) and math.isnan(got[1]["lo"]) and math.isnan(got[1]["hi"])
    assert math.isnan(got[2]["s"]) and got[2]["lo"] == 2.0 and math.isnan(got[2]["hi"])
    assert (got[3]["s"], got[3]["a"], got[3]["lo"], got[3]["hi"]) == (5.0, 2.5, 2.0, 3.0)
    assert got[4]["s"] == math.inf and math.isnan(got[5]["s"])


def test_frame_bounds() -> None:
    parts, times = np.array([0, 0, 0, 1, 1]), np.array([1, 2, 2, 1, 9])
    assert [x.tolist() for x in frame_bounds(parts, times, "rows", 1)] == [
        [0, 0, 1, 3, 3],
        [0, 1, 2, 3, 4],
    ]
    assert [x.tolist() for x in frame_bounds(parts, times, "range", 0)] == [
        [0, 1, 1, 3, 4],
        [0, 2, 2, 3, 4],
    ]
    assert [x.tolist() for x in frame_bounds(parts, times, "range", None)] == [
        [0, 0, 0, 3, 3],
        [0, 2, 2, 3, 4],
    ]


def test_bad_input_and_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="'rows' or 'range'"):
        OverAggregateSpec(("k",), (AggCall("count_star", None, "n"),), "groups", 1)
    with pytest.raises(ConfigurationError, match="DISTINCT and FILTER"):
        OverAggregateSpec(("k",), (AggCall("count", "i", "n", distinct=True),), "rows", 1)
    op, _ = _op(OverAggregateSpec(("k",), (AggCall("sum", "i", "id"),), "rows", 1))
    with pytest.raises(DataError, match="column 'id' already"):
        op.process_batch(_batch([_row("a", 1, 1)]), None)


def test_a_row_without_event_time_is_refused() -> None:
    op, _ = _op(OverAggregateSpec(("k",), (AggCall("count_star", None, "n"),), "rows", 1))
    batch = pa.Table.from_pylist([{"k": "a", "_ts": None}]).to_batches()[0]
    with pytest.raises(DataError, match="no event time"):
        op.process_batch(batch.cast(pa.schema([("k", pa.string()), ("_ts", pa.int64())])), None)


def test_min_max_of_strings_rank_them() -> None:
    aggs = (AggCall("min", "k", "lo"), AggCall("max", "k", "hi"))
    op, out = _op(OverAggregateSpec((), aggs, "rows", 1))
    rows = [_row("b", 1, id_=0), _row(None, 2, id_=1), _row("a", 3, id_=2), _row("c", 4, id_=3)]
    op.process_batch(_batch(rows), None)
    op.process_watermark(MAX_WATERMARK)
    got = {r["id"]: (r["lo"], r["hi"]) for r in out.rows()}
    assert got == {0: ("b", "b"), 1: ("b", "b"), 2: ("a", "a"), 3: ("a", "c")}


def test_processing_time_rows_take_the_clock_and_leave_at_once() -> None:
    clock = ManualClock(start=100.0)  # seconds: 100_000 ms
    aggs = (AggCall("sum", "i", "s"), AggCall("count_star", None, "n"))
    op, out = _op(OverAggregateSpec(("k",), aggs, "range", 1_000, proctime=True), clock=clock)
    batch = _batch([_row("a", 0, 1, id_=0), _row("a", 0, 2, id_=1)]).drop_columns(["_ts"])
    op.process_batch(batch, None)  # one batch: peers of one time, emitted at once
    assert [(r["id"], r["s"], r["_ts"]) for r in out.take()] == [(0, 3, 100_000), (1, 3, 100_000)]
    clock.advance(0.5)
    op.process_batch(_batch([_row("a", 0, 4, id_=2)]), None)  # its _ts is not read
    assert [(r["id"], r["s"]) for r in out.take()] == [(2, 7)]
    clock.advance(0.6)  # 1.1 s after the first batch: out of the 1 s range
    op.process_batch(_batch([_row("a", 0, 8, id_=3)]).drop_columns(["_ts"]), None)
    assert [(r["id"], r["s"], r["n"]) for r in out.take()] == [(3, 12, 2)]
    op.process_watermark(MAX_WATERMARK)  # forwarded, fires nothing
    assert out.take() == [] and op.counters.late_records_dropped == 0


# ------------------------------------------------------------------ vs DuckDB


def _random_rows(rng: random.Random, count: int, distinct_times: bool) -> list[dict[str, Any]]:
    rows = []
    used: set[tuple[str, int]] = set()
    for n in range(count):
        k = rng.choice(["a", "b", "c"])
        ts = rng.randrange(0, 60)
        while distinct_times and (k, ts) in used:
            ts = rng.randrange(0, 10_000)
        used.add((k, ts))
        i = rng.choice([None, rng.randrange(-50, 50)])
        f = rng.choice([None, math.nan, rng.uniform(-10, 10), float(rng.randrange(-5, 5))])
        rows.append(_row(k, ts, i, f, n))
    return rows


def _duckdb(
    rows: list[dict[str, Any]], frame: str, preceding: int | None
) -> dict[int, tuple[Any, ...]]:
    bound = "UNBOUNDED" if preceding is None else str(preceding)
    over = f"OVER (PARTITION BY k ORDER BY _ts {frame.upper()} BETWEEN {bound} PRECEDING AND CURRENT ROW)"
    calls = ", ".join(
        [
            f"COUNT(*) {over}",
            f"COUNT(i) {over}",
            f"SUM(i) {over}",
            f"TRUNC(AVG(i) {over})",
            f"MIN(i) {over}",
            f"MAX(i) {over}",
            f"SUM(f) {over}",
            f"AVG(f) {over}",
            f"MIN(f) {over}",
            f"MAX(f) {over}",
        ]
    )
    with duckdb.connect() as con:
        con.register("t", pa.Table.from_pylist(rows, schema=SCHEMA))
        result = con.execute(f"SELECT id, {calls} FROM t").fetchall()
    return {r[0]: tuple(r[1:]) for r in result}


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    frame=st.sampled_from(["rows", "range"]),
    preceding=st.sampled_from([None, 0, 1, 3, 10]),
    backend=st.sampled_from(sorted(BACKENDS)),
)
def test_over_aggregates_equal_duckdb_window_functions(
    seed: int, frame: str, preceding: int | None, backend: str, tmp_path_factory: Any
) -> None:
    rng = random.Random(seed)
    rows = _random_rows(rng, 120, distinct_times=frame == "rows")
    keyed = BACKENDS[backend]().create(
        KeyedBackendContext(
            operator_uid="over",
            subtask=0,
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, 1, 0),
            clock=ManualClock(start=0.0),
            local_dir=str(tmp_path_factory.mktemp("over")),
        )
    )
    op, out = _op(OverAggregateSpec(("k",), AGGS, frame, preceding), keyed_backend=keyed)
    op.initialize_state(None, None)
    # Batches in time order with some shuffling inside each; watermarks behind them.
    rows.sort(key=lambda r: r["_ts"])
    accepted: list[dict[str, Any]] = []
    watermark = -1
    at = 0
    while at < len(rows):
        size = rng.randrange(1, 30)
        chunk = rows[at : at + size]
        at += size
        rng.shuffle(chunk)
        accepted += [r for r in chunk if r["_ts"] > watermark]
        op.process_batch(_batch(chunk), None)
        if rng.random() < 0.5:
            watermark = max(watermark, chunk[0]["_ts"] - rng.randrange(0, 5))
            op.process_watermark(watermark)
    op.process_watermark(MAX_WATERMARK)
    assert op.counters.late_records_dropped == len(rows) - len(accepted)
    expected = _duckdb(accepted, frame, preceding)
    got = out.rows()
    assert len(got) == len(accepted)
    names = [a.output for a in AGGS]
    for r in got:
        want = expected[r["id"]]
        for name, value in zip(names, want, strict=True):
            assert _same(r[name], value), (r, name, value)


# ------------------------------------------------------------------ restore


def _backend_op(
    backend: str, root: Path, spec: OverAggregateSpec, subtask: int, parallelism: int
) -> tuple[Any, Emitted]:
    clock = ManualClock(start=1_000.0)
    keyed = BACKENDS[backend]().create(
        KeyedBackendContext(
            operator_uid="over",
            subtask=subtask,
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, parallelism, subtask),
            clock=clock,
            local_dir=str(root / f"local-{parallelism}-{subtask}-{random.random()}"),
        )
    )
    op = create_operator(
        OperatorSpec(uid="over", name=KIND, kind=KIND, payload=spec, key_selector=ColumnKey("k")),
        OperatorContext(
            subtask_index=subtask,
            parallelism=parallelism,
            max_parallelism=MAX_P,
            attempt=0,
            job_id="job",
            task_name=f"{KIND} ({subtask + 1}/{parallelism})",
            operator_state=OperatorStateStore(),
            keyed_backend=keyed,
            checkpointing=True,
            clock=clock,
        ),
    )
    out = Emitted()
    op.output = out
    op.open()
    return op, out


def _mine(batch: pa.RecordBatch, groups: range) -> pa.RecordBatch:
    kgs = key_groups_by_columns([batch.column("k")], MAX_P, rows=batch.num_rows)
    return batch.filter(pa.array([int(g) in groups for g in kgs]))


def _target(root: Path, subtask: int) -> SnapshotTarget:
    return SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=1,
        directory=str(root / "chk-1"),
        shared_dir=str(root / "shared"),
        name=f"over-1-{subtask}",
    )


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(("frame", "preceding"), [("rows", 2), ("range", 5), ("rows", None)])
def test_restore_at_another_parallelism_equals_the_uninterrupted_run(
    backend: str, frame: str, preceding: int | None, tmp_path: Path
) -> None:
    spec = OverAggregateSpec(("k",), AGGS, frame, preceding)
    rng = random.Random(5)
    rows = sorted(_random_rows(rng, 200, distinct_times=True), key=lambda r: r["_ts"])
    for n, r in enumerate(rows):
        r["k"] = f"k{n % 7}"
    cut = rows[100]["_ts"]
    # Rows after the cut stay buffered across the snapshot; copies of old rows are late.
    first = _batch(rows[:130])
    second = _batch(rows[130:] + [{**r, "id": 1_000 + r["id"]} for r in rows[:20]])
    whole, whole_out = _op(spec)
    whole.process_batch(first, None)
    whole.process_watermark(cut)
    whole.process_batch(second, None)
    whole.process_watermark(MAX_WATERMARK)
    expected = {r["id"]: r for r in whole_out.rows()}

    emitted: list[dict[str, Any]] = []
    handles = []
    for subtask in range(2):
        op, out = _backend_op(backend, tmp_path, spec, subtask, 2)
        op.initialize_state(None, None)
        op.process_batch(_mine(first, op.key_groups), None)
        op.process_watermark(cut)
        emitted += out.rows()
        handle = op.snapshot(_target(tmp_path, subtask)).keyed.run()
        if handle is not None:
            handles.append(handle)
    late = 0
    for subtask in range(3):
        op, out = _backend_op(backend, tmp_path, spec, subtask, 3)
        parts = [p for h in handles if (p := h.restricted_to(op.key_groups)) is not None]
        op.initialize_state(OperatorRestore(keyed=parts), 1)
        op.process_batch(_mine(second, op.key_groups), None)  # no watermark yet: late by stamps
        op.process_watermark(MAX_WATERMARK)
        emitted += out.rows()
        late += op.counters.late_records_dropped
    assert late == whole.counters.late_records_dropped > 0
    got = {r["id"]: r for r in emitted}
    assert got.keys() == expected.keys()
    for key, row in expected.items():
        bad = {c: (v, got[key][c]) for c, v in row.items() if not _same(got[key][c], v)}
        assert not bad, (row, bad)


def test_restore_refuses_state_of_another_operator(tmp_path: Path) -> None:
    spec = OverAggregateSpec(("k",), (AggCall("count_star", None, "n"),), "rows", 1)
    op, _ = _backend_op("heap", tmp_path, spec, 0, 1)
    op.initialize_state(None, None)
    schema = RowSchema(pa.schema([("x", pa.uint64())]), "x")
    other = op.keyed.row_table("other", schema)
    other.append(
        pa.record_batch([pa.array([1], pa.uint64())], names=["x"]), np.array([1], np.int32)
    )
    handle = op.snapshot(_target(tmp_path, 0)).keyed.run()
    again, _ = _backend_op("heap", tmp_path, spec, 0, 1)
    with pytest.raises(StateError, match="not an OVER aggregation's"):
        again.initialize_state(OperatorRestore(keyed=[handle]), 1)
