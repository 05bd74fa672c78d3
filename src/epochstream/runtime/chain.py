"""Wiring the operators of one chain: records, side outputs, watermarks and status.

Every operator's outputs are function calls: a chained consumer's ``process_batch``,
or a record writer's ``write`` for a network edge. Watermarks and idleness go to
*every* consumer of an operator, side outputs included (a watermark is about the
operator's time, not one output): a chained consumer's ``process_watermark`` /
``process_status``, or an in-band event broadcast on a writer's channels.

Metrics ride on the wiring: each output call adds its batch's length to the operator's
``records_out`` and each chained input call to the consumer's ``records_in`` (one add
per batch); a chained consumer's watermark input records its current watermark. The
task counts its head operator's input itself.

Consecutive map / filter / flat_map operators are fused into one loop first (see
``fusion``); ``fuse=False`` wires every operator on its own.

Example::

    operators = wire_chain(chain, ops_by_uid, writers, counters)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epochstream.core.events import ACTIVE, IDLE, Watermark
from epochstream.graph.jobgraph import ChainSpec
from epochstream.runtime.fusion import fuse_runs
from epochstream.runtime.metrics import OperatorCounters
from epochstream.runtime.operators import Operator
from epochstream.runtime.outputs import RecordWriter

__all__ = ["wire_chain"]


def wire_chain(
    chain: ChainSpec,
    ops: dict[str, Operator],
    writers: dict[int, RecordWriter],
    counters: dict[str, OperatorCounters],
    *,
    fuse: bool = True,
) -> list[Operator]:
    """Connect each operator of ``chain`` to its consumers; the operators in chain order."""
    if fuse:
        fuse_runs(chain, ops, counters)
    for spec in chain.operators:
        op = ops[spec.uid]
        op.counters = counters[spec.uid]
        records: dict[str, list[Callable[..., None]]] = {}
        marks: list[Callable[[int], None]] = []
        statuses: list[Callable[[bool], None]] = []
        for out in spec.outputs:
            if out.chained_uid is not None:
                consumer = ops[out.chained_uid]
                into = counters[out.chained_uid]
                records.setdefault(out.tag, []).append(_count_in(consumer.process_batch, into))
                marks.append(_watch_watermark(consumer.process_watermark, into))
                statuses.append(consumer.process_status)
            else:
                assert out.edge_id is not None
                writer = writers[out.edge_id]
                records.setdefault(out.tag, []).append(writer.write)
                marks.append(_broadcast_watermark(writer))
                statuses.append(_broadcast_status(writer))
        for tag, fns in records.items():
            emit = _count_out(fns[0] if len(fns) == 1 else _fan_out(fns), counters[spec.uid])
            if tag == "main":
                op.emit = emit
            else:
                op.side_emits[tag] = emit
        if marks:
            op.emit_watermark = marks[0] if len(marks) == 1 else _fan_out_event(marks)
            op.emit_status = statuses[0] if len(statuses) == 1 else _fan_out_event(statuses)
    return [ops[spec.uid] for spec in chain.operators]


def _count_in(fn: Callable[..., None], counters: OperatorCounters) -> Callable[..., None]:
    def process(records: list[Any], timestamps: list[Any] | None = None) -> None:
        counters.records_in += len(records)
        fn(records, timestamps)

    return process


def _count_out(fn: Callable[..., None], counters: OperatorCounters) -> Callable[..., None]:
    def emit(records: list[Any], timestamps: list[Any] | None = None) -> None:
        counters.records_out += len(records)
        fn(records, timestamps)

    return emit


def _watch_watermark(
    fn: Callable[[int], None], counters: OperatorCounters
) -> Callable[[int], None]:
    def process(timestamp: int) -> None:
        counters.watermark = timestamp
        fn(timestamp)

    return process


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
