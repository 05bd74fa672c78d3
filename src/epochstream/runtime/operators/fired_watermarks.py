"""Per key group, the watermark an event-time operator has fired up to, kept across a
restore: rows of a key group at or below it are late.

A subtask's watermark is one number, but after a rescale a subtask takes key groups
from several old subtasks, each fired up to its own watermark. So each snapshot files,
per key group of the subtask, the larger of its watermark and the restored mark in a
row table of the keyed-state backend (restored by key group like any keyed state),
and a restore reads them back.

Example::

    marks = FiredWatermarks("topn-fired", "_tn_group", "_tn_watermark")
    fired = marks.restore(backend, key_groups)        # None: nothing restored
    marks.file(backend, key_groups, watermark, fired)  # at each snapshot
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from epochstream.state.backends.base import KeyedStateBackend, RowSchema

__all__ = ["NO_WATERMARK", "FiredWatermarks"]

#: Below every watermark: a key group that never fired.
NO_WATERMARK = -(2**63)
_EVERY_GROUP = 2**64 - 1


class FiredWatermarks:
    """The row table ``table`` of ``(group_column, mark_column)`` rows (module docstring).

    Example: ``FiredWatermarks("over-fired", "_ov_group", "_ov_mark")``
    """

    def __init__(self, table: str, group_column: str, mark_column: str) -> None:
        self.table = table
        self._group, self._mark = group_column, mark_column
        self._schema = RowSchema(
            pa.schema([(group_column, pa.uint64()), (mark_column, pa.int64())]), group_column
        )

    def restore(self, keyed: KeyedStateBackend, key_groups: range) -> np.ndarray | None:
        """Per key group of ``key_groups`` (in order), the restored fired watermark
        (:data:`NO_WATERMARK` where none), or None when nothing was restored."""
        fired = keyed.row_table(self.table)
        if fired is None:
            return None
        marks = fired.table()
        out = np.full(len(key_groups), NO_WATERMARK, dtype=np.int64)
        slots = np.asarray(marks.column(self._group).to_numpy(), dtype=np.int64) - key_groups.start
        np.maximum.at(out, slots, np.asarray(marks.column(self._mark).to_numpy(), dtype=np.int64))
        return out

    def file(
        self,
        keyed: KeyedStateBackend,
        key_groups: range,
        watermark: int,
        restored: np.ndarray | None,
    ) -> None:
        """Replace the table's rows with each key group's mark: ``watermark``, or the
        restored mark where that is larger."""
        marks = np.full(len(key_groups), watermark, dtype=np.int64)
        if restored is not None:
            marks = np.maximum(marks, restored)
        table = keyed.row_table(self.table, self._schema)
        assert table is not None
        table.pop_until(_EVERY_GROUP)
        groups = np.arange(key_groups.start, key_groups.stop)
        rows = pa.record_batch(
            [pa.array(groups, pa.uint64()), pa.array(marks)], schema=self._schema.schema
        )
        table.append(rows, groups.astype(np.int32))
