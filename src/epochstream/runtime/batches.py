"""Record batches as they travel between operators, channels and tasks.

A batch is a plain ``list`` of records when they carry no event timestamps (the
common, fastest case), or a :class:`TimedBatch`: the records plus a parallel list of
their timestamps (int milliseconds since the epoch; ``None`` for a record without
one). Operators receive the two parts separately (``process_batch(records,
timestamps)``) and emit them the same way, so an operator that keeps records one to
one (map, reduce) passes the timestamps list on without touching it.

On a hash edge the batch is a :class:`KeyedBatch`: the records, the key of each (the
writer computed them to route the records) and their timestamps or ``None``. The
receiving keyed operator takes the keys as they came (``process_keyed``) instead of
running the key selector a second time.

Example::

    batch = TimedBatch(["a", "b"], [1_000, 1_250])
    records, timestamps = batch
    keyed = KeyedBatch([("a", 1)], ["a"], None)
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["KeyedBatch", "TimedBatch", "split_item"]


class TimedBatch(NamedTuple):
    """Records and their event timestamps (same length; ``None`` = no timestamp)."""

    records: list[Any]
    timestamps: list[int | None]


class KeyedBatch(NamedTuple):
    """Records with their keys (same length) and timestamps (or ``None``), as a hash
    edge ships them.

    Example: ``KeyedBatch([("a", 1), ("b", 2)], ["a", "b"], None)``
    """

    records: list[Any]
    keys: list[Any]
    timestamps: list[int | None] | None


def split_item(
    item: list[Any] | TimedBatch | KeyedBatch,
) -> tuple[list[Any], list[int | None] | None]:
    """``(records, timestamps or None)`` of a batch in any form.

    Example: ``split_item([1, 2]) == ([1, 2], None)``
    """
    if type(item) is list:
        return item, None
    return item.records, item.timestamps  # type: ignore[union-attr]
