"""Record batches as they travel between operators, channels and tasks.

A batch is a plain ``list`` of records when they carry no event timestamps (the
common, fastest case), or a :class:`TimedBatch`: the records plus a parallel list of
their timestamps (int milliseconds since the epoch; ``None`` for a record without
one). Operators receive the two parts separately (``process_batch(records,
timestamps)``) and emit them the same way, so an operator that keeps records one to
one (map, reduce) passes the timestamps list on without touching it.

Example::

    batch = TimedBatch(["a", "b"], [1_000, 1_250])
    records, timestamps = batch
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["TimedBatch", "split_item"]


class TimedBatch(NamedTuple):
    """Records and their event timestamps (same length; ``None`` = no timestamp)."""

    records: list[Any]
    timestamps: list[int | None]


def split_item(item: list[Any] | TimedBatch) -> tuple[list[Any], list[int | None] | None]:
    """``(records, timestamps or None)`` of a batch in either form.

    Example: ``split_item([1, 2]) == ([1, 2], None)``
    """
    if type(item) is list:
        return item, None
    return item.records, item.timestamps  # type: ignore[union-attr]
