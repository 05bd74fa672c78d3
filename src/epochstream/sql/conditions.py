"""Conditions, taken apart: the AND-ed parts of a WHERE or ON, a join's time bounds
(what makes it an interval join), its window bounds (a window join) and a Top-N's rank
limit. Pure functions over sqlglot trees and the planned inputs' attributes.

Example::

    interval_bounds([between], scope, 1, bids, auctions)   # (-10_000, 0)
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.sql.catalog import interval_ms
from epochstream.sql.dialect import Flink, sql_error
from epochstream.sql.plan import PlanNode
from epochstream.sql.scope import Scope

__all__ = [
    "and_",
    "comparisons_of",
    "conjuncts",
    "interval_bounds",
    "is_time_comparison",
    "rank_limit",
    "time_term",
    "window_pairs",
]


def text_of(node: exp.Expression) -> str:
    """``node`` as Flink SQL text."""
    return node.sql(dialect=Flink)


_FLIPPED = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "=": "="}
_COMPARISONS = {exp.GTE: ">=", exp.GT: ">", exp.LTE: "<=", exp.LT: "<", exp.EQ: "="}


def rank_limit(
    condition: exp.Expression | None, rank: str
) -> tuple[int | None, exp.Expression | None]:
    """``N`` of ``rank <= N`` (``< N``, ``= 1``) among ``condition``'s conjuncts, and
    the other conjuncts."""
    if condition is None:
        return None, None
    limit, rest = None, []
    for c in conjuncts(condition):
        is_rank = (
            isinstance(c, exp.LTE | exp.LT | exp.EQ)
            and isinstance(c.this, exp.Column)
            and c.this.name == rank
            and isinstance(c.expression, exp.Literal)
            and not c.expression.is_string
        )
        if not is_rank:
            rest.append(c)
            continue
        value = int(c.expression.name)
        n = value - 1 if isinstance(c, exp.LT) else value
        if isinstance(c, exp.EQ) and value != 1:
            raise sql_error(c, f"{rank} = {value}: only {rank} = 1 (deduplication) or {rank} <= N")
        if n < 1:
            raise sql_error(c, f"{text_of(c)} keeps no row")
        limit = n if limit is None else min(limit, n)
    return limit, and_(rest) if rest else None


def conjuncts(node: exp.Expression) -> Iterator[exp.Expression]:
    """The AND-ed parts of a condition."""
    if isinstance(node, exp.Paren):
        yield from conjuncts(node.this)
    elif isinstance(node, exp.And):
        yield from conjuncts(node.this)
        yield from conjuncts(node.expression)
    else:
        yield node


def and_(parts: list[exp.Expression]) -> exp.Expression:
    out = parts[0]
    for part in parts[1:]:
        out = exp.And(this=out, expression=part)
    return out


def is_time_comparison(node: exp.Expression) -> bool:
    return isinstance(node, exp.Between | exp.GTE | exp.GT | exp.LTE | exp.LT)


def comparisons_of(node: exp.Expression) -> list[tuple[str, exp.Expression, exp.Expression]]:
    """``a BETWEEN l AND h`` as ``a >= l``, ``a <= h``; a comparison as itself."""
    if isinstance(node, exp.Between):
        return [(">=", node.this, node.args["low"]), ("<=", node.this, node.args["high"])]
    return [(_COMPARISONS[type(node)], node.this, node.expression)]  # type: ignore[index]


def time_term(
    node: exp.Expression, scope: Scope, right_index: int, left: PlanNode, right: PlanNode
) -> tuple[int, int, int] | None:
    """``(side, shift, constant)`` when ``node`` is a side's time attribute plus or minus
    an interval: its value is that side's event time + shift + constant (ms)."""
    constant = 0
    while isinstance(node, exp.Add | exp.Sub) and isinstance(node.expression, exp.Interval):
        amount = interval_ms(node.expression)
        constant += amount if isinstance(node, exp.Add) else -amount
        node = node.this
    if isinstance(node, exp.Paren):
        return time_term(node.this, scope, right_index, left, right)
    if not isinstance(node, exp.Column):
        return None
    try:
        index = scope.side(node)
        name = scope.resolve(node)
    except SqlError:
        return None
    side, input_ = (1, right) if index == right_index else (0, left)
    if side == 1:
        name = next((k for k, v in scope.items[right_index][1].items() if v == name), name)
    if name == input_.rowtime:
        return side, 0, constant
    role = input_.windows.get(name)
    if role is not None and role[0] == "end":
        return side, 1, constant  # rows of a window aggregation carry _ts = window_end - 1
    return None


def window_pairs(
    keys: list[tuple[exp.Expression, exp.Expression]], left: PlanNode, right: PlanNode
) -> tuple[str, str] | None:
    """The two sides' window-end columns when ``keys`` equate both sides' window start
    and window end of the same window (a window join), else None."""
    found: dict[str, tuple[str, str]] = {}
    for a, b in keys:
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
            continue
        wa, wb = left.windows.get(a.name), right.windows.get(b.name)
        if wa is not None and wb is not None and wa == wb:
            found[wa[0]] = (a.name, b.name)
    if "start" in found and "end" in found:
        return found["end"]
    return None


def interval_bounds(
    comparisons: list[exp.Expression],
    scope: Scope,
    right_index: int,
    left: PlanNode,
    right: PlanNode,
) -> tuple[int, int] | None:
    """``(lower, upper)`` with ``lower <= left._ts - right._ts <= upper`` implied by
    ``comparisons`` of the two sides' time attributes, or None when they do not bound
    it on both ends. A window aggregation's ``window_end`` counts as a time
    attribute: its rows' event time is ``window_end - 1``."""
    lower, upper = None, None
    for c in comparisons:
        for op, a, b in comparisons_of(c):
            ta = time_term(a, scope, right_index, left, right)
            tb = time_term(b, scope, right_index, left, right)
            if ta is None or tb is None or ta[0] == tb[0]:
                return None
            # value = _ts + shift + constant on each side; normalize to left - right.
            if ta[0] == 1:
                ta, tb, op = tb, ta, _FLIPPED[op]
            k = (tb[1] + tb[2]) - (ta[1] + ta[2])
            if op in (">=", ">"):
                value = k if op == ">=" else k + 1
                lower = value if lower is None else max(lower, value)
            elif op in ("<=", "<"):
                value = k if op == "<=" else k - 1
                upper = value if upper is None else min(upper, value)
            else:
                return None
    if lower is None or upper is None:
        return None
    if lower > upper:
        raise sql_error(comparisons[0], f"the join's time bounds are empty ([{lower}, {upper}] ms)")
    return lower, upper
