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
from typing import Any

from epochstream.sql.catalog import TableDef
from epochstream.sql.expressions import CalcProgram, Field

__all__ = [
    "AggregateCall",
    "CalcNode",
    "PlanNode",
    "ScanNode",
    "SinkNode",
    "StreamScanNode",
    "UnionNode",
    "WindowAggregateNode",
    "explain",
]


@dataclass(eq=False)
class PlanNode(ABC):
    """One operator of the plan: its inputs, its output columns (``fields``) and the
    output column that is its event-time attribute (``rowtime``; the batches' ``_ts``
    carries its values). ``label`` is the operator name shown in the dashboard."""

    inputs: tuple[PlanNode, ...]
    fields: tuple[Field, ...]
    rowtime: str | None
    label: str

    kind = "node"

    @abstractmethod
    def digest(self) -> str:
        """What the node computes, as text (its uid hashes it with its inputs' uids)."""

    def details(self) -> list[str]:
        """Lines for :func:`explain` beyond the label (keys, state, watermarks)."""
        return []

    @property
    def uid(self) -> str:
        """``sql-<kind>-<16 hex>``: a hash of the node's digest and its inputs' uids."""
        text = "\x1f".join((self.kind, self.digest(), *(i.uid for i in self.inputs)))
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

    kind = "calc"

    def digest(self) -> str:
        return self.text

    def details(self) -> list[str]:
        return [self.text]


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate of a window aggregation: ``kind`` of input ``column`` (None for
    ``COUNT(*)``) into ``output``, over distinct values or not, counting only rows where
    the boolean column ``filter`` is TRUE (None: every row).

    Example: ``AggregateCall("count", "bidder", "__a0", distinct=True, filter="__f0")``
    """

    kind: str
    column: str | None
    output: str
    distinct: bool = False
    filter: str | None = None

    def sql(self) -> str:
        """The call as text. Example: ``COUNT(DISTINCT bidder) FILTER (__f0)``"""
        arg = "*" if self.column is None else self.column
        text = f"{self.kind.upper()}({'DISTINCT ' if self.distinct else ''}{arg})"
        return text + (f" FILTER ({self.filter})" if self.filter else "")


@dataclass(eq=False)
class WindowAggregateNode(PlanNode):
    """Aggregate per key and TUMBLE/HOP/CUMULATE window, emitted once when the
    watermark passes the window's end (slices shared by overlapping windows).

    ``window`` is ``(kind, size_ms, step_ms, offset_ms)``: ``step`` is the slide (HOP),
    the step (CUMULATE) or the size (TUMBLE)."""

    keys: tuple[str, ...] = field(kw_only=True)
    window: tuple[str, int, int, int] = field(kw_only=True)
    aggregates: tuple[AggregateCall, ...] = field(kw_only=True)

    kind = "window-aggregate"

    def digest(self) -> str:
        calls = ",".join(f"{a.output}={a.sql()}" for a in self.aggregates)
        return f"{self.window}|{','.join(self.keys)}|{calls}"

    def details(self) -> list[str]:
        kind, size, step, offset = self.window
        shape = f"{kind.upper()} size {size} ms" + (
            f", {'slide' if kind == 'hop' else 'step'} {step} ms" if kind != "tumble" else ""
        )
        if offset:
            shape += f", offset {offset} ms"
        return [
            f"window: {shape}",
            f"keys: {', '.join(self.keys) or '(none: one group)'}",
            f"aggregates: {', '.join(a.sql() for a in self.aggregates)}",
            "state: per key and slice, dropped when the watermark passes the slice's last window",
            "emits: once per key and window, when the watermark passes window_end",
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
    seen: dict[int, str] = {}

    def walk(node: PlanNode, depth: int) -> None:
        pad = "  " * depth
        if id(node) in seen:
            lines.append(f"{pad}(reused) {node.kind} [{seen[id(node)]}]")
            return
        seen[id(node)] = node.uid
        lines.append(f"{pad}{node.kind} [{node.uid}]  {node.label}")
        columns = ", ".join(
            f"{f.name} {f.type.sql()}" + (" *ROWTIME*" if f.name == node.rowtime else "")
            for f in node.fields
        )
        if columns:
            lines.append(f"{pad}    columns: {columns}")
        for line in node.details():
            lines.append(f"{pad}    {line}")
        for child in node.inputs:
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines)
