"""From a parsed query to a physical plan (:mod:`epochstream.sql.plan`), with Flink SQL's
semantics: append-only results, and updating ones (changelogs) where Flink has them.

The :class:`Planner` walks statements and SELECTs: projections and scalar expressions,
``WHERE``, subqueries in ``FROM``, ``WITH``, views, ``UNION [ALL]``, ``SELECT
DISTINCT``, window TVFs, Top-N and deduplication (``ROW_NUMBER``), and the sinks'
changelog checks. Concepts with their own rules are planned in their own modules:
joins in :mod:`epochstream.sql.join_planning`, window and ``GROUP BY`` aggregations in
:mod:`epochstream.sql.aggregate_planning`, OVER aggregations in
:mod:`epochstream.sql.over`. What is not supported is refused with the position of the
construct and the reason.

Example::

    planner = Planner(catalog)
    node = planner.plan_query(parse_script("SELECT auction, price FROM bid")[0])
"""

from __future__ import annotations

from sqlglot import exp

from epochstream.core.arrow import TS
from epochstream.core.changelog import OP
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import (
    WindowTvf,
)
from epochstream.sql.aggregate_planning import (
    WINDOW_COLUMN_TYPE,
    WINDOW_COLUMNS,
    TvfWindow,
    plan_aggregate,
)
from epochstream.sql.aggregates import (
    aggregates_in,
)
from epochstream.sql.catalog import Catalog, TableDef, interval_ms
from epochstream.sql.conditions import (
    and_,
    rank_limit,
)
from epochstream.sql.connectors import SinkBinding, sink_binding, source_binding
from epochstream.sql.dialect import Flink, WindowTVF, shortened, sql_error, sql_text
from epochstream.sql.expressions import CalcProgram, Field
from epochstream.sql.join_planning import plan_join
from epochstream.sql.options import SqlOptions
from epochstream.sql.over import inline_named_windows, over_calls, plan_over, refuse_updating_over
from epochstream.sql.plan import (
    CalcNode,
    PlanNode,
    ScanNode,
    SinkNode,
    StreamScanNode,
    TopNNode,
    UnionNode,
    WindowAssignNode,
    WindowTopNNode,
    require_append_only,
)
from epochstream.sql.rewrites import legacy_group_window
from epochstream.sql.scope import Scope, bind, field_column
from epochstream.sql.types import SqlType, common_type

__all__ = ["Planner"]


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
        self.item_names: dict[int, list[str]] = {}

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
        cast = self.calc(query, projections, None, f"INSERT INTO {name}")
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
            raise sql_error(table, f"qualified table names are not supported: {sql_text(table)}")
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
        return self.calc(scan, projections, None, f"{table.name}: PROCTIME()")

    def _from(
        self, select: exp.Select
    ) -> tuple[PlanNode, Scope, TvfWindow | None, exp.Expression | None]:
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
        node, scope, window = self.from_item(from_.this)
        joins = select.args.get("joins") or []
        if joins and window is not None:
            raise sql_error(
                window.tvf,
                "a window TVF joined with another table is not supported yet; aggregate each "
                "side by window first (window join)",
            )
        referenced = _referenced_names(select) if joins else None
        for join in joins:
            node, scope, condition = plan_join(self, node, scope, join, condition, referenced)
        return node, scope, window, condition

    def from_item(self, source: exp.Expression) -> tuple[PlanNode, Scope, TvfWindow | None]:
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
                    f"{sql_text(source.args['version'])}: temporal and lookup joins are not "
                    "supported yet",
                )
            node = self._lookup(source)
            return node, Scope.of(source.alias_or_name, node.fields), None
        if isinstance(source, exp.Subquery):
            node = self.plan_query(source.this)
            return node, Scope.of(source.alias or None, node.fields), None
        raise sql_error(source, f"unsupported FROM item {type(source).__name__}")

    # ------------------------------------------------------------------ joins

    def _window(self, tvf: WindowTVF) -> TvfWindow:
        kind = tvf.kind.lower()
        if kind == "session":
            gap = interval_ms(tvf.args["gap"])
            if gap <= 0:
                raise sql_error(tvf, "SESSION: the gap must be positive")
            return TvfWindow(tvf, None, gap, tuple(tvf.args.get("partition_by") or ()))
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
        return TvfWindow(tvf, window)

    # ------------------------------------------------------------------ binding

    def select_list(
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
        names_before = self.item_names.get(id(select)) or [
            e.name if isinstance(e, exp.Column) else "" for e in select.expressions
        ]
        for i, item in enumerate(select.expressions):
            if isinstance(item, exp.Star):
                out.extend((f.name, field_column(f.name)) for f in fields)
                continue
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                columns = next((c for q, c in scope.items if q == item.table), None)
                if columns is None:
                    raise sql_error(item, f"unknown table alias {item.table!r} in {sql_text(item)}")
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
            projections = self.select_list(select, scope, input_.fields)
            if where is not None:
                bind(where, scope)
            return self.calc(input_, projections, where, sql_text(select))
        return plan_aggregate(self, select, input_, scope, window, where)

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
        self, input_: PlanNode, scope: Scope, window: TvfWindow
    ) -> tuple[PlanNode, Scope]:
        """A window TVF read without aggregation: its rows with their windows' columns
        (``SELECT * FROM TABLE(TUMBLE(...))``, a Top-N or join input)."""
        if window.window is None or window.proctime:
            raise sql_error(
                window.tvf,
                f"a {'SESSION' if window.window is None else 'processing-time'} window TVF "
                "without GROUP BY window_start, window_end is not supported yet",
            )
        require_append_only(input_, window.tvf, "a window TVF")
        taken = [c for c in WINDOW_COLUMNS if c in {f.name for f in input_.fields}]
        if taken:
            raise sql_error(window.tvf, f"the window TVF's input already has a column {taken[0]!r}")
        node = WindowAssignNode(
            (input_,),
            (*input_.fields, *(Field(c, WINDOW_COLUMN_TYPE) for c in WINDOW_COLUMNS)),
            input_.rowtime,
            shortened(f"{window.kind.upper()} windows"),
            windows={
                "window_start": ("start", window.window),
                "window_end": ("end", window.window),
            },
            window=window.window,
        )
        return node, scope.with_columns(WINDOW_COLUMNS)

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
        require_append_only(ranked_input, over, "a window Top-N" if windowed else "a Top-N")
        fields = ranked_input.fields
        if keeps_rank:
            fields = (*fields, Field(rank, SqlType.parse("BIGINT").with_nullable(False)))
        node: PlanNode
        if windowed:
            node = WindowTopNNode(
                (ranked_input,),
                fields,
                None,
                shortened(f"window top {limit}: {sql_text(over)}"),
                windows=dict(ranked_input.windows),
                partition=tuple(c for c in partition if c not in (roles["start"], roles["end"])),
                order=order,
                n=limit,
                rank_column=rank if keeps_rank else None,
                window_columns=(roles["start"], roles["end"]),
            )
        else:
            # An updating ranking (Flink's Top-N): unique by partition and row number,
            # or by the partition alone when it keeps one row. Keeping the first row by
            # processing time is keeping the first to arrive, which no later row
            # displaces: insert-only (Flink's ProcTimeDeduplicateKeepFirstRowFunction).
            by_arrival = (
                limit == 1
                and not keeps_rank
                and len(order) == 1
                and order[0][0] == ranked_input.proctime
                and not order[0][1]
            )
            unique: tuple[str, ...] | None = None
            if keeps_rank:
                unique = (*partition, rank)
            elif limit == 1:
                unique = tuple(partition)
            node = TopNNode(
                (ranked_input,),
                fields,
                None,
                shortened(f"top {limit}: {sql_text(over)}"),
                partition=tuple(partition),
                order=() if by_arrival else order,
                n=limit,
                rank_column=rank if keeps_rank else None,
                state_ttl_ms=self.options.state_ttl_ms,
                updating=not by_arrival,
                unique_key=None if by_arrival else unique,
            )
        outer = select.copy()
        outer.set("from_", exp.From(this=exp.Table(this=exp.to_identifier("__top_n"))))
        outer.set("where", exp.Where(this=rest) if rest is not None else None)
        scope = Scope.of(inner.alias or None, node.fields)
        if over_calls(outer):  # an OVER aggregation over the (window) Top-N
            return plan_over(self, outer, node, scope, rest)
        projections = self.select_list(outer, scope, node.fields)
        condition = None
        if rest is not None:
            condition = outer.args["where"].this
            bind(condition, scope)
        return self.calc(node, projections, condition, sql_text(select))

    def calc(
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
            sql_text(e) if isinstance(e, exp.Column) and e.name == n else f"{sql_text(e)} AS {n}"
            for n, e in projections
        )
        if condition is not None:
            text += f" WHERE {sql_text(condition)}"
        return CalcNode(
            (input_,),
            program.output_fields,
            rowtime,
            shortened(label),
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
        fused = self.calc(below.inputs[0], merged, and_(conditions) if conditions else None, label)
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

    def _plan_union(self, union: exp.Union) -> PlanNode:
        if union.args.get("distinct"):
            # UNION is SELECT DISTINCT over UNION ALL (an updating result).
            for side in (union.this, union.expression):
                require_append_only(self.plan_query(side.copy()), union, "UNION")
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
            require_append_only(node, union, "UNION ALL")
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
            aligned.append(self.calc(node, projections, None, "UNION ALL input"))
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
