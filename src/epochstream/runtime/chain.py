"""Wiring the operators of one chain: records, side outputs, watermarks and status.

Every operator's outputs are function calls: a chained consumer's ``process_batch``,
or a record writer's ``write`` for a network edge. Watermarks and idleness go to
*every* consumer of an operator, side outputs included (a watermark is about the
operator's time, not one output): a chained consumer's ``process_watermark`` /
``process_status``, or an in-band event broadcast on a writer's channels.

Example::

    operators = wire_chain(chain, ops_by_uid, writers)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epochstream.graph.jobgraph import ChainSpec
from epochstream.runtime.events import ACTIVE, IDLE, Watermark
from epochstream.runtime.operators import Operator
from epochstream.runtime.outputs import RecordWriter

__all__ = ["wire_chain"]


def wire_chain(
    chain: ChainSpec, ops: dict[str, Operator], writers: dict[int, RecordWriter]
) -> list[Operator]:
    """Connect each operator of ``chain`` to its consumers; the operators in chain order."""
    for spec in chain.operators:
        op = ops[spec.uid]
        records: dict[str, list[Callable[..., None]]] = {}
        marks: list[Callable[[int], None]] = []
        statuses: list[Callable[[bool], None]] = []
        for out in spec.outputs:
            if out.chained_uid is not None:
                consumer = ops[out.chained_uid]
                records.setdefault(out.tag, []).append(consumer.process_batch)
                marks.append(consumer.process_watermark)
                statuses.append(consumer.process_status)
            else:
                assert out.edge_id is not None
                writer = writers[out.edge_id]
                records.setdefault(out.tag, []).append(writer.write)
                marks.append(_broadcast_watermark(writer))
                statuses.append(_broadcast_status(writer))
        for tag, fns in records.items():
            emit = fns[0] if len(fns) == 1 else _fan_out(fns)
            if tag == "main":
                op.emit = emit
            else:
                op.side_emits[tag] = emit
        if marks:
            op.emit_watermark = marks[0] if len(marks) == 1 else _fan_out_event(marks)
            op.emit_status = statuses[0] if len(statuses) == 1 else _fan_out_event(statuses)
    return [ops[spec.uid] for spec in chain.operators]


def _broadcast_watermark(writer: RecordWriter) -> Callable[[int], None]:
    def send(timestamp: int) -> None:
        writer.broadcast_event(Watermark(timestamp))

    return send


def _broadcast_status(writer: RecordWriter) -> Callable[[bool], None]:
    def send(idle: bool) -> None:
        writer.broadcast_event(IDLE if idle else ACTIVE)

    return send


def _fan_out(fns: list[Callable[..., None]]) -> Callable[..., None]:
    def emit(records: list[Any], timestamps: list[Any] | None = None) -> None:
        for fn in fns:
            fn(records, timestamps)

    return emit


def _fan_out_event(fns: list[Callable[[Any], None]]) -> Callable[[Any], None]:
    def emit(value: Any) -> None:
        for fn in fns:
            fn(value)

    return emit
