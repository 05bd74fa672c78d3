"""Watermarks in a task: combining its inputs', and generating them at sources.

:class:`WatermarkValve` is the input side of every task (Flink's status watermark
valve): it tracks each input channel's watermark and idleness and says when the
task's watermark, the minimum over the active channels, advances (it never goes
back) or when the whole task goes idle or active. Ended channels no longer count.

:class:`TimestampsAndWatermarks` is the generating side, used by sources and by
``assign_timestamps_and_watermarks``: it gives records their timestamps from the
strategy's assigner, feeds one watermark generator per split, and computes the
subtask's watermark as the minimum over its active splits. A record at or below the
watermark reached before it (a late record) gets that watermark sent ahead of it,
so every operator downstream classifies it as late exactly as if watermarks went out
after every record; otherwise watermarks go out at most every
``auto_watermark_interval`` ms, which keeps batches large.

Example::

    valve = WatermarkValve(num_channels=2)
    valve.on_watermark(0, 1000)       # (None, None): channel 1 has not advanced
    valve.on_watermark(1, 700)        # (700, None)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from epochstream.core.events import MAX_WATERMARK, MIN_WATERMARK
from epochstream.core.watermarks import WatermarkGenerator, WatermarkStrategy
from epochstream.exceptions import DataError, UserFunctionError, short_repr

__all__ = ["SplitTimestamps", "TimestampsAndWatermarks", "WatermarkValve"]


class WatermarkValve:
    """Per-channel watermarks and idleness of one task's inputs (see the module docstring)."""

    __slots__ = ("_ended", "_idle", "_marks", "current", "idle")

    def __init__(self, num_channels: int) -> None:
        self._marks = [MIN_WATERMARK] * num_channels
        self._idle = [False] * num_channels
        self._ended = [False] * num_channels
        #: The task's watermark (the last one it forwarded).
        self.current = MIN_WATERMARK
        #: True while every open input channel is idle.
        self.idle = False

    def on_watermark(self, channel: int, timestamp: int) -> tuple[int | None, bool | None]:
        """A watermark arrived on ``channel``; returns (the task's new watermark if it
        advanced, the task's new idleness if it changed: a watermark means active)."""
        if timestamp > self._marks[channel]:
            self._marks[channel] = timestamp
        if self._idle[channel]:
            self._idle[channel] = False
            return self._advance(), self._status_change()
        return self._advance(), None

    def on_status(self, channel: int, idle: bool) -> tuple[int | None, bool | None]:
        """``channel`` went idle or active; returns (new watermark or None, new task
        idleness or None when unchanged)."""
        self._idle[channel] = idle
        advanced = self._advance()
        return advanced, self._status_change()

    def on_end(self, channel: int) -> int | None:
        """``channel`` ended; returns the task's new watermark, if it advanced."""
        self._ended[channel] = True
        return self._advance()

    def _status_change(self) -> bool | None:
        open_channels = [i for i, ended in enumerate(self._ended) if not ended]
        now_idle = bool(open_channels) and all(self._idle[i] for i in open_channels)
        if now_idle != self.idle:
            self.idle = now_idle
            return now_idle
        return None

    def _advance(self) -> int | None:
        marks = [
            m
            for m, idle, ended in zip(self._marks, self._idle, self._ended, strict=True)
            if not idle and not ended
        ]
        if not marks:
            if all(self._ended):
                new = MAX_WATERMARK  # every input ended: all event time has passed
            else:
                return None  # idle inputs hold nothing back, and advance nothing either
        else:
            new = min(marks)
        if new > self.current:
            self.current = new
            return new
        return None


class SplitTimestamps:
    """Timestamps and the watermark generator of one split."""

    __slots__ = ("generator", "idle", "last_active_ms")

    def __init__(self, generator: WatermarkGenerator, now_ms: int) -> None:
        self.generator = generator
        self.last_active_ms = now_ms
        self.idle = False


class TimestampsAndWatermarks:
    """Assigns timestamps and generates watermarks over a subtask's splits.

    ``emit(records, timestamps)``, ``emit_watermark(ts)`` and ``emit_status(idle)`` are
    where results go (the operator's outputs). ``now_ms`` is processing time, for
    idleness and the emission interval.

    Example::

        tw = TimestampsAndWatermarks(strategy, "source 'events'", emit, emit_wm, emit_status,
                                     now_ms=clock_ms, interval_ms=200)
        tw.process("split-0", records, None)
        tw.on_processing_time(clock_ms())
    """

    def __init__(
        self,
        strategy: WatermarkStrategy,
        where: str,
        emit: Callable[[list[Any], list[Any]], None],
        emit_watermark: Callable[[int], None],
        emit_status: Callable[[bool], None],
        *,
        now_ms: Callable[[], int],
        interval_ms: int,
    ) -> None:
        self.strategy = strategy
        self.where = where
        self._emit = emit
        self._emit_watermark = emit_watermark
        self._emit_status = emit_status
        self._now_ms = now_ms
        self._interval = interval_ms
        self._splits: dict[Hashable, SplitTimestamps] = {}
        self._emitted = MIN_WATERMARK
        self._last_emit_ms = now_ms()
        self._idle = False
        self._assign = strategy.timestamp_assigner
        self._idle_timeout = strategy.idle_timeout_ms

    @property
    def watermark(self) -> int:
        """The last watermark sent downstream."""
        return self._emitted

    def _split(self, split_id: Hashable) -> SplitTimestamps:
        split = self._splits.get(split_id)
        if split is None:
            split = self._splits[split_id] = SplitTimestamps(
                self.strategy.create_generator(), self._now_ms()
            )
        return split

    def add_split(self, split_id: Hashable) -> None:
        """A split starts here: it holds back the watermark until it has records."""
        self._split(split_id)

    def finish_split(self, split_id: Hashable) -> None:
        """A split ended: it no longer holds back the watermark."""
        self._splits.pop(split_id, None)

    def _combined(self) -> int | None:
        marks = [s.generator.current_watermark() for s in self._splits.values() if not s.idle]
        return min(marks) if marks else None

    def _timestamps(self, records: list[Any], previous: list[Any] | None) -> list[int]:
        assign = self._assign
        if assign is None:
            if previous is None:
                raise DataError(
                    f"{self.where}: records carry no timestamps and the watermark strategy "
                    "has no timestamp assigner: add .with_timestamp_assigner(fn)"
                )
            timestamps = previous
        else:
            record = None
            try:
                if previous is None:
                    timestamps = [assign(record, None) for record in records]
                else:
                    timestamps = [
                        assign(record, p) for record, p in zip(records, previous, strict=True)
                    ]
            except Exception as exc:
                raise UserFunctionError(f"{self.where} timestamp assigner", record, exc) from exc
        if set(map(type, timestamps)) != {int}:
            for record, ts in zip(records, timestamps, strict=True):
                if type(ts) is not int:
                    raise DataError(
                        f"{self.where}: the timestamp of record {short_repr(record)} is "
                        f"{type(ts).__name__} {ts!r}; timestamps are int milliseconds since "
                        "the epoch (for seconds s, return int(s * 1000))"
                    )
        return timestamps

    def process(self, split_id: Hashable, records: list[Any], previous: list[Any] | None) -> None:
        """Timestamp ``records`` of ``split_id``, emit them, and watermarks as needed."""
        if not len(records):
            return
        if type(records) is not list:
            self._process_columnar(split_id, records)
            return
        split = self._split(split_id)
        timestamps = self._timestamps(records, previous)
        split.last_active_ms = self._now_ms()
        if split.idle:
            split.idle = False
        if self._idle:
            self._idle = False
            self._emit_status(False)
        late = split.generator.on_batch(records, timestamps)
        start = 0
        for index, split_mark in late:
            # The record is late for its split; send the subtask's watermark at that
            # point ahead of it (the other splits may hold it lower).
            others = [
                s.generator.current_watermark()
                for sid, s in self._splits.items()
                if sid != split_id and not s.idle
            ]
            mark = min([split_mark, *others])
            if mark > self._emitted:
                if index > start:
                    self._emit(records[start:index], timestamps[start:index])
                    start = index
                self._send(mark)
        if start == 0:
            self._emit(records, timestamps)
        else:
            self._emit(records[start:], timestamps[start:])
        self._maybe_send()

    def _process_columnar(self, split_id: Hashable, batch: Any) -> None:
        """A record batch: ``_ts`` from the strategy's timestamp column, the split's
        generator advanced by the batch's largest timestamp (a batch is not split
        around late rows; they stay in it, behind the watermark already sent)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        column = self.strategy.timestamp_column
        names = batch.schema.names
        if column is None or column not in names:
            raise DataError(
                f"{self.where}: a columnar source needs the watermark strategy's timestamp "
                f"column: add .with_timestamp_column(name) naming one of {', '.join(names)}"
                + ("" if column is None else f" (there is no column {column!r})")
            )
        ts = batch.column(column)
        if pa.types.is_timestamp(ts.type) and not ts.null_count:
            ts = epoch_ms(ts)
        elif not pa.types.is_integer(ts.type) or ts.null_count:
            raise DataError(
                f"{self.where}: split {split_id}: timestamp column {column!r} is {ts.type}"
                + (f" with {ts.null_count} nulls" if ts.null_count else "")
                + "; event time is int milliseconds since the epoch (or an Arrow timestamp)"
            )
        ts = ts.cast(pa.int64())
        index = batch.schema.get_field_index("_ts")
        batch = batch.set_column(index, "_ts", ts) if index >= 0 else batch.append_column("_ts", ts)
        split = self._split(split_id)
        split.last_active_ms = self._now_ms()
        split.idle = False
        if self._idle:
            self._idle = False
            self._emit_status(False)
        split.generator.on_event(None, int(pc.max(ts).as_py()))
        self._emit(batch, None)  # type: ignore[arg-type]
        self._maybe_send()

    def _maybe_send(self) -> None:
        now = self._now_ms()
        if now - self._last_emit_ms < self._interval:
            return
        mark = self._combined()
        if mark is not None and mark > self._emitted:
            self._send(mark)
        self._last_emit_ms = now

    def _send(self, mark: int) -> None:
        self._emitted = mark
        self._emit_watermark(mark)

    def on_processing_time(self, now_ms: int) -> None:
        """Idleness and periodic emission when no records come."""
        if self._emitted == MAX_WATERMARK:
            return  # event time is complete: nothing follows the final watermark
        if not self._splits:
            # No split to read (more subtasks than splits): nothing to wait for here.
            if not self._idle:
                self._idle = True
                self._emit_status(True)
            return
        timeout = self._idle_timeout
        if timeout is not None:
            for split in self._splits.values():
                if not split.idle and now_ms - split.last_active_ms >= timeout:
                    split.idle = True
            if self._splits and all(s.idle for s in self._splits.values()) and not self._idle:
                self._idle = True
                self._emit_status(True)
                return
        self._maybe_send()

    def flush(self) -> None:
        """Send the current watermark now if it advanced (end of input, checkpoints)."""
        mark = self._combined()
        if mark is not None and mark > self._emitted:
            self._send(mark)
            self._last_emit_ms = self._now_ms()

    def end_of_input(self) -> None:
        """All splits ended: event time is complete."""
        if self._emitted < MAX_WATERMARK:
            self._send(MAX_WATERMARK)


# Ticks of each Arrow timestamp unit per millisecond (seconds are multiplied instead).
_TICKS_PER_MS = {"ms": 1, "us": 1_000, "ns": 1_000_000}


def epoch_ms(ts: Any) -> Any:
    """An Arrow timestamp array without nulls as int64 milliseconds since the epoch,
    floored: a row at 1.5 ms is in millisecond 1, one at -0.5 ms in millisecond -1 (so
    it falls in the window before the epoch, as a floor of its time should). Parquet
    written by pandas or Spark holds microseconds, and a plain cast to milliseconds
    refuses any sub-millisecond value.

    Example: ``epoch_ms(pa.array([1_500], pa.timestamp("us"))).to_pylist() == [1]``
    """
    import pyarrow as pa

    ticks = ts.cast(pa.int64())
    if ts.type.unit == "s":
        return pa.array(ticks.to_numpy() * 1000)
    per_ms = _TICKS_PER_MS[ts.type.unit]
    return ticks if per_ms == 1 else pa.array(ticks.to_numpy() // per_ms)
