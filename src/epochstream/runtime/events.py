"""In-band control events that travel in the same FIFO channels as record batches.

A channel carries a sequence of items: a record batch (a plain ``list``) or one of
these events. Because events ride in band, their order relative to records is kept:
everything before barrier ``n`` on a channel belongs to checkpoint ``n``'s cut.

Example::

    items = [[1, 2, 3], CheckpointBarrier(4, 1700000000.0), [4, 5], END_OF_INPUT]
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["END_OF_INPUT", "CheckpointBarrier", "CheckpointOptions", "EndOfInput"]


@dataclass(frozen=True, slots=True)
class CheckpointOptions:
    """What kind of snapshot a barrier asks for.

    ``savepoint_dir``: set for a savepoint, written there in the canonical format.
    ``base_checkpoint_id``: the latest checkpoint completed when this one was triggered;
    incremental snapshots build on its files. ``terminate``: stop-with-savepoint, the
    sources emit nothing after this barrier.

    Example::

        CheckpointOptions(savepoint_dir="/sp/savepoint-3f2a-1", terminate=True)
    """

    savepoint_dir: str | None = None
    base_checkpoint_id: int | None = None
    terminate: bool = False

    @property
    def is_savepoint(self) -> bool:
        """True for a savepoint."""
        return self.savepoint_dir is not None


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Separates the records of checkpoint ``checkpoint_id`` from those after it."""

    checkpoint_id: int
    timestamp: float
    options: CheckpointOptions = field(default_factory=CheckpointOptions)


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The upstream subtask will send nothing more on this channel."""


END_OF_INPUT = EndOfInput()
