"""Wiring the operators of one chain: each operator's output objects.

``wire_chain`` gives every operator an :class:`~epochstream.runtime.operator_outputs.Output`
per stream something reads: ``op.output`` (main) and ``op.side_outputs[tag]``. A
chained consumer becomes a :class:`ChainedOutput` (a direct ``process_batch`` call), a
network edge a :class:`NetworkOutput` over its record writer, and a stream with several
consumers a :class:`FanOutOutput` over theirs. Watermarks and idleness go to *every*
consumer of an operator, side outputs included (a watermark is about the operator's
time, not one output): ``Operator.emit_watermark`` sends them on each of its outputs.

Metrics ride on the outputs: each batch adds its length to the producing operator's
``records_out`` and to a chained consumer's ``records_in`` (one add per batch); a
chained consumer's watermark input records its current watermark. The task counts its
head operator's input itself.

Consecutive map / filter / flat_map operators are fused into one loop first (see
``fusion``); ``fuse=False`` wires every operator on its own.

Example::

    operators = wire_chain(chain, ops_by_uid, writers, counters)
    operators[0].output      # ChainedOutput(operators[1], ...) or NetworkOutput(writer, ...)
"""

from __future__ import annotations

from epochstream.graph.jobgraph import ChainSpec
from epochstream.runtime.fusion import fuse_runs
from epochstream.runtime.metrics import OperatorCounters
from epochstream.runtime.operator_outputs import (
    ChainedOutput,
    FanOutOutput,
    NetworkOutput,
    Output,
)
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
        produced = op.counters = counters[spec.uid]
        consumers: dict[str, list[tuple[str | None, int | None]]] = {}
        for out in spec.outputs:
            consumers.setdefault(out.tag, []).append((out.chained_uid, out.edge_id))
        for tag, targets in consumers.items():
            # One consumer counts the producer's records_out itself; behind a fan-out,
            # the fan-out counts them once for all.
            single = len(targets) == 1
            outputs: list[Output] = []
            for chained_uid, edge_id in targets:
                if chained_uid is not None:
                    outputs.append(
                        ChainedOutput(
                            ops[chained_uid],
                            produced=produced if single else None,
                            consumed=counters[chained_uid],
                        )
                    )
                else:
                    assert edge_id is not None
                    outputs.append(
                        NetworkOutput(writers[edge_id], produced=produced if single else None)
                    )
            output = outputs[0] if single else FanOutOutput(outputs, produced=produced)
            if tag == "main":
                op.output = output
            else:
                op.side_outputs[tag] = output
    return [ops[spec.uid] for spec in chain.operators]
