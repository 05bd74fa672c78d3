"""From a parsed query to a physical plan (:mod:`epochstream.sql.plan`), with Flink SQL's
append-only semantics.

Planned here (part 1, append-only): ``SELECT`` with projections and scalar expressions,
``WHERE``, subqueries in ``FROM``, ``WITH``, views, ``UNION ALL``, and window
aggregation over ``TABLE(TUMBLE|HOP|CUMULATE(...))`` grouped by ``window_start,
window_end`` and keys, with ``COUNT``/``COUNT(DISTINCT)``/``SUM``/``MIN``/``MAX``/
``AVG``, ``FILTER (WHERE ...)`` and ``HAVING``. Everything else is refused with the
position of the construct and the reason: a ``GROUP BY`` without a window produces
updates, which append-only sinks cannot take.

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

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from epochstream.exceptions import ConfigurationError, SqlError
from epochstream.sql.catalog import Catalog, TableDef, interval_ms
from epochstream.sql.connectors import sink_binding
from epochstream.sql.dialect import Flink, WindowTVF, node_position
from epochstream.sql.expressions import CalcProgram, Field
from epochstream.sql.types import SqlType, aggregate_result_type
from epochstream.core.arrow import TS

from epochstream.graph.specs import AggCall, SliceWindowAggregateSpec, WindowTvf
from epochstream.sql.plan import (
    CalcNode,
    PlanNode,
    ScanNode,
    SinkNode,
    StreamScanNode,
    UnionNode,
    WindowAggregateNode,
)

__all__ = ["Planner"]

_WINDOW_COLUMNS = ("window_start", "window_end", "window_time")
_AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}
_TIMESTAMP = SqlType.parse("TIMESTAMP(3)").with_nullable(False)


def _error(node: exp.Expression | None, message: str) -> SqlError:
    line, column = node_position(node)
    return SqlError(message, line=line, column=column)


def _text(node: exp.Expression) -> str:
    return node.sql(dialect=Flink)


@dataclass
class _Relation:
    """A planned input while a SELECT is bound: its plan and the name it is known by
    (a table name or alias; ``None`` for an unnamed subquery)."""

    node: PlanNode
    qualifier: str | None


@dataclass
class _Window:
    """The window TVF a SELECT reads (planned only with its aggregation)."""

    tvf: WindowTVF
    window: WindowTvf

    @property
    def kind(self) -> str:
        return self.window.kind


class Planner:
    """Plans queries against a :class:`Catalog` (one instance per statement).

    Example: ``Planner(catalog).plan_query(select)``
    """

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._ctes: list[dict[str, exp.Expression]] = []
        # Scans of the same table and columns are planned once (shared by a statement set).
        self._scans: dict[tuple[str, tuple[str, ...]], PlanNode] = {}

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
            raise _error(target, f"INSERT INTO {name}: no table {name!r} created with a connector")
        if insert.args.get("overwrite"):
            raise _error(target, "INSERT OVERWRITE is not supported (append-only sinks)")
        query = self.plan_query(insert.expression)
        wanted = list(columns) if columns is not None else [f.name for f in table.fields]
        unknown = [c for c in wanted if table.field(c) is None]
        if unknown:
            raise _error(target, f"table {name!r} has no column {unknown[0]!r}")
        if len(wanted) != len(query.fields):
            raise _error(
                insert.expression,
                f"INSERT INTO {name}: the query gives {len(query.fields)} columns, the table "
                f"takes {len(wanted)} ({', '.join(wanted)})",
            )
        projections = []
        for column, f in zip(wanted, query.fields, strict=True):
            declared = table.field(column)
            assert declared is not None
            ref: exp.Expression = exp.column(f.name, quoted=True)
            if declared.type.with_nullable(True) != f.type.with_nullable(True):
                ref = exp.Cast(this=ref, to=exp.DataType.build(declared.type.sql(), dialect=Flink))
            projections.append((column, ref))
        cast = self._calc(query, projections, None, f"INSERT INTO {name}")
        binding = sink_binding(table)
        return SinkNode(
            (cast,), cast.fields, None, f"sink: {name}", table=table, binding=binding
        )

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
            raise _error(query, f"{type(query).__name__.upper()} is not supported")
        raise _error(query, f"expected a query, got {type(query).__name__}")

    # ------------------------------------------------------------------ FROM

    def _lookup(self, table: exp.Table) -> PlanNode:
        name = table.name
        if table.args.get("db") or table.args.get("catalog"):
            raise _error(table, f"qualified table names are not supported: {_text(table)}")
        for scope in reversed(self._ctes):
            if name in scope:
                return self.plan_query(scope[name].copy())
        view = self.catalog.view(name)
        if view is not None:
            return self.plan_query(view)
        found = self.catalog.table(name)
        if found is None:
            known = ", ".join(self.catalog.names()) or "none"
            raise _error(table, f"unknown table {name!r} (tables and views: {known})")
        return self._scan(found)

    def _scan(self, table: TableDef) -> PlanNode:
        if table.stream is not None:
            return StreamScanNode(
                (), table.fields, table.rowtime, f"table: {table.name}", table=table
            )
        # Every declared column; the Calc above drops the ones not used, and the scan
        # is narrowed to the referenced ones when the plan is finished (_narrow).
        columns = tuple(f.name for f in table.fields if f.name != table.proctime)
        return ScanNode(
            (),
            tuple(f for f in table.fields if f.name in columns),
            table.rowtime,
            f"source: {table.name}",
            table=table,
            columns=columns,
        )

    def _from(self, select: exp.Select) -> tuple[_Relation, _Window | None]:
        from_ = select.args.get("from_")
        if from_ is None:
            raise _error(select, "SELECT without FROM is not supported (a stream needs a source)")
        if select.args.get("joins"):
            join = select.args["joins"][0]
            raise _error(
                join,
                "joins are not supported yet (window, interval and regular joins are planned "
                "for a later release)",
            )
        source = from_.this
        if isinstance(source, WindowTVF):
            window = self._window(source)
            input_ = self._lookup(source.args["table"])
            timecol = source.args["timecol"].name
            if input_.rowtime is None or timecol != input_.rowtime:
                raise _error(
                    source.args["timecol"],
                    f"{window.kind.upper()}: DESCRIPTOR({timecol}) must name the input's event-time "
                    f"attribute (a column with a WATERMARK; the input's is "
                    f"{input_.rowtime or 'none'})",
                )
            return _Relation(input_, source.alias or None), window
        if isinstance(source, exp.Table):
            node = self._lookup(source)
            return _Relation(node, source.alias_or_name), None
        if isinstance(source, exp.Subquery):
            return _Relation(self.plan_query(source.this), source.alias or None), None
        raise _error(source, f"unsupported FROM item {type(source).__name__}")

    def _window(self, tvf: WindowTVF) -> _Window:
        kind = tvf.kind.lower()
        if kind == "session":
            raise _error(tvf, "SESSION windows in SQL are not supported yet")
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
            raise _error(tvf, f"{kind.upper()}: {err}") from None
        return _Window(tvf, window)

    # ------------------------------------------------------------------ binding

    def _bind(self, node: exp.Expression, relation: _Relation, fields: tuple[Field, ...]) -> None:
        """Rewrite every column of ``node`` to a field name of ``fields`` (qualifiers
        checked against the relation's name, then dropped)."""
        names = {f.name for f in fields}
        for column in list(node.find_all(exp.Column)):
            if isinstance(column.this, exp.Star):
                continue
            qualifier = column.table
            if qualifier and relation.qualifier is not None and qualifier != relation.qualifier:
                raise _error(column, f"unknown table alias {qualifier!r} in {_text(column)}")
            if column.name not in names:
                raise _error(
                    column,
                    f"unknown column {column.name!r} (columns: {', '.join(sorted(names))})",
                )
            column.set("table", None)

    def _select_list(self, select: exp.Select, fields: tuple[Field, ...]) -> list[tuple[str, exp.Expression]]:
        """``(output name, expression)`` per select item, ``*`` expanded."""
        out: list[tuple[str, exp.Expression]] = []
        for i, item in enumerate(select.expressions):
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                out.extend((f.name, exp.column(f.name, quoted=True)) for f in fields)
                continue
            if isinstance(item, exp.Alias):
                out.append((item.alias, item.this))
            elif isinstance(item, exp.Column):
                out.append((item.name, item))
            else:
                out.append((f"EXPR${i}", item))
        names = [n for n, _ in out]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise _error(select, f"the select list names {duplicate!r} twice; give one an alias")
        if not out:
            raise _error(select, "empty select list")
        return out

    # ------------------------------------------------------------------ SELECT

    def _plan_select(self, select: exp.Select) -> PlanNode:
        for arg, what in (
            ("order", "ORDER BY"),
            ("limit", "LIMIT"),
            ("offset", "OFFSET"),
            ("qualify", "QUALIFY"),
            ("windows", "WINDOW"),
        ):
            if select.args.get(arg):
                raise _error(select.args[arg], f"{what} is not supported on an unbounded stream")
        if select.args.get("distinct"):
            raise _error(
                select,
                "SELECT DISTINCT produces updates (an append-only result cannot take back a "
                "row); group by a window instead",
            )
        relation, window = self._from(select)
        input_ = relation.node
        over = next(select.find_all(exp.Window), None)
        if over is not None:
            raise _error(over, "OVER windows and ROW_NUMBER are not supported yet")
        has_aggregates = any(_aggregates_in(item) for item in select.expressions)
        grouped = select.args.get("group") is not None or has_aggregates
        if not grouped:
            if window is not None:
                raise _error(
                    window.tvf,
                    f"a {window.kind.upper()} window without GROUP BY window_start, window_end "
                    "is not supported yet",
                )
            if select.args.get("having"):
                raise _error(select.args["having"], "HAVING needs a GROUP BY")
            for item in select.expressions:
                self._bind(item, relation, input_.fields)
            where = select.args.get("where")
            condition = None
            if where is not None:
                self._bind(where, relation, input_.fields)
                condition = where.this
            projections = self._select_list(select, input_.fields)
            return self._calc(input_, projections, condition, _text(select))
        if window is None:
            group = select.args.get("group")
            raise _error(
                group if group is not None else select,
                "GROUP BY without a window TVF produces updates (each new row changes its "
                "group's result), which append-only results cannot take; group by "
                "window_start, window_end of a TUMBLE, HOP or CUMULATE window",
            )
        return self._plan_window_aggregate(select, relation, window)

    def _calc(
        self,
        input_: PlanNode,
        projections: list[tuple[str, exp.Expression]],
        condition: exp.Expression | None,
        label: str,
    ) -> PlanNode:
        """A Calc over ``input_``, or ``input_`` itself when it would change nothing."""
        names = [f.name for f in input_.fields]
        identity = condition is None and [n for n, _ in projections] == names and all(
            isinstance(e, exp.Column) and e.name == n for n, e in projections
        )
        if identity:
            return input_
        program = CalcProgram.compile(
            projections, condition, input_.fields, self.catalog.functions, keep=(TS,)
        )
        rowtime = None
        for name, expr in projections:
            if input_.rowtime is not None and isinstance(expr, exp.Column) and expr.name == input_.rowtime:
                rowtime = name
                break
        text = ", ".join(
            _text(e) if isinstance(e, exp.Column) and e.name == n else f"{_text(e)} AS {n}"
            for n, e in projections
        )
        if condition is not None:
            text += f" WHERE {_text(condition)}"
        return CalcNode(
            (input_,), program.output_fields, rowtime, _short(label), program=program, text=text
        )

    # ------------------------------------------------------------------ window aggregation

    def _plan_window_aggregate(
        self, select: exp.Select, relation: _Relation, window: _Window
    ) -> PlanNode:
        input_ = relation.node
        window_fields = (
            Field("window_start", _TIMESTAMP),
            Field("window_end", _TIMESTAMP),
            Field("window_time", _TIMESTAMP),
        )
        visible = (*input_.fields, *window_fields)
        group = select.args.get("group")
        group_items = list(group.expressions) if group is not None else []
        for item in [*group_items, *select.expressions]:
            self._bind(item, relation, visible)
        having = select.args.get("having")
        if having is not None:
            self._bind(having, relation, visible)
        where = select.args.get("where")
        if where is not None:
            self._bind(where, relation, input_.fields)
            if any(c.name in _WINDOW_COLUMNS for c in where.find_all(exp.Column)):
                raise _error(where, "WHERE cannot use the window columns before aggregation")

        # Group items: window_start and window_end (required), the rest are keys.
        window_items = {_text(g) for g in group_items if isinstance(g, exp.Column) and g.name in _WINDOW_COLUMNS}
        if not {"window_start", "window_end"} <= {n.strip('"`') for n in window_items}:
            raise _error(
                group if group is not None else select,
                f"a {window.kind.upper()} window aggregation groups by window_start and "
                "window_end (Flink's window aggregation); without them the result would be "
                "updating",
            )
        pre: list[tuple[str, exp.Expression]] = []
        pre_names: dict[str, str] = {}  # expression text -> pre-Calc column

        def pre_column(node: exp.Expression, prefix: str) -> str:
            text = _text(node)
            if text not in pre_names:
                name = node.name if isinstance(node, exp.Column) and node.name not in pre_names.values() else f"{prefix}{len(pre)}"
                pre.append((name, node))
                pre_names[text] = name
            return pre_names[text]

        keys: list[str] = []
        key_text: dict[str, str] = {}
        for g in group_items:
            if isinstance(g, exp.Column) and g.name in _WINDOW_COLUMNS:
                if g.name == "window_time":
                    raise _error(g, "group by window_start, window_end (window_time follows from them)")
                continue
            if any(c.name in _WINDOW_COLUMNS for c in g.find_all(exp.Column)):
                raise _error(g, "a group key cannot compute on the window columns")
            name = pre_column(g, "$k")
            if name not in keys:
                keys.append(name)
            key_text[_text(g)] = name

        calls: list[AggCall] = []
        call_text: dict[str, str] = {}
        for agg in self._aggregate_calls(select, having):
            text = _text(agg)
            if text in call_text:
                continue
            output = f"$a{len(calls)}"
            calls.append(self._aggregate_call(agg, output, pre_column))
            call_text[text] = output

        pre_program_input = input_
        if where is None and all(isinstance(e, exp.Column) and e.name == n for n, e in pre):
            # Plain columns only: the operator reads them from the input as they are.
            pre_node = self._calc(
                pre_program_input,
                [(n, e) for n, e in pre] or [(input_.fields[0].name, exp.column(input_.fields[0].name, quoted=True))],
                None,
                f"{window.kind.upper()} input",
            )
        else:
            pre_node = self._calc(
                pre_program_input,
                pre or [(input_.fields[0].name, exp.column(input_.fields[0].name, quoted=True))],
                where.this if where is not None else None,
                f"{window.kind.upper()} input",
            )
        pre_types = {f.name: f.type for f in pre_node.fields}
        agg_fields = []
        for call in calls:
            arg_type = pre_types[call.column] if call.column is not None else None
            agg_fields.append(Field(call.output, _operator_result_type(call, arg_type)))
        operator_types = {f.name: f.type for f in agg_fields}
        flink_types = {
            call.output: _flink_result_type(call, pre_types.get(call.column or ""))
            for call in calls
        }
        out_fields = (
            *(Field(k, pre_types[k]) for k in keys),
            Field("window_start", _TIMESTAMP),
            Field("window_end", _TIMESTAMP),
            *agg_fields,
        )
        aggregate = WindowAggregateNode(
            (pre_node,),
            out_fields,
            None,
            _short(f"{window.kind.upper()} aggregate: {_text(select)}"),
            spec=SliceWindowAggregateSpec(keys=tuple(keys), window=window.window, aggs=tuple(calls)),
        )

        # The select list and HAVING over the aggregate's output.
        def substitute(node: exp.Expression) -> exp.Expression:
            def visit(n: exp.Expression) -> exp.Expression:
                text = _text(n)
                if text in call_text:
                    output = call_text[text]
                    ref: exp.Expression = exp.column(output, quoted=True)
                    if flink_types[output] != operator_types[output]:
                        to = exp.DataType.build(flink_types[output].sql(), dialect=Flink)
                        ref = exp.Cast(this=ref, to=to)
                    return ref
                if text in key_text:
                    return exp.column(key_text[text], quoted=True)
                if isinstance(n, exp.Column):
                    if n.name == "window_time":
                        return exp.Sub(
                            this=exp.column("window_end", quoted=True),
                            expression=exp.Interval(this=exp.Literal.string("1"), unit=exp.var("MILLISECOND")),
                        )
                    if n.name in ("window_start", "window_end"):
                        return n
                    raise _error(
                        n,
                        f"column {n.name!r} is neither grouped nor aggregated: add it to GROUP BY "
                        "or aggregate it",
                    )
                return n

            return node.copy().transform(visit)

        projections = [(name, substitute(e)) for name, e in self._select_list(select, visible)]
        condition = substitute(having.this) if having is not None else None
        post = self._calc(aggregate, projections, condition, _text(select))
        rowtime = next(
            (name for name, e in self._select_list(select, visible) if isinstance(e, exp.Column) and e.name == "window_time"),
            None,
        )
        post.rowtime = rowtime
        return post

    def _aggregate_calls(self, select: exp.Select, having: exp.Having | None) -> Iterator[exp.Expression]:
        for item in [*select.expressions, *([having] if having is not None else [])]:
            yield from _aggregates_in(item)

    def _aggregate_call(self, agg: exp.Expression, output: str, pre_column: object) -> AggCall:
        add = pre_column  # (node, prefix) -> column name of the pre-Calc
        filter_name = None
        if isinstance(agg, exp.Filter):
            condition = agg.expression.this
            filter_name = add(condition, "$f")  # type: ignore[operator]
            agg = agg.this
        kind = _AGGREGATES[type(agg)]
        arg = agg.this
        distinct = False
        if isinstance(arg, exp.Distinct):
            if len(arg.expressions) != 1:
                raise _error(agg, "DISTINCT aggregates take one column")
            distinct = True
            arg = arg.expressions[0]
            if kind != "count":
                raise _error(agg, f"{kind.upper()}(DISTINCT ...) is not supported; COUNT(DISTINCT ...) is")
        if isinstance(arg, exp.Star):
            if kind != "count":
                raise _error(agg, f"{kind.upper()}(*) is not valid")
            return AggCall("count_star", None, output, filter=filter_name)
        if any(_aggregates_in(arg)):
            raise _error(agg, "aggregates cannot be nested")
        column = add(arg, "$v")  # type: ignore[operator]
        return AggCall(kind, column, output, distinct=distinct, filter=filter_name)

    # ------------------------------------------------------------------ UNION ALL

    def _plan_union(self, union: exp.Union) -> PlanNode:
        if union.args.get("distinct"):
            raise _error(union, "UNION without ALL removes duplicates, which produces updates; use UNION ALL")
        inputs = [self.plan_query(union.this), self.plan_query(union.expression)]
        first = inputs[0].fields
        for other in inputs[1:]:
            if len(other.fields) != len(first):
                raise _error(union, f"UNION ALL inputs have {len(first)} and {len(other.fields)} columns")
        aligned = []
        for node in inputs:
            projections: list[tuple[str, exp.Expression]] = []
            for target, f in zip(first, node.fields, strict=True):
                ref: exp.Expression = exp.column(f.name, quoted=True)
                if f.type != target.type:
                    ref = exp.Cast(this=ref, to=exp.DataType.build(target.type.sql(), dialect=Flink))
                projections.append((target.name, ref))
            aligned.append(self._calc(node, projections, None, "UNION ALL input"))
        rowtime = inputs[0].rowtime if all(n.rowtime == inputs[0].rowtime for n in aligned) else None
        return UnionNode(tuple(aligned), first, rowtime, "UNION ALL")


def _flink_result_type(call: AggCall, arg_type: SqlType | None) -> SqlType:
    """Flink's result type of ``call`` (``COUNT`` is ``BIGINT NOT NULL``, ``SUM(INT)``
    is ``INT``, ...)."""
    kind = "COUNT" if call.kind in ("count", "count_star") else call.kind.upper()
    return aggregate_result_type(kind, None if kind == "COUNT" else arg_type)


def _operator_result_type(call: AggCall, arg_type: SqlType | None) -> SqlType:
    """The type the window aggregate operator emits for ``call``: Flink's result type,
    except that SUM and AVG of the integer types below BIGINT come out as BIGINT (the
    operator accumulates in int64); the Calc after the operator casts them back."""
    result = _flink_result_type(call, arg_type)
    if call.kind in ("sum", "avg") and result.name in ("TINYINT", "SMALLINT", "INT"):
        return SqlType("BIGINT")
    return result


def _aggregates_in(node: exp.Expression) -> list[exp.Expression]:
    """The outermost aggregate calls in ``node`` (a ``FILTER`` with its aggregate)."""
    found: list[exp.Expression] = []
    kinds = tuple(_AGGREGATES)

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


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
