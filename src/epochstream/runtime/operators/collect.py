"""Collecting what process functions emit: records with timestamps, and side outputs.

A process function calls ``out.collect(value)`` and ``ctx.output(tag, value)`` any
number of times per record; the operator gathers them for the whole batch (or the
whole round of timers) and emits once. Each output gets the timestamp current when
it was collected (the input record's, or the firing event-time timer's).

Example::

    buf = OutputBuffer()
    buf.start(timed=True)
    buf.ts = 1_000
    buf.collector.collect("a")
    buf.take()        # (["a"], [1000])
"""

from __future__ import annotations

from typing import Any

from epochstream.core.functions import Collector, OutputTag
from epochstream.exceptions import ConfigurationError
from epochstream.runtime.operator_outputs import Output

__all__ = ["OutputBuffer", "SideOutputs"]


class OutputBuffer:
    """Main output of one batch (or timer round), with or without timestamps."""

    __slots__ = ("collector", "records", "timestamps", "ts")

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.timestamps: list[Any] | None = None
        #: The timestamp the next collected record gets.
        self.ts: int | None = None
        self.collector = Collector(self.records.append)

    def start(self, *, timed: bool) -> None:
        """Begin collecting; ``timed``: keep a timestamp per record."""
        self.records = []
        if timed:
            self.timestamps = []
            self.collector.collect = self._collect_timed
        else:
            self.timestamps = None
            self.collector.collect = self.records.append

    def _collect_timed(self, value: Any) -> None:
        self.records.append(value)
        self.timestamps.append(self.ts)  # type: ignore[union-attr]

    def take(self) -> tuple[list[Any], list[Any] | None]:
        """What was collected since ``start`` (and start over, same mode)."""
        records, timestamps = self.records, self.timestamps
        self.records = []
        if timestamps is not None:
            self.timestamps = []
            self.collector.collect = self._collect_timed
        else:
            self.collector.collect = self.records.append
        return records, timestamps

    def flush(self, output: Output) -> None:
        """Hand what was collected, if anything, to ``output``."""
        if self.records:
            output.collect(*self.take())


class SideOutputs:
    """Side outputs of one operator: ``add(tag, value)`` per record, ``flush`` per batch.

    Values for a tag nobody reads (no ``get_side_output``) are dropped, as in Flink.
    """

    __slots__ = ("_buffers", "_outputs", "ts")

    def __init__(self, outputs: dict[str, Output]) -> None:
        # The operator's own dict: side outputs wired after this was made still count.
        self._outputs = outputs
        self._buffers: dict[str, tuple[list[Any], list[Any]]] = {}
        #: The timestamp the next side output gets.
        self.ts: int | None = None

    def add(self, tag: OutputTag, value: Any) -> None:
        if not isinstance(tag, OutputTag):
            raise ConfigurationError(f"ctx.output needs an es.OutputTag, got {type(tag).__name__}")
        if tag.name not in self._outputs:
            return
        buffer = self._buffers.get(tag.name)
        if buffer is None:
            buffer = self._buffers[tag.name] = ([], [])
        buffer[0].append(value)
        buffer[1].append(self.ts)

    def flush(self) -> None:
        """Emit every tag's buffered values."""
        if not self._buffers:
            return
        buffers, self._buffers = self._buffers, {}
        for name, (records, timestamps) in buffers.items():
            has_ts = any(ts is not None for ts in timestamps)
            self._outputs[name].collect(records, timestamps if has_ts else None)
