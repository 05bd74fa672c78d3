"""The physical plan of a SQL query: a tree of nodes, each one epochstream operator (or a
source or sink), with its output columns, its time attribute, and a uid derived from
what it computes and from its inputs, so the same query restores from its own
savepoint and a changed one does not silently adopt another operator's state.

Nodes hold only data (specs, compiled Calc programs, table definitions); the API layer
turns them into DataStream calls (``epochstream.api.sql_streams``).

Example::

    node = planner.plan_query(parse_one("SELECT auction FROM bid", dialect=Flink))
    print(explain(node))
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa
from sqlglot import exp

from epochstream.core.arrow import TS
from epochstream.graph.specs import (
    AggCall,
    EquiJoinSpec,
    GroupAggregateSpec,
    IntervalBounds,
    OverAggregateSpec,
    SessionAggregateSpec,
    SliceWindowAggregateSpec,
    WindowEnd,
    WindowTvf,
)
from epochstream.sql.catalog import TableDef
from epochstream.sql.dialect import sql_error
from epochstream.sql.expressions import CalcProgram, Field

__all__ = [
    "CalcNode",
    "ColumnAdapter",
    "GroupAggregateNode",
    "JoinNode",
    "OverAggregateNode",
    "PlanNode",
    "ScanNode",
    "SinkNode",
    "StreamScanNode",
    "TopNNode",
    "UnionNode",
    "WindowAggregateNode",
    "WindowAssignNode",
    "WindowTopNNode",
    "explain",
    "require_append_only",
]


class ColumnAdapter:
    """Per batch: the named columns, in order, under new names and Arrow types (a
    connector's or an operator's columns as the plan declares them: Nexmark's
    ``date_time`` is int64 milliseconds, the table's ``dateTime`` a ``TIMESTAMP(3)``);
    ``_ts`` passes through. Picklable: it runs in the slots.

    Example: ``ColumnAdapter([("dateTime", "date_time", pa.timestamp("ms"))])(batch)``
    """

    def __init__(self, columns: list[tuple[str, str, pa.DataType]]) -> None:
        self.columns = columns

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        arrays: list[pa.Array] = []
        names: list[str] = []
        for name, source, kind in self.columns:
            column = batch.column(source)
            if column.type != kind:
                column = column.cast(kind)
            arrays.append(column)
            names.append(name)
        if TS in batch.schema.names:
            arrays.append(batch.column(TS))
            names.append(TS)
        return pa.RecordBatch.from_arrays(arrays, names=names)


@dataclass(eq=False)
class PlanNode(ABC):
    """One operator of the plan: its inputs, its output columns (``fields``) and the
    output column that is its event-time attribute (``rowtime``; the batches' ``_ts``
    carries its values). ``label`` is the operator name shown in the dashboard."""

    inputs: tuple[PlanNode, ...]
    fields: tuple[Field, ...]
    rowtime: str | None
    label: str
    #: Output columns that are a window's bounds: name -> ("start" or "end", the window).
    #: They survive renames, so a query may group or join on them further down.
    windows: dict[str, tuple[str, WindowTvf]] = field(default_factory=dict, kw_only=True)
    #: The output column that is a processing-time attribute (``PROCTIME()``), if any.
    proctime: str | None = field(default=None, kw_only=True)
    #: Whether the output is a changelog (batches with an ``_op`` column: a ``GROUP BY``
    #: without a window and what follows it), else append-only.
    updating: bool = field(default=False, kw_only=True)
    #: The output columns no two live rows share (an updating result's group keys):
    #: what an upsert sink's PRIMARY KEY must be. None: unknown.
    unique_key: tuple[str, ...] | None = field(default=None, kw_only=True)

    kind = "node"

    def row_kinds(self) -> str:
        """The row kinds of an updating result, as :func:`explain` shows them."""
        return "+I, -U, +U"

    @abstractmethod
    def digest(self) -> str:
        """What the node computes, as text (its uid hashes it with its inputs' uids)."""

    def details(self) -> list[str]:
        """Lines for :func:`explain` beyond the label (keys, state, watermarks)."""
        return []

    @cached_property
    def uid(self) -> str:
        """``sql-<kind>-<16 hex>``: a hash of the node's digest, its output columns with
        their types (state written under other types is another operator's) and its
        inputs' uids."""
        columns = ",".join(f"{f.name}:{f.type.sql()}" for f in self.fields)
        text = "\x1f".join((self.kind, self.digest(), columns, *(i.uid for i in self.inputs)))
        return f"sql-{self.kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


@dataclass(eq=False)
class ScanNode(PlanNode):
    """Read ``columns`` of a DDL table through its connector."""

    table: TableDef = field(kw_only=True)
    columns: tuple[str, ...] = field(kw_only=True)

    kind = "scan"

    def digest(self) -> str:
        # The options name what is read; secrets stay out of the digest's input order
        # only as far as the hash goes: the digest itself is never shown.
        options = ",".join(f"{k}={v}" for k, v in sorted(self.table.options.items()))
        return f"{self.table.name}|{options}|{','.join(self.columns)}"

    def details(self) -> list[str]:
        out = [f"connector: {self.table.connector}", f"columns: {', '.join(self.columns)}"]
        if self.table.rowtime is not None:
            out.append(
                f"watermark: {self.table.rowtime} - {self.table.watermark_delay_ms} ms (per split)"
            )
        return out


@dataclass(eq=False)
class StreamScanNode(PlanNode):
    """A DataStream registered with ``Environment.create_table``."""

    table: TableDef = field(kw_only=True)

    kind = "stream"

    def digest(self) -> str:
        return self.table.name


@dataclass(eq=False)
class CalcNode(PlanNode):
    """Filter then project each batch with a compiled :class:`CalcProgram` (stateless).
    ``text`` is the SQL it computes."""

    program: CalcProgram = field(kw_only=True)
    text: str = field(kw_only=True)
    #: What ``program`` was compiled from (the planner fuses a Calc into the one above).
    projections: tuple[tuple[str, exp.Expression], ...] = field(kw_only=True)
    condition: exp.Expression | None = field(kw_only=True)

    kind = "calc"

    def row_kinds(self) -> str:
        return self.inputs[0].row_kinds()  # a filter passes its input's kinds on

    def digest(self) -> str:
        return self.text

    def details(self) -> list[str]:
        return [self.text]


@dataclass(eq=False)
class WindowAggregateNode(PlanNode):
    """Aggregate per key and window, emitted once per window: TUMBLE/HOP/CUMULATE over
    event time (when the watermark passes the window's end; slices shared by
    overlapping windows) or processing time (when the slot's clock does), or SESSION
    (per key, when the watermark passes the session's end).

    ``spec`` is the operator's (keys, windows, aggregates)."""

    spec: SliceWindowAggregateSpec | SessionAggregateSpec = field(kw_only=True)

    kind = "window-aggregate"

    def digest(self) -> str:
        return repr(self.spec)

    def details(self) -> list[str]:
        spec = self.spec
        keys = f"keys: {', '.join(spec.keys) or '(none: one group)'}"
        aggregates = f"aggregates: {', '.join(_call_text(a) for a in spec.aggs)}"
        if isinstance(spec, SessionAggregateSpec):
            return [
                f"window: SESSION gap {spec.gap} ms",
                keys,
                aggregates,
                "state: per key its open sessions' partial aggregates, merged as sessions merge",
                "emits: once per key and session, when the watermark passes its end",
            ]
        window = spec.window
        shape = f"{window.kind.upper()} size {window.size} ms"
        if window.kind == "hop":
            shape += f", slide {window.slide} ms"
        elif window.kind == "cumulate":
            shape += f", step {window.step} ms"
        if window.offset:
            shape += f", offset {window.offset} ms"
        if spec.proctime:
            return [
                f"window: processing-time {shape}",
                keys,
                aggregates,
                "state: per key and slice, rows taking the slot's clock time on arrival",
                "emits: once per key and window, when the slot's clock passes window_end",
            ]
        return [
            f"window: {shape}",
            keys,
            aggregates,
            "state: per key and slice, dropped when the watermark passes the slice's last window",
            "emits: once per key and window, when the watermark passes window_end",
        ]


@dataclass(eq=False)
class GroupAggregateNode(PlanNode):
    """A ``GROUP BY`` without a window: running aggregates per key, an updating result
    (a changelog of ``+I`` and ``-U``/``+U`` rows). ``spec`` is the operator's."""

    spec: GroupAggregateSpec = field(kw_only=True)

    kind = "group-aggregate"

    def digest(self) -> str:
        return repr(self.spec)

    def details(self) -> list[str]:
        kept = "COUNT DISTINCT's values"
        if self.spec.updating_input:
            kept = "MIN's, MAX's and COUNT DISTINCT's values with their counts"
        emits = "a changelog: +I for a new key, -U/+U when a batch changes its result"
        if self.spec.updating_input:
            emits += ", -D when its last row is retracted"
        lines = [
            f"keys: {', '.join(self.spec.keys) or '(none: one group)'}",
            f"aggregates: {', '.join(_call_text(a) for a in self.spec.aggs)}",
            f"state: per key its partial aggregates (and {kept}), {_kept_for(self.spec.state_ttl_ms)}",
            f"emits: {emits}",
        ]
        mini = self.spec.mini_batch
        if mini is not None:
            lines.append(
                f"mini-batch: input held up to {mini.size} rows or {mini.latency_ms} ms, "
                "folded before each watermark and checkpoint barrier"
            )
        return lines


def _kept_for(state_ttl_ms: int) -> str:
    """How long a group aggregation or Top-N keeps a key's state, for ``details``."""
    if state_ttl_ms:
        return f"each until {state_ttl_ms} ms after it was last written (table.exec.state.ttl)"
    return "kept for the job's life"


def _call_text(call: AggCall) -> str:
    arg = "*" if call.column is None else call.column
    kind = "COUNT" if call.kind == "count_star" else call.kind.upper()
    text = f"{kind}({'DISTINCT ' if call.distinct else ''}{arg})"
    return text + (f" FILTER ({call.filter})" if call.filter else "")


@dataclass(eq=False)
class JoinNode(PlanNode):
    """An equi-join of two inputs (the sides' key Calcs), each keyed by its key
    columns: ``spec`` is the operator's (keys, output columns, the residual condition,
    the retention that makes it a regular, interval or window join, and a regular
    join's type: inner, left, right or full). ``condition_text`` is the residual
    condition's SQL (shown, and hashed). An outer join, or one of an updating input,
    is updating: its joined and null-padded rows come and go as ``+I``/``-D``."""

    spec: EquiJoinSpec = field(kw_only=True)
    condition_text: str = field(default="", kw_only=True)

    kind = "join"

    def row_kinds(self) -> str:
        return "+I, -D"

    @property
    def mode(self) -> str:
        """``regular``, ``interval`` or ``window``."""
        retention = self.spec.retention
        if isinstance(retention, IntervalBounds):
            return "interval"
        return "window" if isinstance(retention, WindowEnd) else "regular"

    def digest(self) -> str:
        spec = self.spec
        parts: list[object] = [
            spec.left_keys,
            spec.right_keys,
            spec.left_output,
            spec.right_output,
            spec.retention,
            self.condition_text,
        ]
        # An inner join of append-only inputs keeps the digest (so the uid, and the
        # savepoints keyed by it) it had before outer and updating joins existed.
        if spec.join_type != "inner" or spec.updating_input:
            parts += [spec.join_type, spec.updating_input]
        return "|".join(str(part) for part in parts)

    def details(self) -> list[str]:
        spec = self.spec
        keys = ", ".join(f"{a} = {b}" for a, b in zip(spec.left_keys, spec.right_keys, strict=True))
        kind = "" if spec.join_type == "inner" else f" {spec.join_type.upper()} OUTER"
        lines = [f"{self.mode}{kind} join on {keys}"]
        if isinstance(spec.retention, IntervalBounds):
            bounds = spec.retention
            lines.append(f"time: left - right in [{bounds.lower}, {bounds.upper}] ms")
            lines.append("state: each side's rows until the watermark passes their interval")
        elif isinstance(spec.retention, WindowEnd):
            lines.append("state: each side's rows until the watermark passes their window_end")
        elif spec.state_ttl_ms:
            lines.append(
                f"state: every row of both sides, each until {spec.state_ttl_ms} ms after "
                "it was written (table.exec.state.ttl)"
            )
        else:
            lines.append("state: every row of both sides, kept forever (unbounded)")
        if self.condition_text:
            lines.append(f"condition: {self.condition_text}")
        return lines


@dataclass(eq=False)
class WindowTopNNode(PlanNode):
    """Flink's window Top-N: per window and ``partition`` key, the first ``n`` rows in
    ``order`` (``(column, descending, nulls_first)``), emitted when the watermark
    passes the window's end; ``rank_column`` holds ROW_NUMBER when the query keeps it.
    ``window_ends``: the input's window-start and window-end columns."""

    partition: tuple[str, ...] = field(kw_only=True)
    order: tuple[tuple[str, bool, bool], ...] = field(kw_only=True)
    n: int = field(kw_only=True)
    rank_column: str | None = field(kw_only=True)
    window_columns: tuple[str, str] = field(kw_only=True)

    kind = "window-top-n"

    def digest(self) -> str:
        return f"{self.partition}|{self.order}|{self.n}|{self.rank_column}|{self.window_columns}"

    def details(self) -> list[str]:
        order = ", ".join(
            f"{c} {'DESC' if d else 'ASC'} NULLS {'FIRST' if nf else 'LAST'}"
            for c, d, nf in self.order
        )
        return [
            f"top {self.n} per window and {', '.join(self.partition) or '(window only)'}",
            f"order: {order}",
            "state: the rows of each open window, dropped when the watermark passes its end",
        ]


@dataclass(eq=False)
class TopNNode(PlanNode):
    """Flink's Top-N without a window (``ROW_NUMBER() OVER (PARTITION BY ...) <= n``,
    ``n = 1`` a deduplication): per ``partition`` key the first ``n`` rows so far in
    ``order`` (``(column, descending, nulls_first)``), an updating result;
    ``rank_column`` holds ROW_NUMBER when the query keeps it; ``state_ttl_ms`` is
    ``table.exec.state.ttl`` (0: forever; not in the digest, as the join's is not)."""

    partition: tuple[str, ...] = field(kw_only=True)
    order: tuple[tuple[str, bool, bool], ...] = field(kw_only=True)
    n: int = field(kw_only=True)
    rank_column: str | None = field(kw_only=True)
    state_ttl_ms: int = field(default=0, kw_only=True)

    kind = "top-n"

    def digest(self) -> str:
        return f"{self.partition}|{self.order}|{self.n}|{self.rank_column}"

    def details(self) -> list[str]:
        order = ", ".join(
            f"{c} {'DESC' if d else 'ASC'} NULLS {'FIRST' if nf else 'LAST'}"
            for c, d, nf in self.order
        )
        return [
            f"top {self.n} per {', '.join(self.partition) or '(one partition)'}",
            f"order: {order or 'arrival (the first row of each partition, insert-only)'}",
            f"state: each partition's first rows, {_kept_for(self.state_ttl_ms)}",
        ]


@dataclass(eq=False)
class WindowAssignNode(PlanNode):
    """A window TVF without aggregation: every row once per window it belongs to, with
    ``window_start``, ``window_end`` and ``window_time`` added (stateless)."""

    window: WindowTvf = field(kw_only=True)

    kind = "window-assign"

    def digest(self) -> str:
        return repr(self.window)

    def details(self) -> list[str]:
        return [
            f"windows: {self.window.kind.upper()} size {self.window.size} ms (one row per window)"
        ]


@dataclass(eq=False)
class UnionNode(PlanNode):
    """``UNION ALL`` of inputs with the same columns (each cast by its own Calc)."""

    kind = "union"

    def digest(self) -> str:
        return str(len(self.inputs))


@dataclass(eq=False)
class SinkNode(PlanNode):
    """Write into a DDL table. ``binding`` is the connector's sink (see
    :func:`~epochstream.sql.connectors.sink_binding`)."""

    table: TableDef = field(kw_only=True)
    binding: Any = field(kw_only=True)

    kind = "sink"

    def digest(self) -> str:
        options = ",".join(f"{k}={v}" for k, v in sorted(self.table.options.items()))
        return f"{self.table.name}|{options}"

    def details(self) -> list[str]:
        form = "Arrow batches" if self.binding.takes_batches else "rows"
        return [f"connector: {self.table.connector} ({type(self.binding.sink).__name__}, {form})"]


def explain(root: PlanNode) -> str:
    """The plan as an indented tree, the sink or result at the top: each operator with
    its uid, output columns (with types and the time attribute) and details.

    Example::

        == Physical plan ==
        calc [sql-calc-1f...]  SELECT auction, price ...
          columns: auction BIGINT, price BIGINT
          scan [sql-scan-7a...]  bid
    """
    lines = ["== Physical plan =="]
    seen: set[str] = set()

    def walk(node: PlanNode, depth: int) -> None:
        pad = "  " * depth
        if node.uid in seen:
            lines.append(f"{pad}(reused) {node.kind} [{node.uid}]")
            return
        seen.add(node.uid)
        lines.append(f"{pad}{node.kind} [{node.uid}]  {node.label}")

        def mark(name: str) -> str:
            if name == node.rowtime:
                return " *ROWTIME*"
            if name == node.proctime:
                return " *PROCTIME*"
            if name in node.windows:
                return f" *WINDOW {node.windows[name][0].upper()}*"
            return ""

        columns = ", ".join(f"{f.name} {f.type.sql()}{mark(f.name)}" for f in node.fields)
        if columns:
            lines.append(f"{pad}    columns: {columns}")
        if node.updating:
            key = ", ".join(node.unique_key) if node.unique_key is not None else "unknown"
            lines.append(f"{pad}    changelog: {node.row_kinds()} (unique key: {key or 'none'})")
        for line in node.details():
            lines.append(f"{pad}    {line}")
        for child in node.inputs:
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines)


@dataclass(eq=False)
class OverAggregateNode(PlanNode):
    """Flink's OVER aggregation over event time: every input row once, when the
    watermark passes its time, with ``spec``'s aggregates over its frame (ROWS or RANGE
    before it, per partition key) appended."""

    spec: OverAggregateSpec = field(kw_only=True)

    kind = "over-aggregate"

    def digest(self) -> str:
        return repr(self.spec)

    def details(self) -> list[str]:
        spec = self.spec
        bound = "UNBOUNDED" if spec.preceding is None else str(spec.preceding)
        unit = " ms" if spec.frame == "range" and spec.preceding is not None else ""
        held = {
            "rows": f"the last {spec.preceding} rows",
            "range": f"the rows of the last {spec.preceding} ms",
        }[spec.frame]
        if spec.preceding is None:
            held = "one row of running aggregates"
        state = f"state: rows until the watermark passes them; per key {held}"
        emits = "each row once, when the watermark passes its time (late rows dropped)"
        if spec.proctime:
            state = f"state: per key {held} (rows take the slot's clock time on arrival)"
            emits = "each row once, on arrival"
        return [
            f"partition: {', '.join(spec.partition_by) or '(none: one partition)'}",
            f"frame: {spec.frame.upper()} BETWEEN {bound}{unit} PRECEDING AND CURRENT ROW"
            + (" (processing time)" if spec.proctime else ""),
            f"aggregates: {', '.join(_call_text(a) for a in spec.aggs)}",
            state,
            f"emits: {emits}",
        ]


def require_append_only(node: PlanNode, at: exp.Expression, what: str) -> None:
    """Refuse ``what`` (at ``at``) over ``node`` when its result is updating.

    Example: ``require_append_only(input_node, union, "UNION ALL")``
    """
    if node.updating:
        raise sql_error(
            at,
            f"{what} over an updating input (the changelog of a GROUP BY without a window) "
            "is not supported yet",
        )
