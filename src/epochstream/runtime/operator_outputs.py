"""Where an operator's records, watermarks and idleness go next: its output objects.

An operator holds one :class:`Output` for its main stream (``op.output``) and one per
side output that something reads (``op.side_outputs[tag]``); ``wire_chain`` builds
them. An operator hands a batch on with ``self.output.collect(records, timestamps)``
(``timestamps`` parallel to ``records``, or ``None``; ``records`` a list, or a
``pyarrow.RecordBatch`` with ``None``), as Flink's ``Output.collect`` and Arroyo's
collector do. The implementations:

- :class:`ChainedOutput`: the next operator of the same chain, called directly
  (its ``process_batch``, ``process_watermark``, ``process_status``);
- :class:`NetworkOutput`: a :class:`~epochstream.runtime.outputs.RecordWriter` of a
  network edge (records are partitioned and buffered; watermarks and idleness are
  broadcast in-band on every channel);
- :class:`FanOutOutput`: several of the above behind one output (two consumers of
  the same stream);
- :data:`DISCARD`: an output nobody reads.

Metrics ride on the outputs, one add per batch: the producing operator's
``records_out`` (counted once per batch, also behind a fan-out) and a chained
consumer's ``records_in``; a chained consumer's watermark input records its current
watermark. Each output is one Python call between an operator and its consumer.

Example::

    op.output = ChainedOutput(next_op, produced=op.counters, consumed=next_op.counters)
    op.output.collect([1, 2, 3], None)      # next_op.process_batch([1, 2, 3], None)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from epochstream.core.events import ACTIVE, IDLE, Watermark
from epochstream.runtime.metrics import OperatorCounters
from epochstream.runtime.outputs import RecordWriter

if TYPE_CHECKING:
    from epochstream.runtime.operators.base import Operator

__all__ = ["DISCARD", "ChainedOutput", "DiscardOutput", "FanOutOutput", "NetworkOutput", "Output"]


class Output(ABC):
    """Where one stream of an operator goes: records, watermarks, idleness.

    Example::

        class Printing(Output):
            def collect(self, records, timestamps=None): print(records)
            def emit_watermark(self, watermark): print("watermark", watermark)
            def emit_status(self, idle): print("idle" if idle else "active")
    """

    __slots__ = ()

    @abstractmethod
    def collect(self, records: Any, timestamps: list[Any] | None = None) -> None:
        """Hand on a batch: a list of records (with their timestamps, or ``None``) or a
        ``pyarrow.RecordBatch`` (timestamps ``None``: they are its ``_ts`` column)."""

    @abstractmethod
    def emit_watermark(self, watermark: int) -> None:
        """Event time reached ``watermark`` (int ms) on this stream."""

    @abstractmethod
    def emit_status(self, idle: bool) -> None:
        """The stream went idle (``True``) or active again (``False``)."""


class DiscardOutput(Output):
    """The output of a stream nobody reads: everything is dropped (as Flink drops a side
    output that no ``get_side_output`` asked for).

    Example: ``DISCARD.collect([1, 2], None)`` does nothing.
    """

    __slots__ = ()

    def collect(self, records: Any, timestamps: list[Any] | None = None) -> None:
        """Drop the batch."""

    def emit_watermark(self, watermark: int) -> None:
        """Drop the watermark."""

    def emit_status(self, idle: bool) -> None:
        """Drop the status change."""


#: The one output of every stream nobody reads (operators start with it).
DISCARD = DiscardOutput()


class ChainedOutput(Output):
    """The next operator of the same chain: a direct call, no copy, no queue.

    ``produced``: the producing operator's counters (``records_out``), or ``None``
    when a :class:`FanOutOutput` in front counts them; ``consumed``: the consumer's
    (``records_in``, ``watermark``).

    Example::

        out = ChainedOutput(reduce_op, produced=map_counters, consumed=reduce_counters)
        out.collect([("a", 1)], None)   # reduce_op.process_batch([("a", 1)], None)
    """

    __slots__ = ("_process", "consumed", "consumer", "produced")

    def __init__(
        self,
        consumer: Operator,
        *,
        produced: OperatorCounters | None,
        consumed: OperatorCounters,
    ) -> None:
        self.consumer = consumer
        self.produced = produced
        self.consumed = consumed
        # Bound once: fusion may have replaced the consumer's process_batch before wiring.
        self._process = consumer.process_batch

    def collect(self, records: Any, timestamps: list[Any] | None = None) -> None:
        n = len(records)
        produced = self.produced
        if produced is not None:
            produced.records_out += n
        self.consumed.records_in += n
        self._process(records, timestamps)

    def emit_watermark(self, watermark: int) -> None:
        self.consumed.watermark = watermark
        self.consumer.process_watermark(watermark)

    def emit_status(self, idle: bool) -> None:
        self.consumer.process_status(idle)


class NetworkOutput(Output):
    """A network edge: the edge's record writer partitions and buffers the records;
    watermarks and idleness go in-band to every downstream subtask, after the records
    buffered before them.

    ``produced``: the producing operator's counters, or ``None`` behind a fan-out.

    Example::

        out = NetworkOutput(writer, produced=op.counters)
        out.collect([1, 2, 3], None)     # writer.write([1, 2, 3], None)
        out.emit_watermark(1_000)        # writer.broadcast_event(Watermark(1_000))
    """

    __slots__ = ("_write", "produced", "writer")

    def __init__(self, writer: RecordWriter, *, produced: OperatorCounters | None) -> None:
        self.writer = writer
        self.produced = produced
        self._write = writer.write

    def collect(self, records: Any, timestamps: list[Any] | None = None) -> None:
        produced = self.produced
        if produced is not None:
            produced.records_out += len(records)
        self._write(records, timestamps)

    def emit_watermark(self, watermark: int) -> None:
        self.writer.broadcast_event(Watermark(watermark))

    def emit_status(self, idle: bool) -> None:
        self.writer.broadcast_event(IDLE if idle else ACTIVE)


class FanOutOutput(Output):
    """One stream read by several consumers: each gets the same batch (not a copy:
    operators do not change the lists they are given) and every watermark.

    ``produced``: the producing operator's counters, counted once per batch here (the
    outputs behind it are built with ``produced=None``).

    Example::

        out = FanOutOutput([ChainedOutput(a, produced=None, consumed=ca),
                            NetworkOutput(writer, produced=None)], produced=counters)
    """

    __slots__ = ("outputs", "produced")

    def __init__(self, outputs: list[Output], *, produced: OperatorCounters) -> None:
        self.outputs = outputs
        self.produced = produced

    def collect(self, records: Any, timestamps: list[Any] | None = None) -> None:
        self.produced.records_out += len(records)
        for output in self.outputs:
            output.collect(records, timestamps)

    def emit_watermark(self, watermark: int) -> None:
        for output in self.outputs:
            output.emit_watermark(watermark)

    def emit_status(self, idle: bool) -> None:
        for output in self.outputs:
            output.emit_status(idle)
