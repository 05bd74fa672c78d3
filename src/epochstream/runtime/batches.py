"""Record batches as they travel between tasks: one of two forms.

- A :class:`RowBatch`: a list of records, with their event timestamps (a parallel list
  of int milliseconds since the epoch, ``None`` for a record without one; the whole
  list ``None`` when no record has one) and, on a hash edge, their keys (a parallel
  list: the writer computed them to route the records, so the keyed operator
  downstream takes them as they came instead of running the key selector again).
- A columnar batch: a ``pyarrow.RecordBatch`` (event timestamps in its ``_ts``
  column, key groups in ``_kg`` after a hash edge).

A writer ships one of the two, a channel carries it (a pickle, protocol 5, for rows;
Arrow IPC for columns) and the receiving task tests the form once per batch. Inside a
chain, operators take the parts (``process_batch(records, timestamps)``,
``process_keyed(records, keys, timestamps)``), so an operator that keeps records one
to one (map, reduce) passes the timestamps list on without touching it.

Example::

    batch = RowBatch(["a", "b"], [1_000, 1_250])
    keyed = RowBatch([("a", 1)], None, ["a"])
    len(batch), keyed.keys      # 2, ['a']
"""

from __future__ import annotations

from typing import Any

__all__ = ["RowBatch"]


class RowBatch:
    """Records, their timestamps (or ``None``) and their keys (or ``None``: not from a
    hash edge), all three lists of the same length.

    Example: ``RowBatch([("a", 1), ("b", 2)], [5, None], ["a", "b"])``
    """

    __slots__ = ("keys", "records", "timestamps")

    def __init__(
        self,
        records: list[Any],
        timestamps: list[int | None] | None = None,
        keys: list[Any] | None = None,
    ) -> None:
        self.records = records
        self.timestamps = timestamps
        self.keys = keys

    def __len__(self) -> int:
        return len(self.records)

    def __reduce__(self) -> tuple[type[RowBatch], tuple[Any, Any, Any]]:
        # Three lists in one tuple: the frame is the lists' pickle and a class reference.
        return RowBatch, (self.records, self.timestamps, self.keys)

    def __eq__(self, other: object) -> bool:
        if type(other) is not RowBatch:
            return NotImplemented
        return (self.records, self.timestamps, self.keys) == (
            other.records,
            other.timestamps,
            other.keys,
        )

    __hash__ = None  # type: ignore[assignment]  # lists inside: not hashable

    def __repr__(self) -> str:
        return f"RowBatch({self.records!r}, {self.timestamps!r}, {self.keys!r})"
