"""In-band control events that travel in the same FIFO channels as record batches.

A channel carries a sequence of items: a record batch (a
:class:`~epochstream.runtime.batches.RowBatch` or a ``pyarrow.RecordBatch``) or one of
these events. Because events ride in band, their order relative to records is
kept: everything before barrier ``n`` on a channel belongs to checkpoint ``n``'s cut,
and a :class:`Watermark` promises the event time its channel has reached.

Example::

    items = [RowBatch([1, 2]), CheckpointBarrier(4, 1700000000.0), Watermark(5000), END_OF_INPUT]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = [
    "ACTIVE",
    "END_OF_INPUT",
    "IDLE",
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "CheckpointBarrier",
    "CheckpointOptions",
    "EndOfInput",
    "Watermark",
    "WatermarkStatus",
]

#: The watermark before any was seen (Flink's ``Long.MIN_VALUE``): no event time yet.
MIN_WATERMARK = -(2**63)
#: The watermark of an input that ended: every event-time timer and window may fire.
MAX_WATERMARK = 2**63 - 1


@dataclass(frozen=True, slots=True)
class CheckpointOptions:
    """What kind of snapshot a barrier asks for.

    ``savepoint_dir``: set for a savepoint, written there in the canonical format.
    ``base_checkpoint_id``: the latest checkpoint completed when this one was triggered;
    incremental snapshots build on its files. ``terminate``: stop-with-savepoint, the
    sources emit nothing after this barrier. ``unaligned``: the barrier may overtake
    queued records, which then become channel state; with ``aligned_timeout`` > 0 it
    travels aligned (in line with the records) until it is that many seconds old
    (:attr:`CheckpointBarrier.alignment_deadline`).

    Example::

        CheckpointOptions(savepoint_dir="/sp/savepoint-3f2a-1", terminate=True)
        CheckpointOptions(unaligned=True, aligned_timeout=0.5)
    """

    savepoint_dir: str | None = None
    base_checkpoint_id: int | None = None
    terminate: bool = False
    unaligned: bool = False
    aligned_timeout: float = 0.0

    @property
    def is_savepoint(self) -> bool:
        """True for a savepoint."""
        return self.savepoint_dir is not None


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Separates the records of checkpoint ``checkpoint_id`` from those after it.

    ``timestamp``: wall-clock seconds when the checkpoint was triggered.

    Example::

        CheckpointBarrier(3, time.time(), CheckpointOptions(unaligned=True)).overtakes
    """

    checkpoint_id: int
    timestamp: float
    options: CheckpointOptions = field(default_factory=CheckpointOptions)

    @property
    def overtakes(self) -> bool:
        """True when the barrier overtakes queued records now (unaligned, no timeout)."""
        return self.options.unaligned and not self.options.aligned_timeout

    @property
    def alignment_deadline(self) -> float | None:
        """Wall-clock second at which an aligned-with-timeout barrier turns unaligned."""
        options = self.options
        if options.unaligned and options.aligned_timeout:
            return self.timestamp + options.aligned_timeout
        return None

    def unaligned_now(self) -> CheckpointBarrier:
        """This barrier, turned unaligned (its alignment timed out)."""
        options = replace(self.options, aligned_timeout=0.0)
        return CheckpointBarrier(self.checkpoint_id, self.timestamp, options)


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The upstream subtask will send nothing more on this channel."""


END_OF_INPUT = EndOfInput()


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time has reached ``timestamp`` (int ms) on this channel: records after it
    with a timestamp at or below it are late.

    Example: ``Watermark(1_700_000_005_000)``
    """

    timestamp: int


@dataclass(frozen=True, slots=True)
class WatermarkStatus:
    """The channel went idle (sends no records or watermarks for now) or active again.

    An idle channel does not hold back the watermark of the task reading it.
    Example: ``WatermarkStatus(idle=True)``
    """

    idle: bool


IDLE = WatermarkStatus(idle=True)
ACTIVE = WatermarkStatus(idle=False)
