"""The SQL session window aggregation operator: examples, a property test against
DuckDB's sessionization of random out-of-order batches (every aggregate, zero to two
keys, both backends), the late-row rule held equal to the single-aggregate session
operator's, and snapshot/restore at another parallelism."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from aggregate_support import (
    BACKENDS,
    CATALOG,
    VALUES_SCHEMA,
    assert_equal,
    duckdb_aggregates,
    duckdb_values,
    operator_on,
    routed,
    snapshot_target,
)
from columnar_support import make_operator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochstream.core.events import MAX_WATERMARK
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import AggCall, SessionAggregateSpec, SessionWindowSpec
from epochstream.runtime.operators.columnar_sessions import accepted_rows, session_runs
from epochstream.state.handles import OperatorRestore

KIND = "columnar_session_aggregate"
SCHEMA = VALUES_SCHEMA.append(pa.field("_ts", pa.int64()))


def _op(
    spec: SessionAggregateSpec,
    subtask: int = 0,
    parallelism: int = 1,
    backend: str = "heap",
    local_dir: str = "",
) -> Any:
    return operator_on(
        KIND,
        spec,
        spec.keys,
        subtask=subtask,
        parallelism=parallelism,
        backend=backend,
        local_dir=local_dir,
    )


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMA)


def _results(batches: list[pa.RecordBatch], spec: SessionAggregateSpec) -> dict[Any, Any]:
    """Emitted rows as ``{(keys..., start, end): {output: value}}`` (times as int ms)."""
    out: dict[Any, Any] = {}
    names = [*spec.keys, "window_start", "window_end", *(a.output for a in spec.aggs), "_ts"]
    for batch in batches:
        assert batch.schema.names == names
        assert batch.schema.field("window_end").type == pa.timestamp("ms")
        table = batch.to_pydict()
        starts = batch.column("window_start").cast(pa.int64()).to_pylist()
        ends = batch.column("window_end").cast(pa.int64()).to_pylist()
        for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
            assert table["_ts"][i] == end - 1
            key = (*(table[k][i] for k in spec.keys), start, end)
            assert key not in out, f"session {key} emitted twice"
            out[key] = {a.output: table[a.output][i] for a in spec.aggs}
    return out


def _duckdb(rows: list[dict[str, Any]], spec: SessionAggregateSpec) -> dict[Any, Any]:
    """DuckDB's sessions: per key, a row opens a new session when it starts after every
    ``ts + gap`` of the rows before it (by time); each session aggregated."""
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    db = duckdb.connect()
    db.register("t", table)
    keys = list(spec.keys)
    part = f"PARTITION BY {', '.join(keys)}" if keys else ""
    gap = spec.gap
    # Both windows order rows alike (ties by row number): a row's session number counts
    # the rows before it that opened one.
    sessions = (
        f"SELECT *, sum(CASE WHEN reach IS NULL OR _ts > reach THEN 1 ELSE 0 END) OVER "
        f"({part} ORDER BY _ts, rid ROWS UNBOUNDED PRECEDING) AS sid FROM ("
        f"SELECT *, max(_ts + {gap}) OVER ({part} ORDER BY _ts, rid ROWS BETWEEN UNBOUNDED "
        "PRECEDING AND 1 PRECEDING) AS reach FROM (SELECT *, row_number() OVER () AS rid "
        "FROM t))"
    )
    select = duckdb_aggregates(spec.aggs)
    group = [*keys, "sid"]
    query = (
        f"SELECT {', '.join([*keys, ''])} min(_ts), max(_ts) + {gap}, {', '.join(select)} "
        f"FROM ({sessions}) GROUP BY {', '.join(group)}"
    )
    out: dict[Any, Any] = {}
    for row in db.execute(query).fetchall():
        values = list(row[len(keys) + 2 :])
        out[tuple(row[: len(keys) + 2])] = duckdb_values(values, spec.aggs)
    return out


# ---------------------------------------------------------------------- examples


def test_session_runs_orders_by_key_and_start_and_opens_at_gaps() -> None:
    order, bounds = session_runs(
        pa.array([0, 0, 0, 1]).to_numpy(),
        pa.array([30, 0, 10, 5]).to_numpy(),
        pa.array([40, 10, 20, 6]).to_numpy(),
    )
    assert order.tolist() == [1, 2, 0, 3]
    assert bounds.tolist() == [0, 2, 3]  # [0, 20) of key 0 (touching), [30, 40), key 1


def test_accepted_rows_lets_a_late_row_join_an_open_session_only() -> None:
    slots = pa.array([0, 1]).to_numpy()
    ts = pa.array([5, 5]).to_numpy()
    # Watermark 100: both rows' own windows [5, 15) passed; key 0 has a session open at 9.
    got = accepted_rows(slots, ts, pa.array([0]).to_numpy(), pa.array([9]).to_numpy(), 2, 10, 100)
    assert got is not None and got.tolist() == [True, False]
    assert accepted_rows(slots, ts, slots[:0], ts[:0], 2, 10, 0) is None


def test_sessions_merge_and_carry_every_aggregate() -> None:
    spec = SessionAggregateSpec(
        keys=("k2",),
        gap=10,
        aggs=(
            AggCall("count_star", None, "n"),
            AggCall("count", "v", "d", distinct=True),
            AggCall("sum", "v", "s"),
            AggCall("avg", "f", "a"),
            AggCall("max", "v", "top", filter="b"),
        ),
    )
    op, out = _op(spec)
    row = {"k1": 1, "f": 1.0, "b": True}
    op.process_batch(
        _batch(
            [
                {**row, "k2": "a", "v": 1, "_ts": 0},
                {**row, "k2": "a", "v": 1, "_ts": 30},  # a second session of "a"
                {**row, "k2": "b", "v": 7, "_ts": 3},
            ]
        ),
        None,
    )
    # 10 touches [0, 10): the first session of "a" grows to [0, 20).
    op.process_batch(_batch([{**row, "k2": "a", "v": 2, "_ts": 10, "f": 3.0, "b": False}]), None)
    op.process_watermark(19)
    got = _results(out.batches(), spec)
    assert got == {
        ("b", 3, 13): {"n": 1, "d": 1, "s": 7, "a": 1.0, "top": 7},
        ("a", 0, 20): {"n": 2, "d": 2, "s": 3, "a": 2.0, "top": 1},
    }
    assert [b.column("window_end").cast(pa.int64()).to_pylist() for b in out.batches()] == [
        [13, 20]  # by end
    ]
    # 25 bridges nothing ([25, 35) touches [30, 40)): one session [25, 40).
    op.process_batch(_batch([{**row, "k2": "a", "v": 1, "_ts": 25}]), None)
    op.process_watermark(MAX_WATERMARK)
    assert _results(out.batches()[1:], spec) == {
        ("a", 25, 40): {"n": 2, "d": 1, "s": 2, "a": 1.0, "top": 1}
    }
    assert op.state_table().num_rows == 0


def test_composite_and_no_keys() -> None:
    rows = [
        {"k1": 1, "k2": "x", "v": 1, "f": None, "b": None, "_ts": 0},
        {"k1": 1, "k2": "y", "v": 2, "f": None, "b": None, "_ts": 1},
        {"k1": 1, "k2": "x", "v": 3, "f": None, "b": None, "_ts": 5},
    ]
    both = SessionAggregateSpec(keys=("k1", "k2"), gap=3, aggs=(AggCall("sum", "v", "s"),))
    op, out = _op(both)
    op.process_batch(_batch(rows), None)
    op.process_watermark(MAX_WATERMARK)
    assert _results(out.batches(), both) == {
        (1, "x", 0, 3): {"s": 1},
        (1, "y", 1, 4): {"s": 2},
        (1, "x", 5, 8): {"s": 3},
    }
    none = SessionAggregateSpec(keys=(), gap=3, aggs=(AggCall("sum", "v", "s"),))
    op, out = _op(none)
    op.process_batch(_batch(rows), None)
    op.process_watermark(MAX_WATERMARK)
    assert _results(out.batches(), none) == {(0, 4): {"s": 3}, (5, 8): {"s": 3}}


def test_the_spec_and_bad_input_give_clear_errors() -> None:
    with pytest.raises(ConfigurationError, match="gap must be positive"):
        SessionAggregateSpec(keys=("k1",), gap=0, aggs=(AggCall("count_star", None, "n"),))
    with pytest.raises(ConfigurationError, match="two columns named 'k1'"):
        SessionAggregateSpec(keys=("k1",), gap=5, aggs=(AggCall("count_star", None, "k1"),))
    spec = SessionAggregateSpec(keys=("k1",), gap=5, aggs=(AggCall("sum", "v", "s"),))
    op, _ = _op(spec)
    with pytest.raises(DataError, match=r"columnar_session_aggregate \(1/1\): session windows "):
        op.process_batch(pa.record_batch({"k1": [1], "v": [2]}), None)
    with pytest.raises(ConfigurationError, match="no column 'v'"):
        op.process_batch(pa.record_batch({"k1": [1], "_ts": [2]}), None)


# ---------------------------------------------------------------------- property


@st.composite
def _scenarios(draw: Any) -> tuple[SessionAggregateSpec, list[list[dict[str, Any]]], list[int]]:
    gap = draw(st.integers(1, 15))
    keys = draw(st.sampled_from([(), ("k1",), ("k2",), ("k1", "k2")]))
    aggs = draw(st.lists(st.sampled_from(CATALOG), min_size=1, max_size=6, unique=True))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 120))
    floats = [None, float("nan"), -0.0, 0.0, 1.5, -2.25, 3.0, 1e300]
    rows = [
        {
            "k1": rng.choice([None, 1, 2, -(2**40)]),
            "k2": rng.choice([None, "a", "é"]),
            "v": rng.choice([None, rng.randint(-50, 50), rng.randint(-(2**40), 2**40)]),
            "f": rng.choice(floats),
            "b": rng.choice([None, True, False]),
            "_ts": rng.randint(-30, 200),
        }
        for _ in range(n)
    ]
    disorder = draw(st.integers(0, 40))
    rows.sort(key=lambda r: r["_ts"] + rng.randint(0, disorder))
    cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, 8)))) if n > 1 else []
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    # No row is late, and no session fires that a later row would touch: the watermark
    # stays a gap below every time still to come.
    watermarks = []
    for i in range(len(batches)):
        future = [r["_ts"] for batch in batches[i + 1 :] for r in batch]
        low = min(future) if future else 10_000
        watermarks.append(low - gap - 1 - rng.randint(0, 5))
    spec = SessionAggregateSpec(keys=keys, gap=gap, aggs=tuple(aggs))
    return spec, batches, watermarks


def _run_against_duckdb(scenario: Any, backend: str) -> None:
    spec, batches, watermarks = scenario
    scratch = tempfile.mkdtemp(prefix="sa-test-")
    try:
        op, out = _op(spec, backend=backend, local_dir=scratch)
        for batch, wm in zip(batches, watermarks, strict=True):
            op.process_batch(_batch(batch), None)
            op.process_watermark(wm)
        op.process_watermark(MAX_WATERMARK)
        rows = [r for batch in batches for r in batch]
        assert_equal(_results(out.batches(), spec), _duckdb(rows, spec))
        assert op.counters.late_records_dropped == 0
        assert op.state_table().num_rows == 0
        op.keyed.dispose()
    finally:
        shutil.rmtree(scratch)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_equals_duckdb_sessions(scenario: Any) -> None:
    _run_against_duckdb(scenario, "heap")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_equals_duckdb_sessions_on_rocksdb(scenario: Any) -> None:
    _run_against_duckdb(scenario, "rocksdb")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_late_rows_follow_the_single_aggregate_session_operator(seed: int, gap: int) -> None:
    """With watermarks that make rows late, the sessions, counts and sums equal those of
    ``ColumnarSessionOperator`` (tested against the row path's window operator)."""
    rng = random.Random(seed)
    rows = [
        {
            "k1": rng.randint(0, 3),
            "k2": "a",
            "v": rng.randint(-9, 9),
            "f": 0.0,
            "b": True,
            "_ts": rng.randint(0, 120),
        }
        for _ in range(rng.randint(1, 80))
    ]
    rows.sort(key=lambda r: r["_ts"] + rng.randint(0, 30))
    spec = SessionAggregateSpec(
        keys=("k1",), gap=gap, aggs=(AggCall("count_star", None, "count"), AggCall("sum", "v", "v"))
    )
    op, out = _op(spec)
    count_op, counts = make_operator(
        "columnar_session_window", SessionWindowSpec("count", "k1", None, gap), keys=["k1"]
    )
    sum_op, sums = make_operator(
        "columnar_session_window", SessionWindowSpec("sum", "k1", "v", gap), keys=["k1"]
    )
    seen = wm = -(2**63)
    for i in range(0, len(rows), 7):
        batch = _batch(rows[i : i + 7])
        seen = max(seen, *(r["_ts"] for r in rows[i : i + 7]))
        wm = max(wm, seen - rng.randint(0, 15))  # watermarks never go back
        for each in (op, count_op, sum_op):
            each.process_batch(batch, None)
            each.process_watermark(wm)
    for each in (op, count_op, sum_op):
        each.process_watermark(MAX_WATERMARK)
    got = _results(out.batches(), spec)
    expected: dict[Any, Any] = {}
    for emitted, name in ((counts, "count"), (sums, "v")):
        for r in emitted.rows():
            expected.setdefault((r["k1"], r["window_start"], r["window_end"]), {})[name] = r[name]
    assert got == expected
    assert op.counters.late_records_dropped == count_op.counters.late_records_dropped


# ---------------------------------------------------------------------- snapshots


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_restore_at_another_parallelism_gives_the_same_output(tmp_path: Path, backend: str) -> None:
    rng = random.Random(7)
    spec = SessionAggregateSpec(keys=("k1", "k2"), gap=8, aggs=tuple(CATALOG))
    rows = [
        {
            "k1": rng.randint(0, 9),
            "k2": rng.choice(["a", "b", None]),
            "v": rng.choice([None, rng.randint(-9, 9)]),
            "f": rng.choice([None, float("nan"), 1.5]),
            "b": rng.choice([True, False]),
            "_ts": t + rng.randint(0, 6),
        }
        for t in range(0, 400, 2)
    ]
    first, second = _batch(rows[:100]), _batch(rows[100:])
    wm = rows[99]["_ts"] - 30  # some sessions fire before the snapshot, some stay open
    emitted: list[pa.RecordBatch] = []
    handles = []
    for subtask in range(2):  # 2 subtasks up to the snapshot...
        op, out = _op(spec, subtask, 2, backend, str(tmp_path))
        for i in range(0, first.num_rows, 10):
            op.process_batch(routed(first.slice(i, 10), spec.keys, op.keyed.key_group_range), None)
        op.process_watermark(wm)
        emitted += out.batches()
        handle = op.snapshot(snapshot_target(tmp_path, 1, subtask)).keyed.run()
        if handle is not None:
            handles.append(handle)
    for subtask in range(3):  # ... then 3 from it, the key groups of each
        op, out = _op(spec, subtask, 3, backend, str(tmp_path))
        groups = op.keyed.key_group_range
        parts = [p for h in handles if (p := h.restricted_to(groups)) is not None]
        op.initialize_state(OperatorRestore(keyed=parts), 1)
        op.process_batch(routed(second, spec.keys, groups), None)
        op.process_watermark(MAX_WATERMARK)
        emitted += out.batches()
    assert_equal(_results(emitted, spec), _duckdb(rows, spec))


def test_restore_refuses_state_of_another_query(tmp_path: Path) -> None:
    spec = SessionAggregateSpec(keys=("k1",), gap=8, aggs=(AggCall("sum", "v", "s"),))
    op, _ = _op(spec)
    op.process_batch(_batch([{"k1": 1, "k2": "a", "v": 1, "f": 1.0, "b": True, "_ts": 0}]), None)
    handle = op.snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    other = SessionAggregateSpec(
        keys=("k1",), gap=8, aggs=(AggCall("count", "v", "d", distinct=True),)
    )
    new, _ = _op(other)
    with pytest.raises(StateError, match="another uid"):
        new.initialize_state(OperatorRestore(keyed=[handle]), 1)
