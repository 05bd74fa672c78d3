"""Conditions taken apart: conjuncts, rank limits, join time bounds; and the column
adapter the plan runs per batch."""

from __future__ import annotations

import pyarrow as pa
import pytest
from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.sql.catalog import TableDef
from epochstream.sql.conditions import and_, conjuncts, interval_bounds, rank_limit
from epochstream.sql.dialect import parse_script
from epochstream.sql.expressions import Field
from epochstream.sql.plan import ColumnAdapter, StreamScanNode
from epochstream.sql.scope import Scope
from epochstream.sql.types import SqlType

TS = SqlType.parse("TIMESTAMP(3)")


def _where(sql: str) -> exp.Expression:
    [select] = parse_script(f"SELECT * FROM t WHERE {sql}")
    return select.args["where"].this


def _input(name: str, rowtime: str) -> StreamScanNode:
    fields = (Field("k", SqlType.parse("BIGINT")), Field(rowtime, TS))
    table = TableDef(name, fields, rowtime=rowtime)
    return StreamScanNode((), fields, rowtime, name, table=table)


def test_conjuncts_and_back() -> None:
    parts = list(conjuncts(_where("a = 1 AND (b = 2 AND c = 3)")))
    assert [p.sql() for p in parts] == ["a = 1", "b = 2", "c = 3"]
    assert and_(parts).sql() == "a = 1 AND b = 2 AND c = 3"


@pytest.mark.parametrize(
    ("sql", "limit", "rest"),
    [
        ("rn <= 3", 3, None),
        ("rn < 3 AND x > 1", 2, "x > 1"),
        ("rn = 1", 1, None),
        ("x > 1", None, "x > 1"),
    ],
)
def test_rank_limit(sql: str, limit: int | None, rest: str | None) -> None:
    found, remaining = rank_limit(_where(sql), "rn")
    assert found == limit
    assert (remaining.sql() if remaining is not None else None) == rest


def test_rank_limit_refuses_what_keeps_no_row_or_is_not_dedup() -> None:
    with pytest.raises(SqlError, match="keeps no row"):
        rank_limit(_where("rn < 1"), "rn")
    with pytest.raises(SqlError, match="only rn = 1"):
        rank_limit(_where("rn = 2"), "rn")


def test_interval_bounds_from_between_and_strict_comparisons() -> None:
    left, right = _input("a", "t"), _input("b", "u")
    scope = Scope([("a", {"k": "k", "t": "t"}), ("b", {"k": "k0", "u": "u"})])
    between = _where("a.t BETWEEN b.u - INTERVAL '10' SECOND AND b.u + INTERVAL '1' SECOND")
    assert interval_bounds([between], scope, 1, left, right) == (-10_000, 1_000)
    strict = list(conjuncts(_where("b.u > a.t - INTERVAL '2' SECOND AND a.t > b.u")))
    # b.u > a.t - 2 s  <=>  a.t - b.u < 2 s;  a.t > b.u  <=>  a.t - b.u >= 1 ms
    assert interval_bounds(strict, scope, 1, left, right) == (1, 1_999)
    one_sided = [_where("a.t >= b.u")]
    assert interval_bounds(one_sided, scope, 1, left, right) is None


def test_column_adapter_renames_casts_and_keeps_event_time() -> None:
    batch = pa.record_batch({"date_time": [1_000, 2_000], "x": [1, 2], "_ts": [1_000, 2_000]})
    adapter = ColumnAdapter([("dateTime", "date_time", pa.timestamp("ms"))])
    out = adapter(batch)
    assert out.schema.names == ["dateTime", "_ts"]
    assert out.column("dateTime").type == pa.timestamp("ms")
    assert out.column("_ts").to_pylist() == [1_000, 2_000]
