"""The window Top-N operator: examples (NULL placement, ties, rank column, late rows), a
property test against DuckDB's ``ROW_NUMBER()`` over random windows, partitions, order
keys with NULLs, NaNs and ties and random batches on both backends, and
snapshot/restore at another parallelism on both backends, with pruned state."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import duckdb
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
from epochstream.graph.specs import SessionWindowSpec, WindowTopNSpec
from epochstream.graph.transformations import ColumnKey, ColumnKeys
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.runtime.operators import columnar_window_topn as topn
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_range_for_operator
from epochstream.state.operator import OperatorStateStore

KIND = "columnar_window_top_n"
TS_MS = pa.timestamp("ms")
SCHEMA = pa.schema(
    [
        ("p1", pa.int64()),
        ("p2", pa.string()),
        ("o1", pa.int64()),
        ("o2", pa.float64()),
        ("seq", pa.int64()),
        ("window_start", TS_MS),
        ("window_end", TS_MS),
        ("_ts", pa.int64()),
    ]
)
BACKENDS = {
    "heap": HeapStateBackend,
    "rocksdb": lambda: RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1),
}


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Rows with ``window_end`` (int ms) as the operator's input: ``window_start`` 10 ms
    before, ``_ts`` inside."""
    full = [{**r, "window_start": r["window_end"] - 10, "_ts": r["window_end"] - 5} for r in rows]
    table = pa.Table.from_pylist(
        full,
        schema=SCHEMA.set(5, pa.field("window_start", pa.int64())).set(
            6, pa.field("window_end", pa.int64())
        ),
    )
    return table.cast(SCHEMA).combine_chunks().to_batches()[0]


def _op(spec: WindowTopNSpec, subtask: int = 0, parallelism: int = 1) -> tuple[Any, Emitted]:
    return make_operator(
        KIND, spec, keys=list(spec.partition_by) or None, subtask=subtask, parallelism=parallelism
    )


def _key(value: Any) -> Any:
    """A value as compared: NaN equal to itself."""
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def _ranked(rows: list[dict[str, Any]], spec: WindowTopNSpec) -> dict[Any, list[tuple[Any, ...]]]:
    """``{(window_end, partition...): [(rank, seq, order keys...)...]}`` by rank."""
    out: dict[Any, list[tuple[Any, ...]]] = {}
    for r in rows:
        end = r["window_end"]
        end = int(end.timestamp() * 1000) if hasattr(end, "timestamp") else end
        part = (end, *(r[c] for c in spec.partition_by))
        keys = tuple(_key(r[c]) for c, _ in spec.order_by)
        out.setdefault(part, []).append((r["rownum"], r["seq"], *keys))
    return {k: sorted(v) for k, v in out.items()}


def _duckdb(rows: list[dict[str, Any]], spec: WindowTopNSpec) -> dict[Any, list[tuple[Any, ...]]]:
    """DuckDB's ROW_NUMBER Top-N of ``rows``, ties by arrival (``seq``): Flink's NULL
    placement spelled out (DuckDB's default is NULLS LAST)."""
    table = pa.Table.from_pylist(
        [{k: r[k] for k in ("p1", "p2", "o1", "o2", "seq", "window_end")} for r in rows],
        schema=pa.schema(
            [
                ("p1", pa.int64()),
                ("p2", pa.string()),
                ("o1", pa.int64()),
                ("o2", pa.float64()),
                ("seq", pa.int64()),
                ("window_end", pa.int64()),
            ]
        ),
    )
    db = duckdb.connect()
    db.register("t", table)
    order = ", ".join(
        f"{c} {d.upper()} NULLS {'FIRST' if d == 'asc' else 'LAST'}" for c, d in spec.order_by
    )
    parts = ", ".join(["window_end", *spec.partition_by])
    query = f"""
        SELECT * FROM (
            SELECT *, ROW_NUMBER() OVER (PARTITION BY {parts} ORDER BY {order}, seq) AS rownum
            FROM t) WHERE rownum <= {spec.n}
    """
    cursor = db.execute(query)
    names = [d[0] for d in cursor.description]
    result = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return _ranked(result, spec)


def _emitted(out: Emitted) -> list[dict[str, Any]]:
    return out.rows()


# ------------------------------------------------------------------ examples


def test_nulls_first_ascending_last_descending_and_ties_by_arrival() -> None:
    spec = WindowTopNSpec(("p1",), (("o1", "desc"), ("o2", "asc")), 3, rank_column="rownum")
    op, out = _op(spec)
    rows = [
        {"p1": 1, "p2": None, "o1": None, "o2": 1.0, "seq": 0, "window_end": 10},
        {"p1": 1, "p2": None, "o1": 5, "o2": None, "seq": 1, "window_end": 10},
        {"p1": 1, "p2": None, "o1": 5, "o2": 2.0, "seq": 2, "window_end": 10},
        {"p1": 1, "p2": None, "o1": 5, "o2": 2.0, "seq": 3, "window_end": 10},
        {"p1": 1, "p2": None, "o1": 7, "o2": float("nan"), "seq": 4, "window_end": 10},
    ]
    op.process_batch(_batch(rows[:3]), None)
    op.process_batch(_batch(rows[3:]), None)
    op.process_watermark(9)
    got = [(r["seq"], r["rownum"], r["_ts"]) for r in out.take()]
    # o1 DESC: 7 first, NULL last; o2 ASC among the 5s: NULL first, then the tied 2.0s
    # by arrival (seq 2 before seq 3, which is cut).
    assert got == [(4, 1, 9), (1, 2, 9), (2, 3, 9)]
    assert out.batches() == []


def test_output_columns_and_one_partition_per_window_without_keys() -> None:
    spec = WindowTopNSpec((), (("o1", "asc"),), 1)
    op, out = _op(spec)
    rows = [
        {"p1": i, "p2": "x", "o1": 10 - i, "o2": 0.0, "seq": i, "window_end": 10 + 10 * (i % 2)}
        for i in range(6)
    ]
    op.process_batch(_batch(rows), None)
    op.process_watermark(MAX_WATERMARK)
    batch = out.batches()[0]
    assert batch.schema.names == [
        "p1",
        "p2",
        "o1",
        "o2",
        "seq",
        "window_start",
        "window_end",
        "_ts",
    ]
    assert batch.schema.field("window_end").type == TS_MS
    assert [(r["p1"], r["_ts"]) for r in batch.to_pylist()] == [(4, 9), (5, 19)]


def test_rows_of_a_fired_window_are_late_and_counted() -> None:
    spec = WindowTopNSpec(("p1",), (("o1", "desc"),), 2, rank_column="rownum")
    op, out = _op(spec)
    row = {"p1": 1, "p2": "x", "o1": 1, "o2": 0.0, "seq": 0}
    op.process_batch(_batch([{**row, "window_end": 10}, {**row, "window_end": 20}]), None)
    op.process_watermark(9)
    assert [r["window_end"].microsecond for r in out.take()] == [10_000]
    op.process_batch(_batch([{**row, "o1": 9, "window_end": 10}, {**row, "window_end": 20}]), None)
    assert op.counters.late_records_dropped == 1
    op.process_watermark(MAX_WATERMARK)
    assert [r["rownum"] for r in out.take()] == [1, 2]


def test_state_is_pruned_to_the_best_n_per_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topn, "_PRUNE_FLOOR", 4)
    spec = WindowTopNSpec(("p1",), (("o1", "desc"),), 2)
    op, out = _op(spec)
    for i in range(50):
        rows = [
            {"p1": p, "p2": "x", "o1": i, "o2": 0.0, "seq": i, "window_end": 10} for p in range(3)
        ]
        op.process_batch(_batch(rows), None)
        assert op.state_table().num_rows <= max(2 * 2 * 3, 4) + 3
    op.process_watermark(MAX_WATERMARK)
    assert sorted((r["p1"], r["o1"]) for r in out.take()) == [
        (p, o) for p in range(3) for o in (48, 49)
    ]


def test_bad_input_and_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="n >= 1"):
        WindowTopNSpec(("p1",), (("o1", "desc"),), 0)
    with pytest.raises(ConfigurationError, match="direction"):
        WindowTopNSpec(("p1",), (("o1", "down"),), 1)
    with pytest.raises(ConfigurationError, match="order key"):
        WindowTopNSpec(("p1",), (), 1)
    with pytest.raises(ConfigurationError, match="rank column"):
        WindowTopNSpec(("p1",), (("o1", "desc"),), 1, rank_column="_ts")
    op, _ = _op(WindowTopNSpec(("p1",), (("o1", "desc"),), 1, rank_column="o2"))
    row = {"p1": 1, "p2": "x", "o1": 1, "o2": 0.0, "seq": 0, "window_end": 10}
    with pytest.raises(DataError, match="rank column"):
        op.process_batch(_batch([row]), None)
    op, _ = _op(WindowTopNSpec(("p1",), (("missing", "desc"),), 1))
    with pytest.raises(ConfigurationError, match="missing"):
        op.process_batch(_batch([row]), None)


def test_restore_refuses_state_of_another_operator(tmp_path: Path) -> None:
    other, _ = make_operator(
        "columnar_session_window", SessionWindowSpec("count", "k", None, 5), keys=["k"]
    )
    other.process_batch(pa.record_batch({"k": ["a"], "_ts": [1]}), None)
    handle = other.snapshot(_target(tmp_path, 1, 0)).keyed.run()
    op, _ = _op(WindowTopNSpec(("p1",), (("o1", "desc"),), 1))
    with pytest.raises(StateError, match="another uid"):
        op.initialize_state(OperatorRestore(keyed=[handle]), 1)


# ------------------------------------------------------------------ DuckDB


def _random_rows(rng: random.Random, count: int) -> list[dict[str, Any]]:
    return [
        {
            "p1": rng.choice([0, 1, 2, None]),
            "p2": rng.choice(["a", "b", None]),
            "o1": rng.choice([None, 1, 2, 3, 3, 4]),
            "o2": rng.choice([None, float("nan"), 0.0, 1.5, 2.5]),
            "seq": i,
            "window_end": rng.choice([10, 20, 30]),
        }
        for i in range(count)
    ]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10_000),
    count=st.integers(1, 120),
    partition_by=st.sampled_from([(), ("p1",), ("p2",), ("p1", "p2")]),
    order_by=st.lists(
        st.tuples(st.sampled_from(["o1", "o2"]), st.sampled_from(["asc", "desc"])),
        min_size=1,
        max_size=2,
        unique_by=lambda k: k[0],
    ),
    n=st.integers(1, 4),
    batch_size=st.integers(1, 40),
    prune_floor=st.sampled_from([1, 3, 1_024]),
    backend=st.sampled_from(sorted(BACKENDS)),
)
def test_top_n_equals_duckdb_row_number(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    seed: int,
    count: int,
    partition_by: tuple[str, ...],
    order_by: list[tuple[str, str]],
    n: int,
    batch_size: int,
    prune_floor: int,
    backend: str,
) -> None:
    monkeypatch.setattr(topn, "_PRUNE_FLOOR", prune_floor)
    rows = _random_rows(random.Random(seed), count)
    spec = WindowTopNSpec(partition_by, tuple(order_by), n, rank_column="rownum")
    op, out = _backend_op(backend, tmp_path, spec, 0, 1)
    for i in range(0, count, batch_size):
        op.process_batch(_batch(rows[i : i + batch_size]), None)
    op.process_watermark(MAX_WATERMARK)
    op.keyed.dispose()
    assert _ranked(_emitted(out), spec) == _duckdb(rows, spec)


# ------------------------------------------------------------------ restore


def _target(root: Path, n: int, subtask: int) -> SnapshotTarget:
    return SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=n,
        directory=str(root / f"chk-{n}"),
        shared_dir=str(root / "shared"),
        name=f"topn-{n}-{subtask}",
    )


def _backend_op(
    backend: str, root: Path, spec: WindowTopNSpec, subtask: int, parallelism: int
) -> tuple[Any, Emitted]:
    """The operator as subtask ``subtask`` of ``parallelism`` on a ``backend`` backend."""
    clock = ManualClock(start=1_000.0)
    keyed = BACKENDS[backend]().create(
        KeyedBackendContext(
            operator_uid="topn",
            subtask=subtask,
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, parallelism, subtask),
            clock=clock,
            local_dir=str(root / f"local-{parallelism}-{subtask}-{random.random()}"),
        )
    )
    columns = spec.partition_by
    op = create_operator(
        OperatorSpec(
            uid="topn",
            name=KIND,
            kind=KIND,
            payload=spec,
            key_selector=ColumnKey(columns[0]) if len(columns) == 1 else ColumnKeys(columns),
        ),
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


def _mine(batch: pa.RecordBatch, spec: WindowTopNSpec, groups: range) -> pa.RecordBatch:
    """The rows of ``batch`` a hash edge sends to the subtask of key groups ``groups``."""
    columns = [batch.column(c) for c in spec.partition_by]
    kgs = key_groups_by_columns(columns, MAX_P, rows=batch.num_rows)
    return batch.filter(pa.array([int(g) in groups for g in kgs]))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_restore_at_another_parallelism_equals_the_uninterrupted_run(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topn, "_PRUNE_FLOOR", 2)  # pruned tables in the snapshot
    spec = WindowTopNSpec(("p1", "p2"), (("o1", "desc"), ("o2", "asc")), 2, rank_column="rownum")
    rows = _random_rows(random.Random(11), 400)
    first, second = _batch(rows[:200]), _batch(rows[200:])
    whole, whole_out = _op(spec)
    for batch, watermark in ((first, 9), (second, MAX_WATERMARK)):
        for i in range(0, batch.num_rows, 25):
            whole.process_batch(batch.slice(i, 25), None)
        whole.process_watermark(watermark)  # window 10 fires between the halves
    expected = _ranked(whole_out.rows(), spec)
    on_time = rows[:200] + [r for r in rows[200:] if r["window_end"] > 10]
    assert whole.counters.late_records_dropped == len(rows) - len(on_time)
    assert expected == _duckdb(on_time, spec)

    emitted: list[dict[str, Any]] = []
    handles = []
    for subtask in range(2):  # 2 subtasks up to the snapshot...
        op, out = _backend_op(backend, tmp_path, spec, subtask, 2)
        op.initialize_state(None, None)
        for i in range(0, first.num_rows, 25):
            op.process_batch(_mine(first.slice(i, 25), spec, op.key_groups), None)
        op.process_watermark(9)  # window 10 fires before the snapshot
        emitted += out.rows()
        handle = op.snapshot(_target(tmp_path, 1, subtask)).keyed.run()
        if handle is not None:
            handles.append(handle)
    late = 0
    for subtask in range(3):  # ... then 3 from it, the key groups of each
        op, out = _backend_op(backend, tmp_path, spec, subtask, 3)
        parts = [p for h in handles if (p := h.restricted_to(op.key_groups)) is not None]
        op.initialize_state(OperatorRestore(keyed=parts), 1)
        # No watermark yet: the rows of window 10 are late by the restored key groups'.
        op.process_batch(_mine(second, spec, op.key_groups), None)
        op.process_watermark(MAX_WATERMARK)
        emitted += out.rows()
        late += op.counters.late_records_dropped
    assert _ranked(emitted, spec) == expected
    assert late == whole.counters.late_records_dropped


def test_partition_ids_rank_rows_of_codes_when_the_radices_overflow() -> None:
    rng = random.Random(2)
    columns = {f"c{i}": [rng.randrange(20_000) for _ in range(20_000)] for i in range(5)}
    table = pa.table(columns)
    table = pa.concat_tables([table, table.slice(0, 100)])  # 100 partitions twice
    ids = topn.partition_ids(table, list(columns))
    assert (ids[:100] == ids[-100:]).all()
    assert len(set(ids.tolist())) == len({tuple(r.values()) for r in table.to_pylist()})
