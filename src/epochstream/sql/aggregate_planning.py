"""Aggregations of a SELECT: window aggregations over ``TABLE(TUMBLE|HOP|CUMULATE|
SESSION(...))`` (event or processing time) and ``GROUP BY`` without a window (an
updating result), with ``COUNT``/``COUNT(DISTINCT)``/``SUM``/``MIN``/``MAX``/``AVG``,
``FILTER (WHERE ...)`` and ``HAVING``.

How one is planned: a Calc before it computes the group keys, the aggregates'
arguments and ``FILTER`` masks that are not plain columns (and applies ``WHERE``); the
aggregate operator keeps one accumulator per key (and slice, for windows); a Calc after
it computes the select list and ``HAVING`` from the keys, the window columns and the
aggregates.

Example::

    node = plan_aggregate(planner, select, input_, scope, window, where)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.graph.specs import (
    AggCall,
    GroupAggregateSpec,
    MiniBatch,
    SessionAggregateSpec,
    SliceWindowAggregateSpec,
    WindowTvf,
)
from epochstream.sql.aggregates import (
    AGGREGATES,
    aggregates_in,
    flink_result_type,
    given_window,
    operator_result_type,
)
from epochstream.sql.dialect import Flink, WindowTVF, shortened, sql_error, sql_text
from epochstream.sql.expressions import Field
from epochstream.sql.plan import (
    GroupAggregateNode,
    PlanNode,
    WindowAggregateNode,
    require_append_only,
)
from epochstream.sql.scope import Scope, bind, field_column
from epochstream.sql.types import SqlType

if TYPE_CHECKING:
    from epochstream.sql.planner import Planner

__all__ = ["WINDOW_COLUMNS", "WINDOW_COLUMN_TYPE", "TvfWindow", "plan_aggregate"]

#: The columns a window TVF adds, and their type.
WINDOW_COLUMNS = ("window_start", "window_end", "window_time")
WINDOW_COLUMN_TYPE = SqlType.parse("TIMESTAMP(3)").with_nullable(False)


@dataclass
class TvfWindow:
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


def _mini_batch(planner: Planner, at: exp.Expression) -> MiniBatch | None:
    """The ``GROUP BY``'s mini-batch (at ``at``) by the session's options (None:
    disabled); Flink's rule: enabled needs an allow-latency and a size above 0."""
    options = planner.options
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


def plan_aggregate(
    planner: Planner,
    select: exp.Select,
    input_: PlanNode,
    scope: Scope,
    window: TvfWindow | None,
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
            Field("window_start", WINDOW_COLUMN_TYPE),
            Field("window_end", WINDOW_COLUMN_TYPE),
            Field("window_time", WINDOW_COLUMN_TYPE),
        )
        columns_scope = scope.with_columns(WINDOW_COLUMNS)
    # Output names of bare column items, before binding renames them.
    planner.item_names[id(select)] = [
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
        require_append_only(input_, select, "a window aggregation")
    operator_window: WindowTvf | None
    if tvf_columns:
        assert window is not None
        operator_window = window.window
        bounds = {"window_start", "window_end"}
        if where is not None and any(c.name in WINDOW_COLUMNS for c in where.find_all(exp.Column)):
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
            g for g in group_items if not (isinstance(g, exp.Column) and g.name in WINDOW_COLUMNS)
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
        text = sql_text(node)
        if text not in pre_names:
            plain = isinstance(node, exp.Column) and node.name not in WINDOW_COLUMNS
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
        if tvf_columns and any(c.name in WINDOW_COLUMNS for c in g.find_all(exp.Column)):
            raise sql_error(g, "a group key cannot compute on the window columns")
        name = pre_column(g, "$k")
        if name not in keys:
            keys.append(name)
        key_text[sql_text(g)] = name
        if not tvf_columns and isinstance(g, exp.Column) and g.name in input_.windows:
            out_windows[name] = input_.windows[g.name]

    calls: list[AggCall] = []
    call_text: dict[str, str] = {}
    call_nodes: dict[str, exp.Expression] = {}
    for agg in _aggregate_calls(select, having):
        text = sql_text(agg)
        if text not in call_text:
            output = f"$a{len(calls)}"
            calls.append(_aggregate_call(agg, output, pre_column))
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
    pre_node = planner.calc(input_, pre, where, f"{kind} input")
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
            shortened(f"{kind} aggregate: {sql_text(select)}"),
            spec=GroupAggregateSpec(
                keys=tuple(keys),
                aggs=tuple(calls),
                updating_input=input_.updating,
                mini_batch=_mini_batch(planner, select),
                state_ttl_ms=planner.options.state_ttl_ms,
            ),
            updating=True,
            unique_key=tuple(keys),
        )
    else:
        aggregate = _window_aggregate_node(
            planner,
            window,
            operator_window,
            keys,
            keys_of_group,
            calls,
            pre_node,
            pre_types,
            agg_fields,
            out_windows,
            f"{kind} aggregate: {sql_text(select)}",
        )
    return _post_aggregate(
        planner,
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
    planner: Planner,
    window: TvfWindow | None,
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
        Field("window_start", WINDOW_COLUMN_TYPE),
        Field("window_end", WINDOW_COLUMN_TYPE),
        *agg_fields,
    )
    spec: SliceWindowAggregateSpec | SessionAggregateSpec
    if operator_window is None:
        assert window is not None
        _check_session_partition(window, keys_of_group)
        spec = SessionAggregateSpec(keys=tuple(keys), gap=window.gap, aggs=tuple(calls))
    else:
        spec = SliceWindowAggregateSpec(
            keys=tuple(keys),
            window=operator_window,
            aggs=tuple(calls),
            proctime=window is not None and window.proctime,
        )
    return WindowAggregateNode(
        (pre_node,), out_fields, None, shortened(label), windows=out_windows, spec=spec
    )


def _post_aggregate(
    planner: Planner,
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
            text = sql_text(n)
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

    items = planner.select_list(select, columns_scope, visible, bind_items=False)
    projections = [(name, substitute(e)) for name, e in items]
    condition = substitute(having.this) if having is not None else None
    post = planner.calc(aggregate, projections, condition, sql_text(select))
    if tvf_columns and rowtime_allowed:
        # window_time is an event-time attribute (a processing-time window's is not).
        post.rowtime = next(
            (n for n, e in items if isinstance(e, exp.Column) and e.name == "window_time"),
            None,
        )
    return post


def _check_session_partition(window: TvfWindow, keys: list[exp.Expression]) -> None:
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
            f"{', '.join(sorted(sql_text(k) for k in keys)) or 'only the window'}): sessions "
            "are cut per group",
        )


def _aggregate_calls(select: exp.Select, having: exp.Having | None) -> Iterator[exp.Expression]:
    for item in [*select.expressions, *([having] if having is not None else [])]:
        yield from aggregates_in(item)


def _aggregate_call(
    agg: exp.Expression, output: str, add: Callable[[exp.Expression, str], str]
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
