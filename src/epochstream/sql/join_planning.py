"""Joins in a FROM clause (``a [LEFT|RIGHT|FULL] JOIN b ON ...`` or ``a, b WHERE ...``):
the join's kind (window, interval or regular, in that order of preference: the first two
keep bounded state), its keys, the filters each side takes, the residual condition,
and the columns each side keeps.

Example::

    node, scope, rest = plan_join(planner, left, left_scope, join, where, referenced)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.graph.specs import EquiJoinSpec, IntervalBounds, WindowEnd
from epochstream.sql.conditions import (
    and_,
    conjuncts,
    interval_bounds,
    is_time_comparison,
    window_pairs,
)
from epochstream.sql.dialect import shortened, sql_error, sql_text
from epochstream.sql.expressions import Field, compile_expression
from epochstream.sql.plan import JoinNode, PlanNode, require_append_only
from epochstream.sql.scope import Scope, bind, field_column

if TYPE_CHECKING:
    from epochstream.sql.planner import Planner

__all__ = ["plan_join", "used_fields"]


def _join_type(join: exp.Join) -> str:
    """``inner``, ``left``, ``right`` or ``full`` of a JOIN; other kinds are refused."""
    side = (join.args.get("side") or "").lower()
    kind = (join.args.get("kind") or "").upper()
    if kind not in ("", "INNER", "OUTER") or (kind == "INNER" and side):
        raise sql_error(join, f"{kind} JOIN is not supported; write an inner or outer equi-join")
    if side not in ("", "left", "right", "full"):
        raise sql_error(join, f"{side.upper()} JOIN is not supported")
    return side or "inner"


def _outer_filters(join_type: str) -> tuple[bool, bool]:
    """Whether an ON conjunct over only the left (right) side may filter that side's
    input: only on a side that is not preserved. ``a LEFT JOIN b ON a.k = b.k AND b.x >
    0`` filters ``b``; ``... AND a.x > 0`` keeps every ``a`` row, unmatched where false
    (it joins the residual condition)."""
    return join_type in ("inner", "right"), join_type in ("inner", "left")


def _nullable(f: Field) -> Field:
    """``f`` as the null-padded side of an outer join gives it: nullable."""
    return f if f.type.nullable else Field(f.name, dataclasses.replace(f.type, nullable=True))


def _join_unique_key(
    left: PlanNode, right: PlanNode, fields: tuple[Field, ...], rename: dict[str, str]
) -> tuple[str, ...] | None:
    """An updating join's unique key: both inputs' unique keys together (a live left
    row meets a live right row at most once), when both are known and kept."""
    if left.unique_key is None or right.unique_key is None:
        return None
    key = (*left.unique_key, *(rename[k] for k in right.unique_key))
    names = {f.name for f in fields}
    return key if all(k in names for k in key) else None


def used_fields(
    node: PlanNode, scope: Scope, referenced: set[tuple[str, str]] | None
) -> tuple[Field, ...]:
    """The fields of ``node`` that a ``referenced`` column can name in ``scope`` (all
    when ``referenced`` is None), in ``node``'s order."""
    if referenced is None:
        return node.fields
    named = {
        field
        for qualifier, columns in scope.items
        for name, field in columns.items()
        if ("", name) in referenced or (qualifier or "", name) in referenced
    }
    return tuple(f for f in node.fields if f.name in named)


def plan_join(
    planner: Planner,
    left: PlanNode,
    left_scope: Scope,
    join: exp.Join,
    where: exp.Expression | None,
    referenced: set[tuple[str, str]] | None,
) -> tuple[PlanNode, Scope, exp.Expression | None]:
    """``left JOIN right ON ...`` (or ``left, right WHERE ...``): an inner join,
    planned as a window join, an interval join or a regular join (in that order of
    preference: the first two keep bounded state), or a LEFT, RIGHT or FULL OUTER
    join, always a regular one. Returns the join, the names it offers, and the
    WHERE conjuncts it did not take (all of them for an outer join: see
    :func:`_outer_filters`).

    ``referenced``: the columns the SELECT writes anywhere, ``(qualifier or "",
    name)`` (None: all, for ``*``); each side keeps only the fields one can name,
    so that neither the join's state nor its input scans hold columns nothing
    reads."""
    join_type = _join_type(join)
    if join.args.get("using"):
        raise sql_error(join, "JOIN ... USING is not supported; write ON a.k = b.k")
    right, right_scope, window = planner.from_item(join.this)
    if window is not None:
        raise sql_error(window.tvf, "a window TVF as a join input is not supported yet")
    rename, used = {}, {f.name for f in left.fields}
    for f in right.fields:
        out, i = f.name, 0
        while out in used:
            out, i = f"{f.name}{i}", i + 1
        used.add(out)
        rename[f.name] = out
    [(right_qualifier, right_columns)] = right_scope.items
    scope = Scope(
        [*left_scope.items, (right_qualifier, {k: rename[v] for k, v in right_columns.items()})]
    )
    right_index = len(scope.items) - 1

    def sides(node: exp.Expression) -> set[int] | None:
        try:
            return {
                0 if scope.side(c) < right_index else 1
                for c in node.find_all(exp.Column)
                if not isinstance(c.this, exp.Star)
            }
        except SqlError:
            return None

    on = join.args.get("on")
    parts = list(conjuncts(on)) if on is not None else []
    remaining: list[exp.Expression] = []
    for c in conjuncts(where) if where is not None else []:
        # An outer join's WHERE filters its output (null-padded rows included).
        outside = join_type != "inner" or sides(c) is None
        (remaining if outside else parts).append(c)

    def bound(node: exp.Expression, side_scope: Scope) -> exp.Expression:
        node = node.copy()
        bind(node, side_scope)
        return node

    left_filters, right_filters, residual = [], [], []
    key_pairs: list[tuple[exp.Expression, exp.Expression]] = []
    times: list[exp.Expression] = []
    for c in parts:
        where_sides = sides(c)
        if where_sides is None:
            bound(c, scope)  # raises the error of the column that does not resolve
        if where_sides in ({0}, {1}) and not _outer_filters(join_type)[min(where_sides)]:
            # An ON conjunct of a preserved side decides matches, not which rows stay.
            residual.append(c)
        elif where_sides == {0}:
            left_filters.append(bound(c, left_scope))
        elif where_sides == {1}:
            right_filters.append(bound(c, right_scope))
        elif (
            where_sides == {0, 1}
            and isinstance(c, exp.EQ)
            and {
                frozenset(sides(c.this) or ()),
                frozenset(sides(c.expression) or ()),
            }
            == {frozenset({0}), frozenset({1})}
        ):
            lhs, rhs = (c.this, c.expression) if sides(c.this) == {0} else (c.expression, c.this)
            key_pairs.append((bound(lhs, left_scope), bound(rhs, right_scope)))
        elif where_sides == {0, 1} and is_time_comparison(c):
            times.append(c)
            residual.append(c)
        else:
            residual.append(c)

    mode, bounds, window_ends = "regular", None, None
    ends = window_pairs(key_pairs, left, right) if join_type == "inner" else None
    if ends is not None:
        mode, window_ends = "window", ends
    elif join_type == "inner":
        found = interval_bounds(times, scope, right_index, left, right)
        if found is not None:
            mode, bounds = "interval", found
            residual = [c for c in residual if all(c is not t for t in times)]
    if mode != "regular":
        for side in (left, right):
            require_append_only(side, join, f"an {mode} join")
    if not key_pairs:
        raise sql_error(
            on if on is not None else join,
            "a join needs an equality between the two sides (a.k = b.k); a join without "
            "one pairs every row with every other",
        )

    left_fields = used_fields(left, left_scope, referenced)
    right_fields = used_fields(right, right_scope, referenced)
    left_pre, left_keys = _join_side(
        planner, left, left_fields, [k for k, _ in key_pairs], left_filters, "$lk"
    )
    right_pre, right_keys = _join_side(
        planner, right, right_fields, [k for _, k in key_pairs], right_filters, "$rk"
    )
    padded_left, padded_right = (join_type in ("right", "full"), join_type in ("left", "full"))
    fields = (
        *(_nullable(f) if padded_left else f for f in left_fields),
        *(
            _nullable(Field(rename[f.name], f.type))
            if padded_right
            else Field(rename[f.name], f.type)
            for f in right_fields
        ),
    )
    condition = None
    condition_text = ""
    if residual:
        predicate = and_([bound(c, scope) for c in residual])
        condition = compile_expression(predicate, fields, planner.catalog.functions)
        condition_text = sql_text(predicate)
    windows = {}
    if mode == "window":
        kept = {f.name for f in left_fields}
        windows = {n: w for n, w in left.windows.items() if n in kept}
    retention: IntervalBounds | WindowEnd | None = None
    if mode == "interval":
        assert bounds is not None
        retention = IntervalBounds(*bounds)
    elif mode == "window":
        assert window_ends is not None
        retention = WindowEnd(*window_ends)
    spec = EquiJoinSpec(
        left_keys=tuple(left_keys),
        right_keys=tuple(right_keys),
        left_output=tuple((f.name, f.name) for f in left_fields),
        right_output=tuple((f.name, rename[f.name]) for f in right_fields),
        condition=condition.evaluate if condition is not None else None,
        retention=retention,
        **_regular_join_options(planner, mode, join_type, fields, left, right),
    )
    node = JoinNode(
        (left_pre, right_pre),
        fields,
        None,
        shortened(f"{mode} join" if join_type == "inner" else f"{join_type} outer join"),
        windows=windows,
        spec=spec,
        condition_text=condition_text,
        updating=spec.changelog,
        unique_key=_join_unique_key(left, right, fields, rename) if spec.changelog else None,
    )
    return node, scope, and_(remaining) if remaining else None


def _regular_join_options(
    planner: Planner,
    mode: str,
    join_type: str,
    fields: tuple[Field, ...],
    left: PlanNode,
    right: PlanNode,
) -> dict[str, Any]:
    """The :class:`EquiJoinSpec` settings of a regular join: its type, whether an
    input is updating, the state TTL (``table.exec.state.ttl``) and the output
    columns' Arrow types (null-padded rows and changelog batches are cast to
    them); none for interval and window joins."""
    if mode != "regular":
        return {}
    return {
        "join_type": join_type,
        "updating_input": left.updating or right.updating,
        "state_ttl_ms": planner.options.state_ttl_ms,
        "output_schema": pa.schema([(f.name, f.type.to_arrow()) for f in fields]),
    }


def _join_side(
    planner: Planner,
    node: PlanNode,
    fields: tuple[Field, ...],
    keys: list[exp.Expression],
    filters: list[exp.Expression],
    prefix: str,
) -> tuple[PlanNode, list[str]]:
    """One join input: its filters, the ``fields`` the join passes on and its
    computed key columns in a Calc (the input itself when there is nothing to
    compute), and its key column names."""
    names = [f.name for f in fields]
    projections: list[tuple[str, exp.Expression]] = [(n, field_column(n)) for n in names]
    key_names = []
    for i, key in enumerate(keys):
        if isinstance(key, exp.Column) and key.name in names:
            key_names.append(key.name)
        else:
            name = f"{prefix}{i}"
            projections.append((name, key))
            key_names.append(name)
    pre = planner.calc(node, projections, and_(filters) if filters else None, "join input")
    return pre, key_names
