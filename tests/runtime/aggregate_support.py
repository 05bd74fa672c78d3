"""What the tests of the SQL aggregation operators share (window, session, group and
Top-N): the two backends, an operator on one of them, DuckDB's expressions for
``AggCall`` aggregates and their values read back as the operators give them, and a
float-aware comparison of results."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
from columnar_support import MAX_P, make_operator

from epochstream.core.changelog import OP, kind_names
from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.graph.specs import AggCall, GroupAggregateSpec
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.keygroups import key_group_range_for_operator

#: The value columns the tests draw rows of: two keys, an int64 and a float64 value, and
#: a boolean for FILTER.
VALUES_SCHEMA = pa.schema(
    [
        ("k1", pa.int64()),
        ("k2", pa.string()),
        ("v", pa.int64()),
        ("f", pa.float64()),
        ("b", pa.bool_()),
    ]
)
#: Every aggregate the property tests draw from (v: int64, f: float64, b: the filter).
CATALOG = [
    AggCall("count_star", None, "n"),
    AggCall("count_star", None, "n_b", filter="b"),
    AggCall("count", "v", "c_v"),
    AggCall("count", "v", "cd_v", distinct=True),
    AggCall("count", "v", "cd_v_b", distinct=True, filter="b"),
    AggCall("count", "f", "cd_f", distinct=True),
    AggCall("sum", "v", "s_v"),
    AggCall("sum", "v", "s_v_b", filter="b"),
    AggCall("sum", "f", "s_f"),
    AggCall("avg", "v", "a_v"),
    AggCall("avg", "f", "a_f", filter="b"),
    AggCall("min", "v", "mn_v"),
    AggCall("max", "v", "mx_v_b", filter="b"),
    AggCall("min", "f", "mn_f"),
    AggCall("max", "f", "mx_f"),
    AggCall("min", "f", "mn_f_b", filter="b"),
]
BACKENDS = {
    "heap": HeapStateBackend,
    "rocksdb": lambda: RocksDBStateBackend(block_cache_mb=1, write_buffer_mb=1),
}


def operator_on(
    kind: str,
    spec: Any,
    keys: tuple[str, ...],
    *,
    subtask: int = 0,
    parallelism: int = 1,
    backend: str = "heap",
    local_dir: str = "",
    clock: ManualClock | None = None,
) -> Any:
    """Operator ``kind`` as subtask ``subtask`` of ``parallelism`` keyed by ``keys``, its
    state on a ``backend`` backend (RocksDB's files under ``local_dir``), its own clock
    ``clock``."""
    keyed = BACKENDS[backend]().create(
        KeyedBackendContext(
            operator_uid="agg",
            subtask=subtask,
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, parallelism, subtask),
            clock=ManualClock(start=1_000.0),
            local_dir=f"{local_dir}/{parallelism}-{subtask}-{random.random()}",
        )
    )
    return make_operator(
        kind,
        spec,
        keys=list(keys) or None,
        subtask=subtask,
        parallelism=parallelism,
        clock=clock,
        keyed_backend=keyed,
    )


def duckdb_aggregates(aggs: tuple[AggCall, ...]) -> list[str]:
    """DuckDB's expressions for ``aggs`` over columns ``v`` (int64) and ``f`` (float64);
    an integer AVG is its SUM and COUNT (truncated by :func:`duckdb_values`)."""
    select = []
    for a in aggs:
        where = f" FILTER (WHERE {a.filter})" if a.filter else ""
        if a.kind == "count_star":
            select.append(f"count(*){where}")
        elif a.kind == "avg" and a.column == "v":
            select += [f"sum(v){where}", f"count(v){where}"]
        elif a.distinct:
            select.append(f"count(DISTINCT {a.column}){where}")
        else:
            select.append(f"{a.kind}({a.column}){where}")
    return select


def duckdb_values(values: list[Any], aggs: tuple[AggCall, ...]) -> dict[str, Any]:
    """The results of :func:`duckdb_aggregates`' expressions as the operators give them:
    an integer AVG truncated toward zero, an integer SUM an int."""
    values = list(values)
    out: dict[str, Any] = {}
    for a in aggs:
        if a.kind == "avg" and a.column == "v":
            total, count = values.pop(0), values.pop(0)
            quotient = None if total is None else abs(int(total)) // count
            out[a.output] = quotient if total is None or total >= 0 else -quotient
        else:
            value = values.pop(0)
            integer = a.kind == "sum" and a.column == "v" and value is not None
            out[a.output] = int(value) if integer else value
    return out


def same(a: Any, b: Any) -> bool:
    """Equal values (NULL only to NULL, NaN to NaN, floats to 1e-9)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def assert_equal(got: dict[Any, Any], expected: dict[Any, Any]) -> None:
    """``{group: {output: value}}`` results equal group by group (:func:`same` values)."""
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    for key, values in expected.items():
        for name, value in values.items():
            assert same(got[key][name], value), (key, name, got[key][name], value)


def snapshot_target(root: Path, n: int, subtask: int = 0) -> SnapshotTarget:
    """Where subtask ``subtask`` writes checkpoint ``n`` under ``root``."""
    return SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=n,
        directory=str(root / f"chk-{n}"),
        shared_dir=str(root / "shared"),
        name=f"agg-{n}-{subtask}",
    )


def routed(batch: pa.RecordBatch, keys: tuple[str, ...], groups: range) -> pa.RecordBatch:
    """The rows of ``batch`` a hash edge on ``keys`` sends to the subtask of key groups
    ``groups``."""
    kgs = key_groups_by_columns([batch.column(k) for k in keys], MAX_P, rows=batch.num_rows)
    return batch.filter(pa.array([int(g) in groups for g in kgs]))


class Upserted:
    """A changelog applied to a table by key, checking each -U retracts what is there."""

    def __init__(self, spec: GroupAggregateSpec) -> None:
        self.spec = spec
        self.table: dict[Any, dict[str, Any]] = {}

    def apply(self, batch: pa.RecordBatch) -> None:
        names = [*self.spec.keys, *(a.output for a in self.spec.aggs), OP]
        assert batch.schema.names == names
        for row, kind in zip(
            batch.to_pylist(), kind_names(batch.column(OP)).to_pylist(), strict=True
        ):
            key = tuple(row[k] for k in self.spec.keys)
            values = {a.output: row[a.output] for a in self.spec.aggs}
            if kind == "+I":
                assert key not in self.table, f"+I of a held key {key}"
                self.table[key] = values
            elif kind in ("-U", "-D"):
                held = self.table.pop(key)
                assert all(same(held[n], v) for n, v in values.items()), (held, values)
            else:
                assert kind == "+U" and key not in self.table, f"+U without -U for {key}"
                self.table[key] = values
