"""From a parsed query to a physical plan (:mod:`epochstream.sql.plan`), with Flink SQL's
append-only semantics.

Planned here (part 1, append-only): ``SELECT`` with projections and scalar expressions,
``WHERE``, subqueries in ``FROM``, ``WITH``, views, ``UNION ALL``, and window
aggregation over ``TABLE(TUMBLE|HOP|CUMULATE(...))`` grouped by ``window_start,
window_end`` and keys, with ``COUNT``/``COUNT(DISTINCT)``/``SUM``/``MIN``/``MAX``/
``AVG``, ``FILTER (WHERE ...)`` and ``HAVING``. Everything else is refused with the
position of the construct and the reason: a ``GROUP BY`` without a window produces
updates, which append-only sinks cannot take. OVER aggregations in a select list are
planned by :mod:`epochstream.sql.over`.

How a window aggregation is planned: a Calc before it computes the group keys, the
aggregates' arguments and ``FILTER`` masks that are not plain columns (and applies
``WHERE``); the window aggregate operator then keeps one accumulator per key and slice;
a Calc after it computes the select list and ``HAVING`` from the keys, the window
columns and the aggregates.

Example::

    planner = Planner(catalog)
    node = planner.plan_query(parse_script("SELECT auction, price FROM bid")[0])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from sqlglot import exp

from epochstream.core.arrow import TS
from epochstream.core.changelog import OP
from epochstream.exceptions import ConfigurationError, SqlError
from epochstream.graph.specs import (
    AggCall,
    EquiJoinSpec,
    GroupAggregateSpec,
    IntervalBounds,
    MiniBatch,
    SessionAggregateSpec,
    SliceWindowAggregateSpec,
    WindowEnd,
    WindowTvf,
)
from epochstream.sql.aggregates import (
    AGGREGATES,
    aggregates_in,
    flink_result_type,
    given_window,
    operator_result_type,
)
from epochstream.sql.catalog import Catalog, TableDef, interval_ms
from epochstream.sql.conditions import (
    and_,
    conjuncts,
    interval_bounds,
    is_time_comparison,
    rank_limit,
    window_pairs,
)
from epochstream.sql.connectors import SinkBinding, sink_binding, source_binding
from epochstream.sql.dialect import Flink, WindowTVF, sql_error
from epochstream.sql.expressions import CalcProgram, Field, compile_expression
from epochstream.sql.options import SqlOptions
from epochstream.sql.over import inline_named_windows, over_calls, plan_over, refuse_updating_over
from epochstream.sql.plan import (
    CalcNode,
    GroupAggregateNode,
    JoinNode,
    PlanNode,
    ScanNode,
    SinkNode,
    StreamScanNode,
    TopNNode,
    UnionNode,
    WindowAggregateNode,
    WindowAssignNode,
    WindowTopNNode,
)
from epochstream.sql.rewrites import legacy_group_window
from epochstream.sql.scope import Scope, bind, field_column
from epochstream.sql.types import SqlType, common_type

__all__ = ["Planner"]

_WINDOW_COLUMNS = ("window_start", "window_end", "window_time")
_TIMESTAMP = SqlType.parse("TIMESTAMP(3)").with_nullable(False)


def _append_only(node: PlanNode, at: exp.Expression, what: str) -> None:
    """Refuse ``what`` (at ``at``) over ``node`` when its result is updating."""
    if node.updating:
        raise sql_error(
            at,
            f"{what} over an updating input (the changelog of a GROUP BY without a window) "
            "is not supported yet",
        )


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


def _check_changelog_sink(
    table: TableDef, binding: SinkBinding, query: PlanNode, at: exp.Expression
) -> None:
    """An updating query goes only to a sink that takes changes: every change (``print``,
    ``blackhole``, ``filesystem`` with ``'changelog-mode' = 'all'``), or upserts by a
    PRIMARY KEY that is the query's unique key (``jdbc``, ``delta``, ``upsert-kafka``)."""
    if binding.changelog == "all":
        return
    if binding.changelog == "append":
        raise sql_error(
            at,
            f"INSERT INTO {table.name}: the query's result is updating (a GROUP BY without "
            f"a window changes earlier results) and the {table.connector!r} sink takes "
            "appends only; write it to a 'jdbc', 'delta' or 'upsert-kafka' table with a PRIMARY "
            "KEY (upserts), 'print' or 'blackhole', or aggregate over a window"
            + (
                "; or set 'changelog-mode' = 'all' on this filesystem table to write every "
                "change with its kind in an 'op' column"
                if table.connector == "filesystem"
                else ""
            ),
        )
    key = query.unique_key
    primary = tuple(table.primary_key or ())
    if key is None or set(key) != set(primary):
        raise sql_error(
            at,
            f"INSERT INTO {table.name}: the table's PRIMARY KEY ({', '.join(primary)}) is not "
            f"the query's unique key ({', '.join(key) if key else 'unknown'}): an upsert by "
            "it would mix up groups",
        )


def _projected_key(
    key: tuple[str, ...] | None, projections: list[tuple[str, exp.Expression]]
) -> tuple[str, ...] | None:
    """``key`` under the names ``projections`` give its columns (None when one is not
    projected as it is)."""
    if key is None:
        return None
    names: dict[str, str] = {}
    for name, expr in projections:
        if isinstance(expr, exp.Column) and expr.name in key:
            names.setdefault(expr.name, name)
    if any(k not in names for k in key):
        return None
    return tuple(names[k] for k in key)


def _text(node: exp.Expression) -> str:
    return node.sql(dialect=Flink)


@dataclass
class _Window:
    """The window TVF a SELECT reads (planned only with its aggregation)."""

    tvf: WindowTVF
    #: TUMBLE, HOP or CUMULATE; None for SESSION (``gap``, ``partition``).
    window: WindowTvf | None
    gap: int = 0
    partition: tuple[exp.Column, ...] = ()
    #: Over a processing-time attribute (windows by the slots' clocks).
    proctime: bool = False

    @property
    def kind(self) -> str:
        return self.tvf.kind.lower()


class Planner:
    """Plans queries against a :class:`Catalog` (one instance per statement).

    Example: ``Planner(catalog).plan_query(select)``
    """

    def __init__(self, catalog: Catalog, options: SqlOptions | None = None) -> None:
        self.catalog = catalog
        #: The session's ``SET`` options (state TTL, mini-batch).
        self.options = options if options is not None else SqlOptions()
        self._ctes: list[dict[str, exp.Expression]] = []
        # One scan per table: the INSERTs of a statement set share their sources.
        self._scans: dict[str, PlanNode] = {}
        # The output names of a SELECT's bare column items before binding renamed them.
        self._item_names: dict[int, list[str]] = {}

    # ------------------------------------------------------------------ statements

    def plan_insert(self, insert: exp.Insert) -> SinkNode:
        """``INSERT INTO table [(columns)] query``: the query, cast to the table's
        columns, into the table's sink."""
        target = insert.this
        columns: list[str] | None = None
        if isinstance(target, exp.Schema):
            columns = [c.name for c in target.expressions]
            target = target.this
        name = target.name
        table = self.catalog.table(name)
        if table is None or table.connector is None:
            raise sql_error(
                target, f"INSERT INTO {name}: no table {name!r} created with a connector"
            )
        if insert.args.get("overwrite"):
            raise sql_error(target, "INSERT OVERWRITE is not supported (append-only sinks)")
        query = self.plan_query(insert.expression)
        wanted = list(columns) if columns is not None else [f.name for f in table.fields]
        unknown = [c for c in wanted if table.field(c) is None]
        if unknown:
            raise sql_error(target, f"table {name!r} has no column {unknown[0]!r}")
        if len(wanted) != len(query.fields):
            raise sql_error(
                insert.expression,
                f"INSERT INTO {name}: the query gives {len(query.fields)} columns, the table "
                f"takes {len(wanted)} ({', '.join(wanted)})",
            )
        projections = []
        for column, f in zip(wanted, query.fields, strict=True):
            declared = table.field(column)
            assert declared is not None
            ref: exp.Expression = field_column(f.name)
            if declared.type.with_nullable(True) != f.type.with_nullable(True):
                ref = exp.Cast(this=ref, to=exp.DataType.build(declared.type.sql(), dialect=Flink))
            projections.append((column, ref))
        cast = self._calc(query, projections, None, f"INSERT INTO {name}")
        binding = sink_binding(table)
        if cast.updating:
            _check_changelog_sink(table, binding, cast, insert.expression)
        return SinkNode((cast,), cast.fields, None, f"sink: {name}", table=table, binding=binding)

    def plan_query(self, query: exp.Expression) -> PlanNode:
        """A ``SELECT``, ``UNION ALL`` or parenthesized query."""
        if isinstance(query, exp.Subquery):
            return self.plan_query(query.this)
        with_ = query.args.get("with_")
        if with_ is not None:
            ctes = {cte.alias: cte.this for cte in with_.expressions}
            self._ctes.append(ctes)
            try:
                return self._plan_query_body(query)
            finally:
                self._ctes.pop()
        return self._plan_query_body(query)

    def _plan_query_body(self, query: exp.Expression) -> PlanNode:
        if isinstance(query, exp.Union):
            return self._plan_union(query)
        if isinstance(query, exp.Select):
            return self._plan_select(query)
        if isinstance(query, exp.Intersect | exp.Except):
            raise sql_error(query, f"{type(query).__name__.upper()} is not supported")
        raise sql_error(query, f"expected a query, got {type(query).__name__}")

    # ------------------------------------------------------------------ FROM

    def _lookup(self, table: exp.Table) -> PlanNode:
        name = table.name
        if table.args.get("db") or table.args.get("catalog"):
            raise sql_error(table, f"qualified table names are not supported: {_text(table)}")
        for scope in reversed(self._ctes):
            if name in scope:
                return self.plan_query(scope[name].copy())
        view = self.catalog.view(name)
        if view is not None:
            return self.plan_query(view)
        found = self.catalog.table(name)
        if found is None:
            known = ", ".join(self.catalog.names()) or "none"
            raise sql_error(table, f"unknown table {name!r} (tables and views: {known})")
        return self._scan(found)

    def _scan(self, table: TableDef) -> PlanNode:
        if table.name not in self._scans:
            self._scans[table.name] = self._new_scan(table)
        return self._scans[table.name]

    def _mini_batch(self, at: exp.Expression) -> MiniBatch | None:
        """The ``GROUP BY``'s mini-batch (at ``at``) by the session's options (None:
        disabled); Flink's rule: enabled needs an allow-latency and a size above 0."""
        options = self.options
        if not options.mini_batch_enabled:
            return None
        latency, size = options.mini_batch_allow_latency_ms, options.mini_batch_size
        if latency <= 0 or size <= 0:
            missing = (
                "table.exec.mini-batch.allow-latency"
                if latency <= 0
                else ("table.exec.mini-batch.size")
            )
            raise sql_error(
                at,
                f"table.exec.mini-batch.enabled is 'true' but {missing} is not set above 0 "
                "(Flink requires both: SET 'table.exec.mini-batch.allow-latency' = '2 s' and "
                "SET 'table.exec.mini-batch.size' = '5000')",
            )
        return MiniBatch(latency_ms=latency, size=size)

    def _new_scan(self, table: TableDef) -> PlanNode:
        if table.stream is not None:
            return StreamScanNode(
                (), table.fields, table.rowtime, f"table: {table.name}", table=table
            )
        # Every declared column; the Calc above keeps the ones the query uses.
        columns = tuple(f.name for f in table.fields if f.name != table.proctime)
        # The options are checked now, so explain_sql reports a bad one as running would.
        source_binding(table, list(columns))
        scan = ScanNode(
            (),
            tuple(f for f in table.fields if f.name in columns),
            table.rowtime,
            f"source: {table.name}",
            table=table,
            columns=columns,
        )
        if table.proctime is None:
            return scan
        # A PROCTIME() column is no connector's: the Calc above the source fills it.
        projections: list[tuple[str, exp.Expression]] = [
            (
                f.name,
                field_column(f.name)
                if f.name != table.proctime
                else exp.Anonymous(this="PROCTIME"),
            )
            for f in table.fields
        ]
        return self._calc(scan, projections, None, f"{table.name}: PROCTIME()")

    def _from(
        self, select: exp.Select
    ) -> tuple[PlanNode, Scope, _Window | None, exp.Expression | None]:
        """The planned FROM clause: its node, the names it offers, the window TVF it
        reads (if any), and what is left of WHERE to apply on top (a join takes the
        conditions between its sides)."""
        from_ = select.args.get("from_")
        if from_ is None:
            raise sql_error(
                select, "SELECT without FROM is not supported (a stream needs a source)"
            )
        where = select.args.get("where")
        condition = where.this if where is not None else None
        node, scope, window = self._from_item(from_.this)
        joins = select.args.get("joins") or []
        if joins and window is not None:
            raise sql_error(
                window.tvf,
                "a window TVF joined with another table is not supported yet; aggregate each "
                "side by window first (window join)",
            )
        referenced = _referenced_names(select) if joins else None
        for join in joins:
            node, scope, condition = self._plan_join(node, scope, join, condition, referenced)
        return node, scope, window, condition

    def _from_item(self, source: exp.Expression) -> tuple[PlanNode, Scope, _Window | None]:
        if isinstance(source, WindowTVF):
            window = self._window(source)
            input_ = self._lookup(source.args["table"])
            timecol = source.args["timecol"].name
            if timecol == input_.proctime and input_.proctime is not None:
                window.proctime = True
            elif input_.rowtime is None or timecol != input_.rowtime:
                raise sql_error(
                    source.args["timecol"],
                    f"{window.kind.upper()}: DESCRIPTOR({timecol}) must name the input's time "
                    "attribute (a column with a WATERMARK, or a PROCTIME() column; the input's "
                    f"is {input_.rowtime or input_.proctime or 'none'})",
                )
            return input_, Scope.of(source.alias or None, input_.fields), window
        if isinstance(source, exp.Table):
            if source.args.get("version") is not None:
                raise sql_error(
                    source,
                    f"{_text(source.args['version'])}: temporal and lookup joins are not "
                    "supported yet",
                )
            node = self._lookup(source)
            return node, Scope.of(source.alias_or_name, node.fields), None
        if isinstance(source, exp.Subquery):
            node = self.plan_query(source.this)
            return node, Scope.of(source.alias or None, node.fields), None
        raise sql_error(source, f"unsupported FROM item {type(source).__name__}")

    # ------------------------------------------------------------------ joins

    def _plan_join(
        self,
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
        right, right_scope, window = self._from_item(join.this)
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
                lhs, rhs = (
                    (c.this, c.expression) if sides(c.this) == {0} else (c.expression, c.this)
                )
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
                _append_only(side, join, f"an {mode} join")
        if not key_pairs:
            raise sql_error(
                on if on is not None else join,
                "a join needs an equality between the two sides (a.k = b.k); a join without "
                "one pairs every row with every other",
            )

        left_fields = _used_fields(left, left_scope, referenced)
        right_fields = _used_fields(right, right_scope, referenced)
        left_pre, left_keys = self._join_side(
            left, left_fields, [k for k, _ in key_pairs], left_filters, "$lk"
        )
        right_pre, right_keys = self._join_side(
            right, right_fields, [k for _, k in key_pairs], right_filters, "$rk"
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
            condition = compile_expression(predicate, fields, self.catalog.functions)
            condition_text = _text(predicate)
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
            **self._regular_join_options(mode, join_type, fields, left, right),
        )
        node = JoinNode(
            (left_pre, right_pre),
            fields,
            None,
            _short(f"{mode} join" if join_type == "inner" else f"{join_type} outer join"),
            windows=windows,
            spec=spec,
            condition_text=condition_text,
            updating=spec.changelog,
            unique_key=_join_unique_key(left, right, fields, rename) if spec.changelog else None,
        )
        return node, scope, and_(remaining) if remaining else None

    def _regular_join_options(
        self,
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
            "state_ttl_ms": self.options.state_ttl_ms,
            "output_schema": pa.schema([(f.name, f.type.to_arrow()) for f in fields]),
        }

    def _join_side(
        self,
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
        pre = self._calc(node, projections, and_(filters) if filters else None, "join input")
        return pre, key_names

    def _window(self, tvf: WindowTVF) -> _Window:
        kind = tvf.kind.lower()
        if kind == "session":
            gap = interval_ms(tvf.args["gap"])
            if gap <= 0:
                raise sql_error(tvf, "SESSION: the gap must be positive")
            return _Window(tvf, None, gap, tuple(tvf.args.get("partition_by") or ()))
        size = interval_ms(tvf.args["size"])
        offset = interval_ms(tvf.args["offset"]) if tvf.args.get("offset") else 0
        try:
            if kind == "tumble":
                window = WindowTvf.tumble(size, offset)
            elif kind == "hop":
                window = WindowTvf.hop(size, interval_ms(tvf.args["slide"]), offset)
            else:
                window = WindowTvf.cumulate(size, interval_ms(tvf.args["step"]), offset)
        except ConfigurationError as err:
            raise sql_error(tvf, f"{kind.upper()}: {err}") from None
        return _Window(tvf, window)

    # ------------------------------------------------------------------ binding

    def _select_list(
        self,
        select: exp.Select,
        scope: Scope,
        fields: tuple[Field, ...],
        *,
        bind_items: bool = True,
    ) -> list[tuple[str, exp.Expression]]:
        """``(output name, bound expression)`` per select item, ``*`` and ``t.*``
        expanded (``fields``: the input's, for ``*``). ``bind_items=False``: the items
        are bound already."""
        out: list[tuple[str, exp.Expression]] = []
        names_before = self._item_names.get(id(select)) or [
            e.name if isinstance(e, exp.Column) else "" for e in select.expressions
        ]
        for i, item in enumerate(select.expressions):
            if isinstance(item, exp.Star):
                out.extend((f.name, field_column(f.name)) for f in fields)
                continue
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                columns = next((c for q, c in scope.items if q == item.table), None)
                if columns is None:
                    raise sql_error(item, f"unknown table alias {item.table!r} in {_text(item)}")
                out.extend((name, field_column(field)) for name, field in columns.items())
                continue
            if bind_items:
                item = item.copy()
                bind(item, scope)
            if isinstance(item, exp.Alias):
                out.append((item.alias, item.this))
            elif isinstance(item, exp.Column):
                out.append((names_before[i], item))
            else:
                out.append((f"EXPR${i}", item))
        # A name given twice (a.x, b.x) is made unique as Flink does: x, x0, x1...
        seen: set[str] = set()
        for i, (name, expr) in enumerate(out):
            unique, n = name, 0
            while unique in seen:
                unique, n = f"{name}{n}", n + 1
            seen.add(unique)
            out[i] = (unique, expr)
        if not out:
            raise sql_error(select, "empty select list")
        return out

    # ------------------------------------------------------------------ SELECT

    def _plan_select(self, select: exp.Select) -> PlanNode:
        select = inline_named_windows(select)
        for arg, what in (
            ("order", "ORDER BY"),
            ("limit", "LIMIT"),
            ("offset", "OFFSET"),
            ("qualify", "QUALIFY"),
            ("windows", "WINDOW"),
        ):
            if select.args.get(arg):
                raise sql_error(select.args[arg], f"{what} is not supported on an unbounded stream")
        if select.args.get("distinct"):
            return self._plan_distinct(select)
        top_n = self._window_top_n(select)
        if top_n is not None:
            return top_n
        select = legacy_group_window(select)
        input_, scope, window, where = self._from(select)
        if over_calls(select):
            if window is not None:
                raise sql_error(window.tvf, "OVER aggregates over a window TVF are not supported")
            return plan_over(self, select, input_, scope, where)
        elsewhere = (select.args.get(a) for a in ("where", "group", "having"))
        over = next((w for e in elsewhere if e for w in e.find_all(exp.Window)), None)
        if over is not None:
            raise sql_error(over, "OVER is only supported in the SELECT list")
        has_aggregates = any(aggregates_in(item) for item in select.expressions)
        grouped = select.args.get("group") is not None or has_aggregates
        if not grouped:
            if window is not None:
                input_, scope = self._window_assign(input_, scope, window)
            if select.args.get("having"):
                raise sql_error(select.args["having"], "HAVING needs a GROUP BY")
            projections = self._select_list(select, scope, input_.fields)
            if where is not None:
                bind(where, scope)
            return self._calc(input_, projections, where, _text(select))
        return self._plan_window_aggregate(select, input_, scope, window, where)

    def _plan_distinct(self, select: exp.Select) -> PlanNode:
        """``SELECT DISTINCT ...``: the query without DISTINCT, grouped by all of its
        output columns (what Flink rewrites it to): an updating result, one row per
        distinct row."""
        if select.args["distinct"].args.get("on"):
            raise sql_error(select.args["distinct"], "DISTINCT ON is not supported")
        plain = select.copy()
        plain.set("distinct", None)
        names = [f.name for f in self.plan_query(plain.copy()).fields]
        columns = [exp.column(exp.to_identifier(n, quoted=True)) for n in names]
        grouped = exp.Select(
            expressions=[c.copy() for c in columns],
            from_=exp.From(this=_subquery(plain, "__distinct")),
            group=exp.Group(expressions=columns),
        )
        return self._plan_select(grouped)

    def _window_assign(
        self, input_: PlanNode, scope: Scope, window: _Window
    ) -> tuple[PlanNode, Scope]:
        """A window TVF read without aggregation: its rows with their windows' columns
        (``SELECT * FROM TABLE(TUMBLE(...))``, a Top-N or join input)."""
        if window.window is None or window.proctime:
            raise sql_error(
                window.tvf,
                f"a {'SESSION' if window.window is None else 'processing-time'} window TVF "
                "without GROUP BY window_start, window_end is not supported yet",
            )
        _append_only(input_, window.tvf, "a window TVF")
        taken = [c for c in _WINDOW_COLUMNS if c in {f.name for f in input_.fields}]
        if taken:
            raise sql_error(window.tvf, f"the window TVF's input already has a column {taken[0]!r}")
        node = WindowAssignNode(
            (input_,),
            (*input_.fields, *(Field(c, _TIMESTAMP) for c in _WINDOW_COLUMNS)),
            input_.rowtime,
            _short(f"{window.kind.upper()} windows"),
            windows={
                "window_start": ("start", window.window),
                "window_end": ("end", window.window),
            },
            window=window.window,
        )
        return node, scope.with_columns(_WINDOW_COLUMNS)

    # ------------------------------------------------------------------ window Top-N

    def _window_top_n(self, select: exp.Select) -> PlanNode | None:
        """``SELECT ... FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY window_start,
        window_end, ... ORDER BY ...) AS rn FROM windowed) WHERE rn <= N``: Flink's window
        Top-N, or None when ``select`` is not of that shape."""
        from_ = select.args.get("from_")
        inner = from_.this if from_ is not None else None
        if not isinstance(inner, exp.Subquery) or not isinstance(inner.this, exp.Select):
            return None
        body = inner.this
        ranked = [
            (i, item)
            for i, item in enumerate(body.expressions)
            if isinstance(item, exp.Alias)
            and isinstance(item.this, exp.Window)
            and isinstance(item.this.this, exp.RowNumber)
        ]
        if len(ranked) != 1 or select.args.get("joins"):
            return None
        index, item = ranked[0]
        over = item.this
        rank = item.alias
        where = select.args.get("where")
        limit, rest = rank_limit(where.this if where is not None else None, rank)
        if limit is None:
            if over_calls(select):  # Nexmark q6: the filter on rn is in the ranking's query
                refuse_updating_over(
                    over_calls(select)[0],
                    "a ROW_NUMBER ranking without a limit, an updating result",
                )
            raise sql_error(
                over,
                f"ROW_NUMBER() needs a filter on {rank} in the outer query (WHERE {rank} <= N): "
                "without one the result is an unbounded, updating ranking",
            )
        trimmed = body.copy()
        trimmed.set("expressions", [e for i, e in enumerate(trimmed.expressions) if i != index])
        ranked_input = self.plan_query(trimmed)
        names = {f.name for f in ranked_input.fields}

        def column_of(node: exp.Expression) -> str:
            if not isinstance(node, exp.Column) or node.name not in names:
                raise sql_error(
                    node, "PARTITION BY and ORDER BY take columns of the ranked query's output"
                )
            return node.name

        partition = [column_of(p) for p in over.args.get("partition_by") or []]
        roles = {ranked_input.windows.get(c, ("", None))[0]: c for c in partition}
        windowed = "start" in roles and "end" in roles
        order_node = over.args.get("order")
        if order_node is None:
            raise sql_error(over, "ROW_NUMBER() OVER needs an ORDER BY")
        order = tuple(
            (column_of(o.this), bool(o.args.get("desc")), bool(o.args.get("nulls_first")))
            for o in order_node.expressions
        )
        for o, (_, descending, nulls_first) in zip(order_node.expressions, order, strict=True):
            # Flink's default null order (first ascending, last descending) is the
            # operator's; another is not supported yet.
            if nulls_first == descending:
                raise sql_error(
                    o,
                    "NULLS FIRST with DESC or NULLS LAST with ASC is not supported in Top-N",
                )
        keeps_rank = any(
            isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.name == rank)
            for item in select.expressions
            for e in item.find_all(exp.Column, exp.Star)
        )
        _append_only(ranked_input, over, "a window Top-N" if windowed else "a Top-N")
        fields = ranked_input.fields
        if keeps_rank:
            fields = (*fields, Field(rank, SqlType.parse("BIGINT").with_nullable(False)))
        node: PlanNode
        if windowed:
            node = WindowTopNNode(
                (ranked_input,),
                fields,
                None,
                _short(f"window top {limit}: {_text(over)}"),
                windows=dict(ranked_input.windows),
                partition=tuple(c for c in partition if c not in (roles["start"], roles["end"])),
                order=order,
                n=limit,
                rank_column=rank if keeps_rank else None,
                window_columns=(roles["start"], roles["end"]),
            )
        else:
            # An updating ranking (Flink's Top-N): unique by partition and row number,
            # or by the partition alone when it keeps one row.
            unique: tuple[str, ...] | None = None
            if keeps_rank:
                unique = (*partition, rank)
            elif limit == 1:
                unique = tuple(partition)
            node = TopNNode(
                (ranked_input,),
                fields,
                None,
                _short(f"top {limit}: {_text(over)}"),
                partition=tuple(partition),
                order=order,
                n=limit,
                rank_column=rank if keeps_rank else None,
                state_ttl_ms=self.options.state_ttl_ms,
                updating=True,
                unique_key=unique,
            )
        outer = select.copy()
        outer.set("from_", exp.From(this=exp.Table(this=exp.to_identifier("__top_n"))))
        outer.set("where", exp.Where(this=rest) if rest is not None else None)
        scope = Scope.of(inner.alias or None, node.fields)
        if over_calls(outer):  # an OVER aggregation over the (window) Top-N
            return plan_over(self, outer, node, scope, rest)
        projections = self._select_list(outer, scope, node.fields)
        condition = None
        if rest is not None:
            condition = outer.args["where"].this
            bind(condition, scope)
        return self._calc(node, projections, condition, _text(select))

    def _calc(
        self,
        input_: PlanNode,
        projections: list[tuple[str, exp.Expression]],
        condition: exp.Expression | None,
        label: str,
    ) -> PlanNode:
        """A Calc over ``input_``, or ``input_`` itself when it would change nothing."""
        names = [f.name for f in input_.fields]
        identity = (
            condition is None
            and [n for n, _ in projections] == names
            and all(isinstance(e, exp.Column) and e.name == n for n, e in projections)
        )
        if identity:
            return input_
        if isinstance(input_, CalcNode) and _fusable(input_):
            return self._fused(input_, projections, condition, label)
        if isinstance(input_, ScanNode):
            input_ = self._narrowed(input_, projections, condition)
        # A changelog's batches carry their row kinds (and no event time) through.
        program = CalcProgram.compile(
            projections,
            condition,
            input_.fields,
            self.catalog.functions,
            keep=(OP,) if input_.updating else (TS,),
        )
        rowtime = None
        proctime = None
        windows: dict[str, tuple[str, WindowTvf]] = {}
        for name, expr in projections:
            if isinstance(expr, exp.Anonymous) and expr.name.upper() == "PROCTIME":
                proctime = name
            if not isinstance(expr, exp.Column):
                continue
            if expr.name == input_.proctime:
                proctime = name
            if rowtime is None and expr.name == input_.rowtime:
                rowtime = name
            if expr.name in input_.windows:
                windows[name] = input_.windows[expr.name]
        text = ", ".join(
            _text(e) if isinstance(e, exp.Column) and e.name == n else f"{_text(e)} AS {n}"
            for n, e in projections
        )
        if condition is not None:
            text += f" WHERE {_text(condition)}"
        return CalcNode(
            (input_,),
            program.output_fields,
            rowtime,
            _short(label),
            windows=windows,
            proctime=proctime,
            updating=input_.updating,
            unique_key=_projected_key(input_.unique_key, projections),
            program=program,
            text=text,
            projections=tuple(projections),
            condition=condition,
        )

    def _narrowed(
        self,
        scan: ScanNode,
        projections: list[tuple[str, exp.Expression]],
        condition: exp.Expression | None,
    ) -> ScanNode:
        """``scan`` reading only the columns ``projections`` and ``condition`` use (a
        connector that can skip the others, Parquet, then does)."""
        used = {
            c.name
            for node in [
                *(e for _, e in projections),
                *([condition] if condition is not None else []),
            ]
            for c in node.find_all(exp.Column)
        }
        columns = tuple(c for c in scan.columns if c in used)
        if columns == scan.columns or not columns:
            return scan
        return ScanNode(
            (),
            tuple(f for f in scan.fields if f.name in columns),
            scan.rowtime if scan.rowtime in columns else None,
            scan.label,
            table=scan.table,
            columns=columns,
        )

    def _fused(
        self,
        below: CalcNode,
        projections: list[tuple[str, exp.Expression]],
        condition: exp.Expression | None,
        label: str,
    ) -> PlanNode:
        """One Calc for a Calc over a Calc: the upper one's columns replaced by the lower
        one's expressions, the conditions AND-ed (the lower first: the compiler runs the
        right side of an AND only on the rows the left side keeps)."""
        definitions = dict(below.projections)

        def inline(node: exp.Expression) -> exp.Expression:
            def visit(n: exp.Expression) -> exp.Expression:
                if isinstance(n, exp.Column) and n.name in definitions:
                    return definitions[n.name].copy()
                return n

            return node.copy().transform(visit)

        merged = [(name, inline(e)) for name, e in projections]
        conditions = [
            c for c in (below.condition, condition and inline(condition)) if c is not None
        ]
        fused = self._calc(below.inputs[0], merged, and_(conditions) if conditions else None, label)
        # Attributes are the upper Calc's: a column it renames keeps what the lower one had.
        upper_names = {n for n, _ in projections}
        if isinstance(fused, CalcNode):
            for name, expr in projections:
                if isinstance(expr, exp.Column):
                    if expr.name == below.rowtime:
                        fused.rowtime = name
                    if expr.name == below.proctime:
                        fused.proctime = name
                    if expr.name in below.windows:
                        fused.windows[name] = below.windows[expr.name]
            fused.windows = {n: w for n, w in fused.windows.items() if n in upper_names}
        return fused

    # ------------------------------------------------------------------ window aggregation

    def _plan_window_aggregate(
        self,
        select: exp.Select,
        input_: PlanNode,
        scope: Scope,
        window: _Window | None,
        where: exp.Expression | None,
    ) -> PlanNode:
        """A window aggregation: over a window TVF (``window``; windows computed from the
        event time), or over an input whose rows already carry their windows (the
        output of a window aggregation, grouped again by its window bounds: Flink's
        cascading window aggregation)."""
        group = select.args.get("group")
        group_items = list(group.expressions) if group is not None else []
        tvf_columns = window is not None
        visible = input_.fields
        columns_scope = scope
        if tvf_columns:
            visible = (
                *input_.fields,
                Field("window_start", _TIMESTAMP),
                Field("window_end", _TIMESTAMP),
                Field("window_time", _TIMESTAMP),
            )
            columns_scope = scope.with_columns(_WINDOW_COLUMNS)
        # Output names of bare column items, before binding renames them.
        self._item_names[id(select)] = [
            e.name if isinstance(e, exp.Column) else "" for e in select.expressions
        ]
        if where is not None:
            bind(where, scope)
        for item in [*group_items, *select.expressions]:
            bind(item, columns_scope)
        having = select.args.get("having")
        if having is not None:
            bind(having, columns_scope)

        if window is not None or given_window(group_items, input_) is not None:
            _append_only(input_, select, "a window aggregation")
        operator_window: WindowTvf | None
        if tvf_columns:
            assert window is not None
            operator_window = window.window
            bounds = {"window_start", "window_end"}
            if where is not None and any(
                c.name in _WINDOW_COLUMNS for c in where.find_all(exp.Column)
            ):
                raise sql_error(where, "WHERE cannot use the window columns before aggregation")
            if window.proctime and window.kind == "cumulate":
                raise sql_error(
                    window.tvf, "CUMULATE over a processing-time attribute is not supported"
                )
            grouped = {g.name for g in group_items if isinstance(g, exp.Column)}
            if not bounds <= grouped:
                raise sql_error(
                    group if group is not None else select,
                    f"a {window.kind.upper()} window aggregation groups by window_start and "
                    "window_end (Flink's window aggregation); without them the result would be "
                    "updating",
                )
            keys_of_group = [
                g
                for g in group_items
                if not (isinstance(g, exp.Column) and g.name in _WINDOW_COLUMNS)
            ]
            # Only regular event-time windows can be told apart again downstream (a
            # cascading window aggregation); sessions and processing time cannot.
            out_windows = (
                {
                    "window_start": ("start", operator_window),
                    "window_end": ("end", operator_window),
                }
                if operator_window is not None and not window.proctime
                else {}
            )
        elif (given := given_window(group_items, input_)) is None:
            # A GROUP BY without a window: running aggregates, an updating result.
            operator_window = None
            keys_of_group = list(group_items)
            out_windows = {}
        else:
            input_window = given
            # Each input window ends on its own multiple of this period (its rows' event
            # time is window_end - 1), so tumbling windows of it tell the input windows apart.
            period = {"hop": input_window.slide, "cumulate": input_window.step}.get(
                input_window.kind, input_window.size
            )
            assert period is not None
            operator_window = WindowTvf.tumble(period, input_window.offset % period)
            keys_of_group = list(group_items)
            out_windows = {}

        pre: list[tuple[str, exp.Expression]] = []
        pre_names: dict[str, str] = {}  # expression text -> pre-Calc column

        def pre_column(node: exp.Expression, prefix: str) -> str:
            text = _text(node)
            if text not in pre_names:
                plain = isinstance(node, exp.Column) and node.name not in _WINDOW_COLUMNS
                name = (
                    node.name
                    if plain and node.name not in pre_names.values()
                    else f"{prefix}{len(pre)}"
                )
                pre.append((name, node))
                pre_names[text] = name
            return pre_names[text]

        keys: list[str] = []
        key_text: dict[str, str] = {}
        for g in keys_of_group:
            if tvf_columns and any(c.name in _WINDOW_COLUMNS for c in g.find_all(exp.Column)):
                raise sql_error(g, "a group key cannot compute on the window columns")
            name = pre_column(g, "$k")
            if name not in keys:
                keys.append(name)
            key_text[_text(g)] = name
            if not tvf_columns and isinstance(g, exp.Column) and g.name in input_.windows:
                out_windows[name] = input_.windows[g.name]

        calls: list[AggCall] = []
        call_text: dict[str, str] = {}
        call_nodes: dict[str, exp.Expression] = {}
        for agg in self._aggregate_calls(select, having):
            text = _text(agg)
            if text not in call_text:
                output = f"$a{len(calls)}"
                calls.append(self._aggregate_call(agg, output, pre_column))
                call_text[text] = output
                call_nodes[output] = agg
        if not calls:
            # Grouping alone (SELECT k, window_start ... GROUP BY ...): COUNT(*) keeps the
            # operator's one aggregate; the select list does not show it.
            calls.append(AggCall("count_star", None, "$a0"))

        if not pre:
            # COUNT(*) over no keys still needs one column to read.
            first = input_.fields[0].name
            pre.append((first, field_column(first)))
        if window is not None:
            kind = window.kind.upper()
        elif operator_window is not None:  # the input's windows, grouped again
            kind = operator_window.kind.upper()
        else:
            kind = "GROUP BY"
        if window is not None and window.proctime:
            kind = f"processing-time {kind}"
        pre_node = self._calc(input_, pre, where, f"{kind} input")
        pre_types = {f.name: f.type for f in pre_node.fields}
        agg_fields = []
        for call in calls:
            arg_type = pre_types[call.column] if call.column is not None else None
            try:
                agg_fields.append(Field(call.output, operator_result_type(call, arg_type)))
            except SqlError as err:
                if err.line:
                    raise
                raise sql_error(call_nodes.get(call.output), err.reason) from None
        operator_types = {f.name: f.type for f in agg_fields}
        flink_types = {
            call.output: flink_result_type(call, pre_types.get(call.column or "")) for call in calls
        }
        aggregate: PlanNode
        if window is None and operator_window is None:
            aggregate = GroupAggregateNode(
                (pre_node,),
                (*(Field(k, pre_types[k]) for k in keys), *agg_fields),
                None,
                _short(f"{kind} aggregate: {_text(select)}"),
                spec=GroupAggregateSpec(
                    keys=tuple(keys),
                    aggs=tuple(calls),
                    updating_input=input_.updating,
                    mini_batch=self._mini_batch(select),
                    state_ttl_ms=self.options.state_ttl_ms,
                ),
                updating=True,
                unique_key=tuple(keys),
            )
        else:
            aggregate = self._window_aggregate_node(
                window,
                operator_window,
                keys,
                keys_of_group,
                calls,
                pre_node,
                pre_types,
                agg_fields,
                out_windows,
                f"{kind} aggregate: {_text(select)}",
            )
        return self._post_aggregate(
            select,
            aggregate,
            call_text,
            key_text,
            flink_types,
            operator_types,
            columns_scope,
            visible,
            having,
            tvf_columns=tvf_columns,
            rowtime_allowed=not (window is not None and window.proctime),
        )

    def _window_aggregate_node(
        self,
        window: _Window | None,
        operator_window: WindowTvf | None,
        keys: list[str],
        keys_of_group: list[exp.Expression],
        calls: list[AggCall],
        pre_node: PlanNode,
        pre_types: dict[str, SqlType],
        agg_fields: list[Field],
        out_windows: dict[str, tuple[str, WindowTvf]],
        label: str,
    ) -> PlanNode:
        """The window aggregate over ``pre_node``: SESSION windows (``operator_window``
        None) or TUMBLE/HOP/CUMULATE ones over event or processing time."""
        out_fields = (
            *(Field(k, pre_types[k]) for k in keys),
            Field("window_start", _TIMESTAMP),
            Field("window_end", _TIMESTAMP),
            *agg_fields,
        )
        spec: SliceWindowAggregateSpec | SessionAggregateSpec
        if operator_window is None:
            assert window is not None
            self._check_session_partition(window, keys_of_group)
            spec = SessionAggregateSpec(keys=tuple(keys), gap=window.gap, aggs=tuple(calls))
        else:
            spec = SliceWindowAggregateSpec(
                keys=tuple(keys),
                window=operator_window,
                aggs=tuple(calls),
                proctime=window is not None and window.proctime,
            )
        return WindowAggregateNode(
            (pre_node,), out_fields, None, _short(label), windows=out_windows, spec=spec
        )

    def _post_aggregate(
        self,
        select: exp.Select,
        aggregate: PlanNode,
        call_text: dict[str, str],
        key_text: dict[str, str],
        flink_types: dict[str, SqlType],
        operator_types: dict[str, SqlType],
        columns_scope: Scope,
        visible: tuple[Field, ...],
        having: exp.Having | None,
        *,
        tvf_columns: bool,
        rowtime_allowed: bool,
    ) -> PlanNode:
        """The select list and HAVING over an aggregate's output (a Calc): aggregate calls
        and group keys replaced by the aggregate's columns, ``window_time`` by
        ``window_end - 1``."""

        def substitute(node: exp.Expression) -> exp.Expression:
            def visit(n: exp.Expression) -> exp.Expression:
                text = _text(n)
                if text in call_text:
                    output = call_text[text]
                    ref: exp.Expression = field_column(output)
                    if flink_types[output] != operator_types[output]:
                        to = exp.DataType.build(flink_types[output].sql(), dialect=Flink)
                        ref = exp.Cast(this=ref, to=to)
                    return ref
                if text in key_text:
                    return field_column(key_text[text])
                if isinstance(n, exp.Column):
                    if tvf_columns and n.name == "window_time":
                        return exp.Sub(
                            this=field_column("window_end"),
                            expression=exp.Interval(
                                this=exp.Literal.string("1"), unit=exp.var("MILLISECOND")
                            ),
                        )
                    if tvf_columns and n.name in ("window_start", "window_end"):
                        return n
                    raise sql_error(
                        n,
                        f"column {n.name!r} is neither grouped nor aggregated: add it to GROUP BY "
                        "or aggregate it",
                    )
                return n

            return node.copy().transform(visit)

        items = self._select_list(select, columns_scope, visible, bind_items=False)
        projections = [(name, substitute(e)) for name, e in items]
        condition = substitute(having.this) if having is not None else None
        post = self._calc(aggregate, projections, condition, _text(select))
        if tvf_columns and rowtime_allowed:
            # window_time is an event-time attribute (a processing-time window's is not).
            post.rowtime = next(
                (n for n, e in items if isinstance(e, exp.Column) and e.name == "window_time"),
                None,
            )
        return post

    @staticmethod
    def _check_session_partition(window: _Window, keys: list[exp.Expression]) -> None:
        """A SESSION window aggregation cuts sessions per group key (Flink's): the TVF's
        PARTITION BY, when given, names the group keys."""
        if not window.partition:
            return
        partition = {p.name for p in window.partition}
        grouped = {k.name for k in keys if isinstance(k, exp.Column)}
        if partition != grouped or len(grouped) != len(keys):
            raise sql_error(
                window.tvf,
                "a SESSION window aggregation groups by the TVF's PARTITION BY columns "
                f"(PARTITION BY {', '.join(sorted(partition))}; GROUP BY "
                f"{', '.join(sorted(_text(k) for k in keys)) or 'only the window'}): sessions "
                "are cut per group",
            )

    def _aggregate_calls(
        self, select: exp.Select, having: exp.Having | None
    ) -> Iterator[exp.Expression]:
        for item in [*select.expressions, *([having] if having is not None else [])]:
            yield from aggregates_in(item)

    def _aggregate_call(
        self, agg: exp.Expression, output: str, add: Callable[[exp.Expression, str], str]
    ) -> AggCall:
        """The operator's call for ``agg``; ``add(node, prefix)`` names the input column
        that holds ``node`` (adding it to the Calc before the aggregation)."""
        filter_name = None
        if isinstance(agg, exp.Filter):
            condition = agg.expression.this
            filter_name = add(condition, "$f")
            agg = agg.this
        kind = AGGREGATES[type(agg)]  # type: ignore[index]  # one of AGGREGATES' types
        arg = agg.this
        distinct = False
        if isinstance(arg, exp.Distinct):
            if len(arg.expressions) != 1:
                raise sql_error(agg, "DISTINCT aggregates take one column")
            distinct = True
            arg = arg.expressions[0]
            if kind != "count":
                raise sql_error(
                    agg, f"{kind.upper()}(DISTINCT ...) is not supported; COUNT(DISTINCT ...) is"
                )
        if isinstance(arg, exp.Star):
            if kind != "count":
                raise sql_error(agg, f"{kind.upper()}(*) is not valid")
            return AggCall("count_star", None, output, filter=filter_name)
        if any(aggregates_in(arg)):
            raise sql_error(agg, "aggregates cannot be nested")
        column = add(arg, "$v")
        return AggCall(kind, column, output, distinct=distinct, filter=filter_name)

    # ------------------------------------------------------------------ UNION ALL

    def _plan_union(self, union: exp.Union) -> PlanNode:
        if union.args.get("distinct"):
            # UNION is SELECT DISTINCT over UNION ALL (an updating result).
            every = union.copy()
            every.set("distinct", False)
            return self._plan_distinct(
                exp.Select(
                    expressions=[exp.Star()],
                    from_=exp.From(this=_subquery(every, "__union")),
                    distinct=exp.Distinct(),
                )
            )
        inputs = [self.plan_query(union.this), self.plan_query(union.expression)]
        for node in inputs:
            _append_only(node, union, "UNION ALL")
        first = inputs[0].fields
        for other in inputs[1:]:
            if len(other.fields) != len(first):
                raise sql_error(
                    union, f"UNION ALL inputs have {len(first)} and {len(other.fields)} columns"
                )
        # Each column in the type all inputs convert to (Flink's least restrictive type).
        targets = []
        for i, f in enumerate(first):
            types = [node.fields[i].type for node in inputs]
            common = common_type(types)
            if common is None:
                raise sql_error(
                    union,
                    f"UNION ALL: column {i + 1} ({f.name}) has no common type for "
                    f"{', '.join(t.sql() for t in types)}",
                )
            targets.append(Field(f.name, common))
        first = tuple(targets)
        aligned = []
        for node in inputs:
            projections: list[tuple[str, exp.Expression]] = []
            for target, f in zip(first, node.fields, strict=True):
                ref: exp.Expression = field_column(f.name)
                if f.type.with_nullable(True) != target.type.with_nullable(True):
                    ref = exp.Cast(
                        this=ref, to=exp.DataType.build(target.type.sql(), dialect=Flink)
                    )
                projections.append((target.name, ref))
            aligned.append(self._calc(node, projections, None, "UNION ALL input"))
        rowtime = (
            inputs[0].rowtime if all(n.rowtime == inputs[0].rowtime for n in aligned) else None
        )
        return UnionNode(tuple(aligned), first, rowtime, "UNION ALL")


def _referenced_names(select: exp.Select) -> set[tuple[str, str]] | None:
    """Every column ``select`` writes as ``(qualifier or "", name)`` (its subqueries'
    included: a superset is safe), or None when it has a ``*`` (it reads every column).

    Example: ``_referenced_names(parse_one("SELECT a.x FROM a JOIN b ON a.k = k"))``
    is ``{("a", "x"), ("a", "k"), ("", "k")}``
    """
    if any(True for _ in select.find_all(exp.Star)):
        return None
    return {(c.table, c.name) for c in select.find_all(exp.Column)}


def _used_fields(
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


def _fusable(node: CalcNode) -> bool:
    """Whether a Calc's expressions may be copied into the Calc above it: no function
    calls that are UDFs (a copy could call a non-deterministic one twice) or
    ``PROCTIME()`` (the attribute it marks must stay a column)."""
    for _, expr in node.projections:
        if not isinstance(expr, exp.Column) and any(
            isinstance(f, exp.Anonymous) for f in expr.find_all(exp.Anonymous)
        ):
            return False
    return True


def _subquery(query: exp.Expression, alias: str) -> exp.Subquery:
    """``(query) AS alias``, for a query the planner writes around another."""
    return exp.Subquery(this=query, alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
