"""Operators hosting connectors: the source reader and the sink writer.

The source operator's checkpointed state is its readers' split positions (operator
list state ``splits``, redistributed on rescale); a sink writer's state is its
pending transactions (union list state ``txns``, so whichever subtask restores
sees every pending transaction and can commit it).

Example::

    src = SourceOperator(spec, ctx); src.open(); src.assign_splits(splits)
    count = src.poll(1024)
    if not count and src.should_request_split():
        send(RequestSplit(chain_id, subtask))
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from epochstream.connectors.base import (
    Sink,
    SinkContext,
    SinkWriter,
    Source,
    SourceContext,
    SourceReader,
)
from epochstream.core.arrow import plain_types
from epochstream.core.events import MAX_WATERMARK
from epochstream.runtime.operators.base import Operator, SnapshotParts
from epochstream.runtime.watermarks import TimestampsAndWatermarks
from epochstream.state.backends.base import SnapshotTarget
from epochstream.state.handles import OperatorRestore

__all__ = ["DEAD_LETTER", "ENUMERATOR", "SinkOperator", "SourceOperator"]

#: Side-output tag of records a source could not decode.
DEAD_LETTER = "dead_letter"
SPLITS = "splits"
#: Union-list state holding the job master's enumerator state (read back by the job master).
ENUMERATOR = "enumerator"
TXNS = "txns"


class SourceOperator(Operator):
    """Drives a :class:`SourceReader`; the head of a source task's chain.

    With a watermark strategy (``from_source(..., watermark_strategy=)``) records get
    their timestamps here and watermarks are generated per split (see
    :mod:`epochstream.runtime.watermarks`); otherwise records go out as they are.
    """

    reader: SourceReader

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.source: Source = spec.payload
        self._restored_splits: list[Any] | None = None
        #: The job master's enumerator state sent with the checkpoint being taken
        #: (subtask 0 only); stored as union-list state next to the split positions.
        self.enumerator_state: Any = None
        self._dead: list[Any] = []
        self._timestamps: TimestampsAndWatermarks | None = None
        # The reader ran out of splits and the job master was asked for one.
        self._asked = False
        self._columnar = bool(getattr(self.source, "columnar", False))

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        if restore is not None and SPLITS in restore.operator_lists:
            self._restored_splits = list(restore.operator_lists[SPLITS])

    def open(self) -> None:
        has_dead_letter = DEAD_LETTER in self.side_outputs
        self.reader = self.source.create_reader(
            SourceContext(
                subtask_index=self.ctx.subtask_index,
                parallelism=self.ctx.parallelism,
                clock=self.ctx.clock,
                dead_letter=self._dead.append if has_dead_letter else None,
            )
        )
        self._snapshot_reader = _reader_snapshot(self.reader)
        strategy = self.spec.watermark_strategy
        if strategy is not None:
            self._timestamps = TimestampsAndWatermarks(
                strategy,
                f"source {self.spec.name!r} ({self.ctx.task_name})",
                lambda records, timestamps: self.output.collect(records, timestamps),
                self.emit_watermark,
                self.emit_status,
                now_ms=self.ctx.clock_ms,
                interval_ms=self.ctx.watermark_interval_ms,
            )

    def assign_splits(self, initial: list[Any] | None) -> None:
        """Give the reader its splits: the restored ones if any, else the initial assignment."""
        splits = self._restored_splits if self._restored_splits is not None else (initial or [])
        self.add_splits(list(splits))

    def add_splits(self, splits: list[Any]) -> None:
        """Hand ``splits`` (initial, restored or requested) to the reader."""
        self.reader.add_splits(splits)
        self._asked = False
        if self._timestamps is not None:
            if type(self.reader).poll_splits is SourceReader.poll_splits:
                # The reader does not tell splits apart: one watermark for all it reads.
                self._timestamps.add_split(None)
            else:
                for split in splits:
                    self._timestamps.add_split(split.split_id)

    def poll(self, max_records: int) -> int:
        """Read up to ``max_records`` and emit them; returns how many were read."""
        timestamps = self._timestamps
        if timestamps is None:
            records = self.reader.poll(max_records)
            count = len(records)
            if records:
                self.output.collect(plain_types(records) if self._columnar else records, None)
        else:
            count = 0
            for group in self.reader.poll_splits(max_records):
                split_id, records, finished = group[0], group[1], group[2]
                # A fourth element: the records' own timestamps (Kafka's), which the
                # watermark strategy's assigner gets as the previous timestamp.
                previous = group[3] if len(group) > 3 else None
                timestamps.process(
                    split_id, plain_types(records) if self._columnar else records, previous
                )
                if finished:
                    timestamps.finish_split(split_id)
                count += len(records)
        if self._dead:
            dead, self._dead = self._dead, []
            self.side_outputs[DEAD_LETTER].collect(dead, None)
        return count

    def emit_watermark(self, watermark: int) -> None:
        """Send ``watermark`` on; the task's metrics show it as the source's watermark."""
        self.counters.watermark = watermark
        super().emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        if self._timestamps is not None:
            self._timestamps.on_processing_time(now_ms)

    def end_of_input(self) -> None:
        """Every split is read: event time is complete (windows downstream fire)."""
        if self._timestamps is not None:
            self._timestamps.end_of_input()
        else:
            self.emit_watermark(MAX_WATERMARK)

    @property
    def exhausted(self) -> bool:
        return self.reader.exhausted

    def should_request_split(self) -> bool:
        """True once each time the reader runs out of splits (:attr:`SourceReader.needs_splits`):
        the task then asks the job master for one. Checked when a poll read nothing."""
        if self._asked or not self.reader.needs_splits:
            return False
        self._asked = True
        return True

    def next_available(self) -> float | None:
        return self.reader.next_available()

    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        state, self.enumerator_state = self.enumerator_state, None
        return SnapshotParts(
            operator_lists={SPLITS: list(self._snapshot_reader(target.checkpoint_id))},
            union_lists={ENUMERATOR: [state]} if state is not None else {},
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.reader.notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        reader = getattr(self, "reader", None)
        if reader is not None:
            reader.close()


class SinkOperator(Operator):
    """Feeds a :class:`SinkWriter`; two-phase-commit writers pre-commit at the snapshot."""

    writer: SinkWriter

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.sink: Sink = spec.payload
        self._restored: list[Any] = []

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        if restore is not None:
            self._restored = list(restore.union_lists.get(TXNS, []))

    def open(self) -> None:
        self.writer = self.sink.create_writer(
            SinkContext(
                subtask_index=self.ctx.subtask_index,
                parallelism=self.ctx.parallelism,
                attempt=self.ctx.attempt,
                job_id=self.ctx.job_id,
                checkpointing=self.ctx.checkpointing,
                console=self.ctx.console,
            )
        )
        self.writer.restore(self._restored)
        self._restored = []

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        self.writer.write_batch(records)

    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        return SnapshotParts(union_lists={TXNS: list(self.writer.snapshot(target.checkpoint_id))})

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.writer.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.writer.notify_checkpoint_aborted(checkpoint_id)

    def end_input(self) -> None:
        self.writer.end_input()

    def abandon_checkpoints_above(self, checkpoint_id: int) -> None:
        """The attempt was cancelled; no checkpoint above ``checkpoint_id`` completes."""
        writer = getattr(self, "writer", None)
        if writer is not None:
            writer.abandon_checkpoints_above(checkpoint_id)

    def close(self) -> None:
        writer = getattr(self, "writer", None)
        if writer is not None:
            writer.close()


def _reader_snapshot(reader: SourceReader) -> Callable[[int], list[Any]]:
    """``reader.snapshot`` as a function of the checkpoint id. Readers written before
    the id was passed define ``snapshot(self)``; they keep working unchanged."""
    snapshot = reader.snapshot
    try:
        params = inspect.signature(snapshot).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: pass the id
        return snapshot
    if any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    ):
        return snapshot
    return lambda checkpoint_id: snapshot()  # type: ignore[call-arg]
