"""OVER aggregations in a SELECT list (Flink's ``StreamPhysicalOverAggregate``):
``agg(x) OVER (PARTITION BY k ORDER BY rowtime ROWS|RANGE BETWEEN ... PRECEDING AND
CURRENT ROW)``, every input row once with its aggregates appended.

What Flink refuses is refused here, with the position: OVER over an updating input,
windows that differ within one SELECT, an ORDER BY other than the input's event-time
or processing-time attribute ascending, FOLLOWING bounds, aggregates other than COUNT/SUM/AVG/MIN/MAX
(``ROW_NUMBER`` only as a Top-N). A named window (``WINDOW w AS (...)``) is inlined
first (:func:`inline_named_windows`).

Planned as: a Calc computing the partition keys and aggregate arguments that are not
plain columns (with the input's columns the query reads passed through, and WHERE), the OVER aggregate
operator keyed by the partition keys, and a Calc for the select list with each OVER
call replaced by its column.

Example::

    node = plan_over(planner, select, input_, scope, where)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.graph.specs import AggCall, OverAggregateSpec
from epochstream.sql.aggregates import (
    AGGREGATES,
    aggregates_in,
    flink_result_type,
    operator_result_type,
)
from epochstream.sql.catalog import interval_ms
from epochstream.sql.dialect import Flink, sql_error, sql_text
from epochstream.sql.expressions import Field
from epochstream.sql.plan import OverAggregateNode, PlanNode
from epochstream.sql.scope import Scope, bind, field_column

if TYPE_CHECKING:
    from epochstream.sql.planner import Planner

__all__ = ["inline_named_windows", "over_calls", "plan_over", "refuse_updating_over"]


def over_calls(select: exp.Select) -> list[exp.Window]:
    """The OVER calls of ``select``'s list (not of its subqueries)."""
    return [w for item in select.expressions for w in item.find_all(exp.Window)]


def refuse_updating_over(over: exp.Expression, what: str) -> None:
    """Refuse an OVER aggregation (at ``over``) over an updating input (``what``)."""
    raise sql_error(
        over,
        f"an OVER aggregation over an updating input ({what}) is not supported: Flink's "
        "OVER aggregation takes append-only input only",
    )


def inline_named_windows(select: exp.Select) -> exp.Select:
    """``select`` with each ``OVER w`` replaced by the definition in its ``WINDOW w AS
    (...)`` clause (and the clause dropped); ``select`` itself when it has none."""
    named = select.args.get("windows")
    if not named:
        return select
    definitions = {w.this.name: w for w in named}
    select = select.copy()
    for over in over_calls(select):
        name = over.args.get("alias")
        if name is None:
            continue
        definition = definitions.get(name.name)
        if definition is None:
            raise sql_error(
                over, f"unknown window {name.name!r} (WINDOW defines {', '.join(definitions)})"
            )
        for arg in ("partition_by", "order", "spec"):
            if over.args.get(arg):
                raise sql_error(
                    over, f"OVER {name.name} cannot add to the named window; define it whole"
                )
            value = definition.args.get(arg)
            over.set(
                arg,
                value.copy()
                if isinstance(value, exp.Expression)
                else value and [v.copy() for v in value],
            )
        over.set("alias", None)
    select.set("windows", None)
    return select


def _frame(over: exp.Window) -> tuple[str, int | None]:
    """``(frame, preceding)`` of an OVER window (no frame with ORDER BY: RANGE UNBOUNDED
    PRECEDING, as in Flink)."""
    spec = over.args.get("spec")
    if spec is None:
        return "range", None
    kind = str(spec.args.get("kind") or "").lower()
    end = spec.args.get("end")  # None: the short form (ROWS 10 PRECEDING)
    if spec.args.get("end_side") or (end is not None and str(end).upper() != "CURRENT ROW"):
        raise sql_error(
            spec,
            "an OVER frame ends at CURRENT ROW (Flink's streaming OVER aggregation takes no "
            "other end: a FOLLOWING bound would hold rows back for later ones)",
        )
    if spec.args.get("exclude"):
        raise sql_error(spec, "EXCLUDE in an OVER frame is not supported")
    start = spec.args.get("start")
    if (
        str(spec.args.get("start_side") or "").upper() != "PRECEDING"
        and str(start).upper() != "CURRENT ROW"
    ):
        raise sql_error(spec, "an OVER frame starts at a PRECEDING bound or CURRENT ROW")
    if str(start).upper() == "UNBOUNDED":
        return kind, None
    if str(start).upper() == "CURRENT ROW":
        return kind, 0
    if kind == "rows":
        if not (isinstance(start, exp.Literal) and not start.is_string and start.this.isdigit()):
            raise sql_error(spec, "ROWS BETWEEN n PRECEDING takes a whole number of rows")
        return kind, int(start.this)
    if not isinstance(start, exp.Interval):
        raise sql_error(
            spec,
            "RANGE BETWEEN ... PRECEDING over a time attribute takes an INTERVAL (e.g. "
            "INTERVAL '10' SECOND)",
        )
    return kind, interval_ms(start)


def _check_order(over: exp.Window, input_: PlanNode) -> bool:
    """An OVER window orders by the input's event-time or processing-time attribute,
    ascending; whether by processing time."""
    order_node = over.args.get("order")
    orders = order_node.expressions if order_node is not None else []
    if len(orders) != 1:
        raise sql_error(
            order_node or over,
            "an OVER window orders by one column, the input's time attribute (ORDER BY "
            f"{input_.rowtime or 'rowtime'})",
        )
    ordered = orders[0]
    time = ordered.this
    name = time.name if isinstance(time, exp.Column) else None
    if name is None or name not in (input_.rowtime, input_.proctime):
        raise sql_error(
            time,
            "OVER windows' ordering in stream mode must be defined on a time attribute (the "
            f"input's are {input_.rowtime or 'no event time'} and "
            f"{input_.proctime or 'no processing time'})",
        )
    if ordered.args.get("desc"):
        raise sql_error(ordered, "an OVER window orders by its time attribute ascending, not DESC")
    return name == input_.proctime


def _shape(over: exp.Window) -> str:
    """What must be equal across a SELECT's OVER calls: partition, order, frame."""
    parts = [sql_text(p) for p in over.args.get("partition_by") or []]
    order = over.args.get("order")
    spec = over.args.get("spec")
    return "|".join(
        [
            ",".join(parts),
            sql_text(order) if order is not None else "",
            sql_text(spec) if spec else "",
        ]
    )


def plan_over(
    planner: Planner,
    select: exp.Select,
    input_: PlanNode,
    scope: Scope,
    where: exp.Expression | None,
) -> PlanNode:
    """The OVER aggregation of ``select`` over its planned FROM (``input_``, names in
    ``scope``, ``where`` left to apply)."""
    calls_at = over_calls(select)
    first = calls_at[0]
    if input_.updating:
        refuse_updating_over(first, "the changelog of a GROUP BY without a window or a Top-N")
    if select.args.get("group") is not None or select.args.get("having") is not None:
        raise sql_error(select, "OVER aggregates with GROUP BY or HAVING are not supported")
    for item in select.expressions:
        plain = [a for a in aggregates_in(item) if not isinstance(a.parent, exp.Window)]
        if plain:
            raise sql_error(plain[0], f"{sql_text(plain[0])} without OVER beside OVER aggregates")
    for over in calls_at[1:]:
        if _shape(over) != _shape(first):
            raise sql_error(
                over,
                "all OVER aggregates of a SELECT must be computed on the same window (Flink's "
                "rule); compute the others in another query",
            )
    for over in calls_at:
        agg = over.this
        if isinstance(agg, exp.RowNumber):
            raise sql_error(
                over,
                "ROW_NUMBER() OVER is a Top-N: keep its first N rows in an enclosing query (WHERE rn "
                "at most N)",
            )
        if type(agg) not in AGGREGATES:
            raise sql_error(
                over, f"{sql_text(agg)} OVER is not supported (COUNT, SUM, AVG, MIN, MAX are)"
            )
        if isinstance(agg.this, exp.Distinct):
            raise sql_error(over, "DISTINCT in an OVER aggregate is not supported")
    select = select.copy()
    planner.item_names[id(select)] = [
        e.name if isinstance(e, exp.Column) else "" for e in select.expressions
    ]
    for item in select.expressions:
        bind(item, scope)
    if where is not None:
        bind(where, scope)
    calls_at = over_calls(select)
    first = calls_at[0]
    proctime = _check_order(first, input_)
    frame, preceding = _frame(first)

    # The input's columns the query reads (all for a *) pass through the operator.
    read = {c.name for item in select.expressions for c in item.find_all(exp.Column)}
    star = any(isinstance(item, exp.Star) for item in select.expressions)
    time_attributes = (input_.rowtime, input_.proctime)
    kept = [f for f in input_.fields if star or f.name in read or f.name in time_attributes]
    pre: list[tuple[str, exp.Expression]] = [(f.name, field_column(f.name)) for f in kept]
    names = {f.name for f in kept}

    def pre_column(node: exp.Expression, prefix: str) -> str:
        if isinstance(node, exp.Column) and node.name in names:
            return node.name
        name = f"{prefix}{len(pre)}"
        pre.append((name, node))
        names.add(name)
        return name

    partition = [pre_column(p, "$p") for p in first.args.get("partition_by") or []]
    calls: list[AggCall] = []
    call_text: dict[str, str] = {}
    call_nodes: dict[str, exp.Expression] = {}
    for over in calls_at:
        text = sql_text(over)
        if text in call_text:
            continue
        agg = over.this
        output = f"$o{len(calls)}"
        if isinstance(agg.this, exp.Star):
            call = AggCall("count_star", None, output)
        else:
            call = AggCall(AGGREGATES[type(agg)], pre_column(agg.this, "$v"), output)
        calls.append(call)
        call_text[text] = output
        call_nodes[output] = over
    pre_node = planner.calc(input_, pre, where, "OVER input")
    pre_types = {f.name: f.type for f in pre_node.fields}
    agg_fields = []
    flink_types = {}
    for call in calls:
        arg_type = pre_types[call.column] if call.column is not None else None
        if call.kind in ("sum", "avg") and arg_type is not None and arg_type.name == "DECIMAL":
            raise sql_error(
                call_nodes[call.output],
                f"{call.kind.upper()} of a DECIMAL over an OVER window is not supported yet; "
                "CAST the argument to DOUBLE (or to BIGINT for whole numbers)",
            )
        try:
            agg_fields.append(Field(call.output, operator_result_type(call, arg_type)))
        except SqlError as err:
            if err.line:
                raise
            raise sql_error(call_nodes[call.output], err.reason) from None
        flink_types[call.output] = flink_result_type(call, arg_type)
    bound = "UNBOUNDED" if preceding is None else str(preceding)
    over_node = OverAggregateNode(
        (pre_node,),
        (*pre_node.fields, *agg_fields),
        # Over processing time, rows leave in arrival order: no event-time attribute.
        None if proctime else pre_node.rowtime,
        f"OVER {frame.upper()} {bound} PRECEDING: {sql_text(first.args['order'])}"[:120],
        windows=dict(pre_node.windows),
        proctime=pre_node.proctime,
        spec=OverAggregateSpec(tuple(partition), tuple(calls), frame, preceding, proctime),
    )
    operator_types = {f.name: f.type for f in agg_fields}

    def substitute(node: exp.Expression) -> exp.Expression:
        def visit(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Window):
                output = call_text[sql_text(n)]
                ref: exp.Expression = field_column(output)
                if flink_types[output] != operator_types[output]:
                    to = exp.DataType.build(flink_types[output].sql(), dialect=Flink)
                    ref = exp.Cast(this=ref, to=to)
                return ref
            return n

        return node.copy().transform(visit)

    items = planner.select_list(select, scope, tuple(kept), bind_items=False)
    projections = [(name, substitute(e)) for name, e in items]
    return planner.calc(over_node, projections, None, sql_text(select))
