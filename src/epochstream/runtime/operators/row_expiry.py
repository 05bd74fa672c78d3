"""State TTL for rows kept in row tables (``table.exec.state.ttl``): each row carries
the processing time it was written, ``_written`` (int64 ms, the operator clock's), and
expires ``ttl_ms`` later (Flink's ``OnCreateAndWrite``; expired rows are never
returned).

Deleting expired rows must not scan the state: each write also files its distinct keys
in a queue table ``<table>_due`` (uint64 key ``_written``, the key column, the key
group), and at most every tenth of the TTL (:meth:`RowExpiry.cleanup_due`) the queue
is popped up to ``now - ttl`` (:meth:`RowExpiry.pop_due`), giving the keys whose rows
the operator pops, filters (:meth:`RowExpiry.live`) and appends back. A key written
again later stays queued by its later write. The queue rows go with their key's key
group, so a restore at another parallelism takes them along.

Example::

    expiry = RowExpiry(60_000, ctx.clock)
    now = expiry.now()
    rows = rows.append_column(WRITTEN_COLUMN, expiry.stamps(rows.num_rows, now))
    expiry.file(backend, "left", "k", keys, key_groups, now)
    if expiry.cleanup_due(now):
        due = expiry.pop_due(backend, "left", "k", now)   # (keys, key groups) or None
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.clock import Clock
from epochstream.runtime.operators.columnar_joins import distinct_keys
from epochstream.state.backends.base import KeyedStateBackend, RowSchema

__all__ = ["DUE_SUFFIX", "WRITTEN_COLUMN", "RowExpiry"]

#: A kept row's write time (processing time, int64 ms).
WRITTEN_COLUMN = "_written"
#: A table's queue of written keys is the table's name and this.
DUE_SUFFIX = "_due"
#: The queue's key group column (its key column is ``_written``, uint64).
_DUE_KG = "_due_kg"
#: Expired rows are deleted at most every this fraction of the TTL.
CLEANUP_FRACTION = 10


class RowExpiry:
    """The TTL of one operator's rows: ``ttl_ms`` (0: rows never expire) on ``clock``
    (see the module docstring)."""

    def __init__(self, ttl_ms: int, clock: Clock) -> None:
        self.ttl = ttl_ms
        self.clock = clock
        #: The processing time (ms) before which no cleanup runs.
        self.next_cleanup = 0

    def now(self) -> int:
        """The clock's processing time, in ms."""
        return int(self.clock.wall() * 1000)

    @staticmethod
    def stamps(rows: int, now: int) -> pa.Array:
        """The ``_written`` column of ``rows`` rows written at ``now``."""
        return pa.array(np.full(rows, now, dtype=np.int64))

    def live(self, rows: pa.Table, now: int) -> pa.Table:
        """``rows`` without the expired ones (all of them without a TTL)."""
        if not self.ttl or not rows.num_rows:
            return rows
        return rows.filter(pc.greater(rows.column(WRITTEN_COLUMN), now - self.ttl))

    def file(
        self,
        backend: KeyedStateBackend,
        table: str,
        key_column: str,
        keys: pa.Array,
        key_groups: np.ndarray,
        now: int,
    ) -> None:
        """Queue the distinct ``keys`` (of ``key_groups``) written to ``table`` at ``now``."""
        if not self.ttl or not len(keys):
            return
        due = pa.record_batch(
            {
                WRITTEN_COLUMN: pa.array(np.full(len(keys), now, dtype=np.uint64)),
                key_column: keys,
                _DUE_KG: pa.array(key_groups.astype(np.int64)),
            }
        )
        schema = RowSchema(due.schema, WRITTEN_COLUMN)
        queue = backend.row_table(table + DUE_SUFFIX, schema)
        assert queue is not None
        queue.append(queue.schema.conform(due), key_groups)

    def cleanup_due(self, now: int) -> bool:
        """Whether a cleanup runs at ``now`` (a TTL is set and a tenth of it passed
        since the last one); if so the next one is a tenth of the TTL away."""
        if not self.ttl or now < self.next_cleanup:
            return False
        self.next_cleanup = now + max(self.ttl // CLEANUP_FRACTION, 1)
        return True

    def pop_due(
        self, backend: KeyedStateBackend, table: str, key_column: str, now: int
    ) -> tuple[pa.Array, np.ndarray] | None:
        """The distinct keys (and key groups) of ``table`` written at ``now - ttl`` or
        before, taken off its queue; None when there are none."""
        queue = backend.row_table(table + DUE_SUFFIX)
        if queue is None:
            return None
        due = queue.pop_until(max(now - self.ttl, 0))
        if not due.num_rows:
            return None
        groups = np.asarray(due.column(_DUE_KG).to_numpy(zero_copy_only=False))
        return distinct_keys(due.column(key_column), groups)
