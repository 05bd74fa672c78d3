"""In-band control events that travel in the same FIFO channels as record batches.

A channel carries a sequence of items: a record batch (a plain ``list``) or one of
these events. Because events ride in band, their order relative to records is kept:
everything before barrier ``n`` on a channel belongs to checkpoint ``n``'s cut.

Example::

    items = [[1, 2, 3], CheckpointBarrier(4, 1700000000.0), [4, 5], END_OF_INPUT]
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["END_OF_INPUT", "CheckpointBarrier", "EndOfInput"]


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Separates the records of checkpoint ``checkpoint_id`` from those after it."""

    checkpoint_id: int
    timestamp: float


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The upstream subtask will send nothing more on this channel."""


END_OF_INPUT = EndOfInput()
