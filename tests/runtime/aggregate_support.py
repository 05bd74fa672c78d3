"""What the tests of the SQL aggregation operators share (window, session, group and
Top-N): the two backends, an operator on one of them, DuckDB's expressions for
``AggCall`` aggregates and their values read back as the operators give them, and a
float-aware comparison of results."""

from __future__ import annotations

import math
import random
from typing import Any

from columnar_support import MAX_P, make_operator

from epochstream.core.clock import ManualClock
from epochstream.graph.specs import AggCall
from epochstream.state.backends.base import KeyedBackendContext
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.keygroups import key_group_range_for_operator

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
