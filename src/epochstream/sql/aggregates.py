"""Aggregate calls in a query: finding them (``FILTER`` included), their result types
(Flink's, and the ones the window operators emit), and the window a cascading
aggregation groups by.

Example: ``aggregates_in(select.expressions[1])`` gives ``[Count(Star)]`` for ``COUNT(*) + 1``
"""

from __future__ import annotations

from sqlglot import exp

from epochstream.graph.specs import AggCall, WindowTvf
from epochstream.sql.dialect import sql_error
from epochstream.sql.plan import PlanNode
from epochstream.sql.types import SqlType, aggregate_result_type

__all__ = [
    "AGGREGATES",
    "aggregates_in",
    "flink_result_type",
    "given_window",
    "operator_result_type",
    "plain_column",
]

#: The aggregate functions a window aggregation takes, by sqlglot node.
AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}


def plain_column(node: exp.Expression, prefix: str) -> str:
    """The column an aggregate of a SESSION window reads (a plain column only)."""
    if not isinstance(node, exp.Column):
        raise sql_error(node, "this window's aggregate takes a column, not an expression, for now")
    return node.name


def given_window(group_items: list[exp.Expression], input_: PlanNode) -> WindowTvf | None:
    """The window of ``input_`` whose start and end columns are both among
    ``group_items``, or None."""
    starts: dict[WindowTvf, str] = {}
    ends: dict[WindowTvf, str] = {}
    for g in group_items:
        if isinstance(g, exp.Column) and g.name in input_.windows:
            role, window = input_.windows[g.name]
            (starts if role == "start" else ends)[window] = g.name
    return next((window for window in starts if window in ends), None)


def flink_result_type(call: AggCall, arg_type: SqlType | None) -> SqlType:
    """Flink's result type of ``call`` (``COUNT`` is ``BIGINT NOT NULL``, ``SUM(INT)``
    is ``INT``, ...)."""
    kind = "COUNT" if call.kind in ("count", "count_star") else call.kind.upper()
    return aggregate_result_type(kind, None if kind == "COUNT" else arg_type)


def operator_result_type(call: AggCall, arg_type: SqlType | None) -> SqlType:
    """The type the window aggregate operator emits for ``call``: Flink's result type,
    except that SUM and AVG of the integer types below BIGINT come out as BIGINT (the
    operator accumulates in int64); the Calc after the operator casts them back."""
    result = flink_result_type(call, arg_type)
    if call.kind in ("sum", "avg") and result.name in ("TINYINT", "SMALLINT", "INT"):
        return SqlType("BIGINT")
    return result


def aggregates_in(node: exp.Expression) -> list[exp.Expression]:
    """The outermost aggregate calls in ``node`` (a ``FILTER`` with its aggregate)."""
    found: list[exp.Expression] = []
    kinds = tuple(AGGREGATES)

    def walk(n: exp.Expression) -> None:
        if isinstance(n, exp.Filter) and isinstance(n.this, kinds):
            found.append(n)
            return
        if isinstance(n, kinds):
            found.append(n)
            return
        for child in n.iter_expressions():
            walk(child)

    walk(node)
    return found
