"""The SQL window aggregation operator (tumble, hop, cumulate over slices): examples,
a property test against DuckDB over random windows, keys, aggregates and out-of-order
batches (with and without late rows; 150 examples on the heap backend, fewer on
RocksDB), and snapshot/restore at another parallelism on both backends."""

from __future__ import annotations

import math
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
from columnar_support import MAX_P, make_operator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochstream.core.clock import ManualClock, wall_ms
from epochstream.core.events import MAX_WATERMARK
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import (
    AggCall,
    SliceWindowAggregateSpec,
    WindowAggregateSpec,
    WindowTvf,
)
from epochstream.runtime.operators import columnar_window_aggregates as window_aggregates
from epochstream.runtime.operators.columnar_window_aggregates import SliceAssigner
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.handles import OperatorRestore

KIND = "columnar_window_aggregate"
PROCTIME_KIND = "columnar_processing_window_aggregate"
SCHEMA = VALUES_SCHEMA.append(pa.field("_ts", pa.int64()))


def _spec(
    window: WindowTvf, keys: tuple[str, ...], aggs: list[AggCall], proctime: bool = False
) -> SliceWindowAggregateSpec:
    return SliceWindowAggregateSpec(keys=keys, window=window, aggs=tuple(aggs), proctime=proctime)


def _op(
    spec: SliceWindowAggregateSpec,
    subtask: int = 0,
    parallelism: int = 1,
    backend: str = "heap",
    local_dir: str = "",
    clock: ManualClock | None = None,
) -> Any:
    """The operator as subtask ``subtask`` of ``parallelism`` on a ``backend`` backend
    (RocksDB's files under ``local_dir``), of processing time on ``clock`` when the spec
    says ``proctime``."""
    return operator_on(
        PROCTIME_KIND if spec.proctime else KIND,
        spec,
        spec.keys,
        subtask=subtask,
        parallelism=parallelism,
        backend=backend,
        local_dir=local_dir,
        clock=clock,
    )


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMA)


def _results(batches: list[pa.RecordBatch], spec: SliceWindowAggregateSpec) -> dict[Any, Any]:
    """Emitted rows as ``{(keys..., start, end): {output: value}}`` (times as int ms)."""
    out: dict[Any, Any] = {}
    for batch in batches:
        assert batch.schema.field("window_start").type == pa.timestamp("ms")
        assert batch.schema.field("_ts").type == pa.int64()
        names = [*spec.keys, "window_start", "window_end", *(a.output for a in spec.aggs), "_ts"]
        assert batch.schema.names == names
        table = batch.to_pydict()
        starts = batch.column("window_start").cast(pa.int64()).to_pylist()
        ends = batch.column("window_end").cast(pa.int64()).to_pylist()
        for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
            assert table["_ts"][i] == end - 1
            key = (*(table[k][i] for k in spec.keys), start, end)
            assert key not in out, f"window {key} emitted twice"
            out[key] = {a.output: table[a.output][i] for a in spec.aggs}
    return out


def _duckdb(rows: list[dict[str, Any]], spec: SliceWindowAggregateSpec) -> dict[Any, Any]:
    """DuckDB's answer: each row in its windows (arithmetic on ``_ts``), those the
    watermark ``wm`` at the row's arrival had not fired yet, grouped and aggregated."""
    w = spec.window
    table = pa.Table.from_pylist(rows, schema=SCHEMA.append(pa.field("wm", pa.int64())))
    db = duckdb.connect()
    db.register("t", table)
    if w.kind == "cumulate":
        windows = (
            f"SELECT t.*, s AS ws, s + {w.step} * j AS we FROM "
            f"(SELECT t.*, _ts - (((_ts - {w.offset}) % {w.size}) + {w.size}) % {w.size} AS s "
            f"FROM t) t, range(1, {w.size // w.step + 1}) r(j) WHERE s + {w.step} * j > _ts"
        )
    else:
        slide = w.size if w.kind == "tumble" else w.slide
        windows = (
            f"SELECT t.*, last - {slide} * j AS ws, last - {slide} * j + {w.size} AS we FROM "
            f"(SELECT t.*, _ts - (((_ts - {w.offset}) % {slide}) + {slide}) % {slide} AS last "
            f"FROM t) t, range(0, {w.size // slide + 2}) r(j) "
            f"WHERE last - {slide} * j > _ts - {w.size}"
        )
    select = duckdb_aggregates(spec.aggs)
    group = [*spec.keys, "ws", "we"]
    query = (
        f"SELECT {', '.join(group)}, {', '.join(select)} FROM ({windows}) x "
        f"WHERE we - 1 > wm GROUP BY {', '.join(group)}"
    )
    return {
        tuple(row[: len(group)]): duckdb_values(list(row[len(group) :]), spec.aggs)
        for row in db.execute(query).fetchall()
    }


# ---------------------------------------------------------------------- examples


def test_hop_emits_each_window_as_the_merge_of_its_slices() -> None:
    spec = _spec(
        WindowTvf.hop(10, 4),
        ("k2",),
        [AggCall("count_star", None, "n"), AggCall("sum", "v", "s"), AggCall("max", "f", "mx")],
    )
    op, out = _op(spec)
    rows = [
        {"k2": "a", "v": 1, "f": 1.0, "_ts": 1},
        {"k2": "a", "v": 2, "f": float("nan"), "_ts": 3},
        {"k2": "b", "v": None, "f": None, "_ts": 5},
        {"k2": "a", "v": 2, "f": -3.0, "_ts": 9},
    ]
    op.process_batch(_batch(rows), None)
    op.process_watermark(5)  # windows ending by 6
    got = _results(out.batches(), spec)
    assert {k: v["n"] for k, v in got.items()} == {
        ("a", -8, 2): 1,
        ("a", -4, 6): 2,
        ("b", -4, 6): 1,
    }
    assert math.isnan(got[("a", -4, 6)]["mx"]) and got[("b", -4, 6)]["s"] is None
    out.take()
    op.process_watermark(MAX_WATERMARK)
    ends = [e for b in out.batches() for e in b.column("window_end").cast(pa.int64()).to_pylist()]
    assert ends == sorted(ends) and set(ends) == {10, 14, 18}
    assert op.keyed.row_tables() == []  # every slice dropped once its last window fired


def test_cumulate_windows_grow_by_step_and_share_slices() -> None:
    spec = _spec(WindowTvf.cumulate(6, 2), (), [AggCall("count_star", None, "n")])
    op, out = _op(spec)
    op.process_batch(_batch([{"_ts": t} for t in (0, 1, 2, 5, 6)]), None)
    op.process_watermark(MAX_WATERMARK)
    got = {(s, e): v["n"] for (s, e), v in _results(out.batches(), spec).items()}
    assert got == {(0, 2): 2, (0, 4): 3, (0, 6): 4, (6, 8): 1, (6, 10): 1, (6, 12): 1}


def test_late_rows_are_dropped_and_counted_partly_late_rows_join_open_windows() -> None:
    spec = _spec(WindowTvf.hop(10, 5), ("k1",), [AggCall("count_star", None, "n")])
    op, out = _op(spec)
    op.process_batch(_batch([{"k1": 1, "_ts": 12}]), None)
    op.process_watermark(10)  # fired: windows ending by 11 ([0, 10))
    op.process_batch(_batch([{"k1": 1, "_ts": 3}, {"k1": 1, "_ts": 7}]), None)
    assert op.counters.late_records_dropped == 1  # 3 is in [-5, 5) and [0, 10) only
    op.process_watermark(MAX_WATERMARK)
    got = {(s, e): v["n"] for (_, s, e), v in _results(out.batches(), spec).items()}
    assert got == {(5, 15): 2, (10, 20): 1}  # 7 joins [5, 15), [0, 10) fired without it


def test_types_and_nulls_follow_flink_sql() -> None:
    spec = _spec(
        WindowTvf.tumble(10),
        ("k1",),
        [
            AggCall("count", "v", "c"),
            AggCall("sum", "v", "s"),
            AggCall("avg", "v", "a"),
            AggCall("min", "v", "mn"),
            AggCall("min", "f", "mnf"),
        ],
    )
    op, out = _op(spec)
    rows = [
        {"k1": 1, "v": -7, "f": float("nan"), "_ts": 0},
        {"k1": 1, "v": 2, "_ts": 1},
        {"k1": 2, "v": None, "f": float("nan"), "_ts": 2},
    ]
    op.process_batch(
        pa.RecordBatch.from_pylist(rows, schema=SCHEMA.set(2, pa.field("v", pa.int16()))), None
    )
    op.process_watermark(MAX_WATERMARK)
    batch = out.batches()[0]
    assert batch.schema.field("c").type == pa.int64()
    assert batch.schema.field("s").type == pa.int64()
    assert batch.schema.field("a").type == pa.int64()
    assert batch.schema.field("mn").type == pa.int16()
    got = _results([batch], spec)
    assert got[(1, 0, 10)] == {
        "c": 2,
        "s": -5,
        "a": -2,
        "mn": -7,
        "mnf": pytest.approx(float("nan"), nan_ok=True),
    }
    assert got[(2, 0, 10)]["c"] == 0 and got[(2, 0, 10)]["s"] is None
    assert math.isnan(got[(2, 0, 10)]["mnf"])  # every non-null value NaN: NaN


def test_the_spec_refuses_bad_windows_and_aggregates() -> None:
    with pytest.raises(ConfigurationError, match="multiple of its step"):
        WindowTvf.cumulate(10, 3)
    with pytest.raises(ConfigurationError, match=r"SUM\(DISTINCT"):
        AggCall("sum", "v", "s", distinct=True)
    with pytest.raises(ConfigurationError, match="two columns named 'k'"):
        _spec(WindowTvf.tumble(5), ("k",), [AggCall("count_star", None, "k")])
    with pytest.raises(ConfigurationError, match="positive"):
        WindowTvf.hop(10, 0)
    assert WindowTvf.hop(10, 4).slice_width == 2  # no size % slide needed


def test_bad_input_is_a_data_error_naming_the_operator() -> None:
    spec = _spec(WindowTvf.tumble(5), ("k1",), [AggCall("count_star", None, "n", filter="v")])
    op, _ = _op(spec)
    with pytest.raises(DataError, match=r"filter column 'v'.*not boolean"):
        op.process_batch(_batch([{"k1": 1, "v": 1, "_ts": 1}]), None)


def test_slice_assigner_windows_of_a_hop_with_size_not_a_multiple_of_slide() -> None:
    hop = SliceAssigner(WindowTvf.hop(10, 4, offset=1))
    import numpy as np

    assert hop.slice_ends(np.array([1, 2, 3])).tolist() == [3, 3, 5]
    starts, ends = hop.windows_ending(np.array([3]), -100, 100)
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [(-7, 3), (-3, 7), (1, 11)]


# ---------------------------------------------------------------------- property test


@st.composite
def _scenarios(
    draw: Any, late: bool
) -> tuple[SliceWindowAggregateSpec, list[list[dict[str, Any]]], list[int]]:
    kind = draw(st.sampled_from(["tumble", "hop", "cumulate"]))
    size = draw(st.integers(1, 12))
    if kind == "tumble":
        window = WindowTvf.tumble(size, offset=draw(st.integers(-size + 1, size - 1)))
    elif kind == "hop":
        window = WindowTvf.hop(size, draw(st.integers(1, size)), offset=draw(st.integers(-5, 5)))
    else:
        step = draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
        window = WindowTvf.cumulate(size, step, offset=draw(st.integers(0, size - 1)))
    keys = draw(st.sampled_from([(), ("k1",), ("k2",), ("k1", "k2")]))
    aggs = draw(st.lists(st.sampled_from(CATALOG), min_size=1, max_size=6, unique=True))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    n = draw(st.integers(1, 120))
    floats = [None, float("nan"), -0.0, 0.0, 1.5, -2.25, 3.0, 1e300]
    rows = [
        {
            "k1": rng.choice([None, 1, 2, 3, -(2**40)]),
            "k2": rng.choice([None, "a", "b", "é"]),
            "v": rng.choice([None, rng.randint(-50, 50), rng.randint(-(2**40), 2**40)]),
            "f": rng.choice(floats),
            "b": rng.choice([None, True, False]),
            "_ts": rng.randint(-30, 60),
        }
        for _ in range(n)
    ]
    disorder = draw(st.integers(0, 20))
    rows.sort(key=lambda r: r["_ts"] + rng.randint(0, disorder))
    cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, 6)))) if n > 1 else []
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    watermarks = []
    for i in range(len(batches)):
        future = [r["_ts"] for batch in batches[i + 1 :] for r in batch]
        seen = max(r["_ts"] for batch in batches[: i + 1] for r in batch)
        if late:
            wm = seen - rng.randint(0, 10)
        else:
            wm = (min(future) if future else 1000) - 1 - rng.randint(0, 5)
        watermarks.append(wm)
    return _spec(window, keys, aggs), batches, watermarks


def _run_against_duckdb(scenario: Any, backend: str = "heap") -> None:
    scratch = tempfile.mkdtemp(prefix="wa-test-")
    try:
        _run_on(scenario, backend, scratch)
    finally:
        shutil.rmtree(scratch)


def _run_on(scenario: Any, backend: str, scratch: str) -> None:
    spec, batches, watermarks = scenario
    op, out = _op(spec, backend=backend, local_dir=scratch)
    arrived = []
    current = -(2**63)
    for batch, wm in zip(batches, watermarks, strict=True):
        arrived += [{**r, "wm": current} for r in batch]
        op.process_batch(_batch(batch), None)
        op.process_watermark(wm)
        current = max(current, wm)
    op.process_watermark(MAX_WATERMARK)
    expected = _duckdb(arrived, spec)
    assert_equal(_results(out.batches(), spec), expected)
    assert op.keyed.row_tables() == []
    late = [
        r
        for r in arrived
        if SliceAssigner(spec.window).last_window_end(
            SliceAssigner(spec.window).slice_ends(r["_ts"])
        )
        - 1
        <= r["wm"]
    ]
    assert op.counters.late_records_dropped == len(late)
    op.keyed.dispose()


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(_scenarios(late=False))
def test_equals_duckdb_without_late_rows(scenario: Any) -> None:
    _run_against_duckdb(scenario)


@_SETTINGS
@given(_scenarios(late=True))
def test_equals_duckdb_with_late_rows_dropped(scenario: Any) -> None:
    _run_against_duckdb(scenario)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios(late=True))
def test_equals_duckdb_with_late_rows_dropped_on_rocksdb(scenario: Any) -> None:
    _run_against_duckdb(scenario, "rocksdb")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("seed", range(3))
def test_many_batches_into_one_slice_are_compacted_and_still_equal_duckdb(
    seed: int, backend: str
) -> None:
    rng = random.Random(seed)
    spec = _spec(WindowTvf.hop(40, 20), ("k1", "k2"), CATALOG)
    rows = [
        {
            "k1": rng.randint(0, 3),
            "k2": rng.choice(["a", None]),
            "v": rng.choice([None, rng.randint(-9, 9)]),
            "f": rng.choice([None, float("nan"), 1.5, -2.0]),
            "b": rng.choice([True, False, None]),
            "_ts": t // 6,
        }
        for t in range(300)
    ]
    batches = [rows[i : i + 5] for i in range(0, len(rows), 5)]  # 60 batches: > 16 per slice
    watermarks = [batch[-1]["_ts"] - 1 for batch in batches]
    _run_against_duckdb((spec, batches, watermarks), backend)


# ---------------------------------------------------------------------- snapshots


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("window", [WindowTvf.hop(10, 4), WindowTvf.cumulate(12, 3)])
def test_restore_at_another_parallelism_gives_the_same_output(
    tmp_path: Path, window: WindowTvf, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(window_aggregates, "_COMPACT_AT", 3)  # compacted slices snapshotted
    spec = _spec(
        window,
        ("k1", "k2"),
        [c for c in CATALOG if c.output in ("n", "cd_v_b", "s_f", "mn_f", "a_v")],
    )
    rng = random.Random(5)
    rows = [
        {
            "k1": rng.randint(0, 30),
            "k2": rng.choice(["x", "y", None]),
            "v": rng.randint(-9, 9),
            "f": rng.choice([1.0, float("nan"), None, 2.5]),
            "b": rng.choice([True, False]),
            "_ts": t // 4,
        }
        for t in range(400)
    ]
    first, second = _batch(rows[:200]), _batch(rows[200:])
    whole, whole_out = _op(spec, backend=backend, local_dir=str(tmp_path))
    for batch, wm in ((first, 20), (second, MAX_WATERMARK)):
        whole.process_batch(batch, None)
        whole.process_watermark(wm)
    expected = _results(whole_out.batches(), spec)

    emitted: list[pa.RecordBatch] = []
    handles = []
    for subtask in range(2):  # 2 subtasks up to the snapshot...
        op, out = _op(spec, subtask, 2, backend, str(tmp_path))
        for i in range(0, first.num_rows, 10):
            op.process_batch(routed(first.slice(i, 10), spec.keys, op.key_groups), None)
        op.process_watermark(20)
        emitted += out.batches()
        handle = op.snapshot(snapshot_target(tmp_path, 1, subtask)).keyed.run()
        if handle is not None:
            handles.append(handle)
    for subtask in range(3):  # ... then 3 from it, the key groups of each
        op, out = _op(spec, subtask, 3, backend, str(tmp_path))
        parts = [p for h in handles if (p := h.restricted_to(op.key_groups)) is not None]
        op.initialize_state(OperatorRestore(keyed=parts), 1)
        op.process_watermark(19)  # a watermark below the snapshot's emits nothing again
        op.process_batch(routed(second, spec.keys, op.key_groups), None)
        op.process_watermark(MAX_WATERMARK)
        emitted += out.batches()
    assert_equal(_results(emitted, spec), expected)


def test_restore_refuses_state_of_another_operator(tmp_path: Path) -> None:
    other, _ = make_operator(
        "columnar_window", WindowAggregateSpec("count", "k", None, 5, 5), keys=["k"]
    )
    other.process_batch(pa.record_batch({"k": ["a"], "_ts": [1]}), None)
    handle = other.snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    op, _ = _op(_spec(WindowTvf.tumble(5), ("k",), [AggCall("count_star", None, "n")]))
    with pytest.raises(StateError, match="another uid"):
        op.initialize_state(OperatorRestore(keyed=[handle]), 1)


def test_min_max_of_strings_and_timestamps_keep_their_types() -> None:
    spec = _spec(
        WindowTvf.tumble(10),
        (),
        [
            AggCall("min", "name", "first"),
            AggCall("max", "name", "last"),
            AggCall("max", "at", "latest"),
            AggCall("count", "name", "names", distinct=True),
        ],
    )
    op, out = _op(spec)
    at = pa.array([5_000, None, 1_000], pa.timestamp("ms"))
    batch = pa.record_batch(
        {"name": ["bob", "ann", None], "at": at, "_ts": pa.array([1, 2, 3], pa.int64())}
    )
    op.process_batch(batch, None)
    op.process_watermark(MAX_WATERMARK)
    result = out.batches()[0]
    assert result.schema.field("first").type == pa.string()
    assert result.schema.field("latest").type == pa.timestamp("ms")
    row = result.to_pylist()[0]
    assert (row["first"], row["last"], row["names"]) == ("ann", "bob", 2)
    assert row["latest"] == at[0].as_py()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_savepoint_reader_reads_slices_by_key_group(tmp_path: Path, backend: str) -> None:
    from epochstream.checkpoint.reader import state_rows

    spec = _spec(WindowTvf.tumble(10), ("k1", "k2"), [AggCall("sum", "v", "s")])
    op, _ = _op(spec, backend=backend, local_dir=str(tmp_path))
    op.process_batch(_batch([{"k1": 1, "k2": "a", "v": 5, "_ts": 3}]), None)
    op.process_watermark(2)
    handle = op.snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    assert sorted(op.keyed.row_tables()) == ["fired", "slice@0"]
    rows = [
        (k, v["k1"], v["k2"], v["_wa0_s"], g)
        for k, v, g, *_ in state_rows(handle, "slice@0", MAX_P)
    ]
    (kg,) = key_groups_by_columns([pa.array([1]), pa.array(["a"])], MAX_P, rows=1).tolist()
    assert rows == [(kg, 1, "a", 5, kg)]  # filed under the group key's key group
    stamps = {v["_wa_group"]: v["_wa_fired"] for _, v, *_ in state_rows(handle, "fired", MAX_P)}
    assert stamps == dict.fromkeys(range(MAX_P), 2)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_restore_skips_windows_fired_before_the_snapshot_and_drops_their_late_rows(
    tmp_path: Path, backend: str
) -> None:
    spec = _spec(WindowTvf.hop(10, 5), ("k1",), [AggCall("count_star", None, "n")])
    op, out = _op(spec, backend=backend, local_dir=str(tmp_path))
    op.process_batch(_batch([{"k1": 1, "_ts": 7}]), None)
    op.process_watermark(10)  # emits [0, 10); [5, 15) still open
    assert [r["n"] for r in out.take()] == [1]
    restore = OperatorRestore(keyed=[op.snapshot(snapshot_target(tmp_path, 1)).keyed.run()])
    op, out = _op(spec, backend=backend, local_dir=str(tmp_path))
    op.initialize_state(restore, 1)
    # No watermark yet: [0, 10) fired to the snapshot already, so 2 (in [-5, 5) and
    # [0, 10) only) is late, and 8 counts in [5, 15) alone.
    op.process_batch(_batch([{"k1": 1, "_ts": 2}, {"k1": 1, "_ts": 8}]), None)
    assert op.counters.late_records_dropped == 1
    op.process_watermark(MAX_WATERMARK)
    got = {(s, e): v["n"] for (_, s, e), v in _results(out.batches(), spec).items()}
    assert got == {(5, 15): 2}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_wider_integer_key_widens_the_slice_tables(tmp_path: Path, backend: str) -> None:
    spec = _spec(WindowTvf.tumble(10), ("k",), [AggCall("max", "v", "top")])
    op, out = _op(spec, backend=backend, local_dir=str(tmp_path))
    narrow = pa.record_batch(
        {"k": pa.array([1], pa.int32()), "v": pa.array([5], pa.int16()), "_ts": [1]}
    )
    wide = pa.record_batch(
        {"k": pa.array([2**40, 1], pa.int64()), "v": pa.array([2**35, 7]), "_ts": [2, 3]}
    )
    op.process_batch(narrow, None)
    op.process_batch(wide, None)  # the slice's table was made for int32 keys, int16 values
    op.process_watermark(MAX_WATERMARK)
    got = sorted((r["k"], r["top"]) for r in out.rows())
    assert got == [(1, 7), (2**40, 2**35)]


# ---------------------------------------------------------------------- processing time

# COUNT DISTINCT (with and without FILTER), filtered SUM and COUNT(*), MAX of floats.
PROCTIME_AGGS = [
    c for c in CATALOG if c.output in ("n", "n_b", "cd_v", "cd_v_b", "s_v_b", "mx_f", "a_v")
]


def _at_clock(rows: list[dict[str, Any]], spec: SliceWindowAggregateSpec) -> dict[Any, Any]:
    """The expected windows of ``rows`` each stamped with its batch's clock time as
    ``_ts`` (the windows of that time, computed by DuckDB with no watermark)."""
    return _duckdb([{**r, "wm": -(2**63)} for r in rows], spec)


def _rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [
        {
            "k1": rng.randint(0, 4),
            "k2": rng.choice(["x", "y", None]),
            "v": rng.choice([None, *range(-3, 4)]),
            "f": rng.choice([1.0, float("nan"), None, 2.5, -4.0]),
            "b": rng.choice([True, False, None]),
            "_ts": rng.randint(-(10**9), 10**9),  # event time: not read
        }
        for _ in range(n)
    ]


def test_processing_time_windows_fire_when_the_clock_passes_their_end() -> None:
    clock = ManualClock(start=10.2)  # 10_200 ms
    spec = _spec(WindowTvf.tumble(1_000), ("k2",), PROCTIME_AGGS, proctime=True)
    op, out = _op(spec, clock=clock)
    assert op.next_processing_time() is None
    first = [{"k2": "a", "v": 1, "b": True}, {"k2": "a", "v": 1, "b": False}]
    op.process_batch(_batch(first).drop_columns(["_ts"]), None)  # no event time needed
    clock.advance(0.5)
    op.process_batch(_batch([{"k2": "a", "v": 2, "f": 3.0, "b": True, "_ts": 99}]), None)
    assert op.next_processing_time() == 10_999
    op.process_watermark(10**12)  # watermarks pass through, they fire nothing
    op.on_processing_time(10_998)
    assert out.take() == [] and out.watermarks == [10**12]
    op.on_processing_time(10_999)
    (row,) = out.take()
    assert (row["k2"], row["n"], row["n_b"], row["cd_v"], row["cd_v_b"]) == ("a", 3, 2, 2, 2)
    assert (row["s_v_b"], row["mx_f"], row["a_v"], row["_ts"]) == (3, 3.0, 1, 10_999)
    assert row["window_end"] == pa.scalar(11_000, pa.timestamp("ms")).as_py()
    assert op.next_processing_time() is None and op.keyed.row_tables() == []


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("window", [WindowTvf.tumble(1_000), WindowTvf.hop(1_000, 400)])
def test_processing_time_windows_equal_the_windows_of_each_batchs_arrival(
    tmp_path: Path, backend: str, window: WindowTvf
) -> None:
    """The task's protocol: after each batch, every due timer fires; the rest at the end
    of the input. Each batch's rows count in the windows of the clock's time then."""
    rng = random.Random(7)
    clock = ManualClock(start=5.0)
    spec = _spec(window, ("k1", "k2"), PROCTIME_AGGS, proctime=True)
    op, out = _op(spec, backend=backend, local_dir=str(tmp_path), clock=clock)
    stamped: list[dict[str, Any]] = []
    ends: list[int] = []
    for _ in range(40):
        clock.advance(rng.choice([0.0, 0.05, 0.3, 0.9]))
        now = wall_ms(clock)
        while (due := op.next_processing_time()) is not None and due <= now:
            op.on_processing_time(now)
        rows = _rows(rng, rng.randint(1, 30))
        op.process_batch(_batch(rows), None)
        stamped += [{**r, "_ts": now} for r in rows]
    op.process_watermark(MAX_WATERMARK)  # the end of the input fires every open window
    for batch in out.batches():
        ends += batch.column("window_end").cast(pa.int64()).to_pylist()
    assert ends == sorted(ends)  # by window end, across firings
    assert_equal(_results(out.batches(), spec), _at_clock(stamped, spec))
    assert op.next_processing_time() is None and op.keyed.row_tables() == []


def test_end_of_input_fires_every_open_window_and_later_watermarks_nothing() -> None:
    clock = ManualClock(start=1.7)
    spec = _spec(WindowTvf.hop(1_000, 500), ("k1",), [AggCall("sum", "v", "s")], proctime=True)
    op, out = _op(spec, clock=clock)
    op.process_batch(_batch([{"k1": 1, "v": 7}]), None)
    op.process_watermark(1_000_000)
    assert out.take() == []
    op.process_watermark(MAX_WATERMARK)
    got = {(s, e): v["s"] for (_, s, e), v in _results(out.batches(), spec).items()}
    assert got == {(1_000, 2_000): 7, (1_500, 2_500): 7}
    assert out.watermarks == [1_000_000, MAX_WATERMARK] and op.next_processing_time() is None


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_processing_time_restore_fires_open_windows_at_once_and_none_twice(
    tmp_path: Path, backend: str
) -> None:
    clock = ManualClock(start=10.2)
    spec = _spec(
        WindowTvf.hop(1_000, 500),
        ("k1",),
        [AggCall("count_star", None, "n"), AggCall("count", "v", "cd", distinct=True)],
        proctime=True,
    )
    op, out = _op(spec, backend=backend, local_dir=str(tmp_path), clock=clock)
    keys = list(range(20))
    op.process_batch(_batch([{"k1": k, "v": k % 3} for k in keys]), None)
    op.on_processing_time(10_499)  # emits [9 500, 10 500); [10 000, 11 000) stays open
    assert {r["k1"] for r in out.take()} == set(keys)
    handle = op.snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    clock.advance(5.0)  # the restart takes 5 s: the open window ended meanwhile
    now = wall_ms(clock)
    emitted: list[pa.RecordBatch] = []
    for subtask in range(2):
        restored, out = _op(spec, subtask, 2, backend, str(tmp_path), clock)
        part = handle.restricted_to(restored.key_groups)
        restored.initialize_state(OperatorRestore(keyed=[part] if part else []), 1)
        assert restored.next_processing_time() == 10_499  # timed again: due at once
        restored.on_processing_time(now)
        assert restored.next_processing_time() is None
        mine = [
            k for k in keys if routed(_batch([{"k1": k}]), spec.keys, restored.key_groups).num_rows
        ]
        restored.process_batch(_batch([{"k1": k, "v": 5} for k in mine]), None)
        restored.process_watermark(MAX_WATERMARK)
        emitted += out.batches()
    got = {key: v["n"] for key, v in _results(emitted, spec).items()}  # none emitted twice
    expected = {(k, 10_000, 11_000): 1 for k in keys}
    expected |= {(k, 14_500, 15_500): 1 for k in keys} | {(k, 15_000, 16_000): 1 for k in keys}
    assert got == expected


def test_the_operator_kind_must_match_the_specs_time() -> None:
    spec = _spec(WindowTvf.tumble(10), ("k1",), [AggCall("count_star", None, "n")])
    with pytest.raises(ConfigurationError, match="event-time ones"):
        make_operator(PROCTIME_KIND, spec, keys=["k1"])
    with pytest.raises(ConfigurationError, match="processing-time ones"):
        make_operator(KIND, _spec(spec.window, spec.keys, list(spec.aggs), True), keys=["k1"])
