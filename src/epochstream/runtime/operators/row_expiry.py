"""State TTL for rows kept in row tables (``table.exec.state.ttl``): each row carries
the processing time it was written, ``_written`` (int64 ms, the operator clock's), and
expires ``ttl_ms`` later (Flink's ``OnCreateAndWrite``; expired rows are never
returned).

Deleting expired rows must not scan the state: each write also files its distinct keys
in a queue table ``<table>_due`` (uint64 key ``_written``, the key column, the key
group), and at most every tenth of the TTL (:meth:`RowExpiry.cleanup_due`) the queue
is popped up to ``now - ttl`` (:meth:`RowExpiry.pop_due`), giving the keys whose rows
the operator pops, filters (:meth:`RowExpiry.live`) and appends back
(:meth:`RowExpiry.expire` does all three for a table). A key written again later stays
queued by its later write. The queue rows go with their key's key group, so a restore
at another parallelism takes them along. A restored table is checked against the TTL
(:meth:`RowExpiry.check_restored`): turning the TTL on or off needs a new uid, as the
stamps are there or not.

Users: the regular join (rows of both sides), the ``GROUP BY`` without a window (its
groups; their values tables go with them) and the Top-N without a window (each
partition's rows).

Example::

    expiry = RowExpiry(60_000, ctx.clock)
    now = expiry.now()
    rows = rows.append_column(WRITTEN_COLUMN, expiry.stamps(rows.num_rows, now))
    expiry.file(backend, "left", "k", keys, key_groups, now)
    if expiry.cleanup_due(now):
        gone = expiry.expire(backend, "left", "k", now)   # keys with no live row left
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.clock import Clock
from epochstream.exceptions import StateError
from epochstream.runtime.operators.columnar_joins import distinct_keys
from epochstream.state.backends.base import KeyedStateBackend, RowSchema

__all__ = ["DUE_SUFFIX", "WRITTEN_COLUMN", "RowExpiry", "groups_of"]

#: A kept row's write time (processing time, int64 ms).
WRITTEN_COLUMN = "_written"
#: A table's queue of written keys is the table's name and this.
DUE_SUFFIX = "_due"
#: The queue's key group column (its key column is ``_written``, uint64).
_DUE_KG = "_due_kg"
#: Expired rows are deleted at most every this fraction of the TTL.
CLEANUP_FRACTION = 10


def groups_of(column: pa.Array | pa.ChunkedArray, keys: pa.Array, kgs: np.ndarray) -> np.ndarray:
    """The key group of each value of ``column`` (one of the distinct ``keys``, whose key
    groups are ``kgs``).

    Example: ``groups_of(pa.array([2, 1, 2]), pa.array([1, 2]), np.array([7, 9]))`` is
    ``[9, 7, 9]``
    """
    positions = pc.index_in(column, value_set=keys).to_numpy(zero_copy_only=False)
    return kgs[np.asarray(positions, dtype=np.int64)]


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

    def expire(
        self, backend: KeyedStateBackend, table: str, key_column: str, now: int
    ) -> tuple[pa.Array, np.ndarray] | None:
        """Delete ``table``'s expired rows: pop its due keys (:meth:`pop_due`), pop their
        rows and append the live ones back. Returns the due keys (and key groups) that
        have no live row left, for the operator's other tables of those keys; None when
        there are none.

        Example: ``gone = expiry.expire(backend, "groups", "k", now)``
        """
        due = self.pop_due(backend, table, key_column, now)
        rows = backend.row_table(table)
        # rows None: rescaled, the rows of these keys went, their queue stayed.
        if due is None or rows is None:
            return None
        keys, kgs = due
        live = self.live(rows.pop(keys, kgs), now)
        if live.num_rows:
            live_kgs = groups_of(live.column(key_column), keys, kgs)
            start = 0
            for batch in live.to_batches():
                rows.append(batch, live_kgs[start : start + batch.num_rows])
                start += batch.num_rows
        gone = ~np.asarray(
            pc.is_in(keys, value_set=live.column(key_column).combine_chunks()).to_numpy(
                zero_copy_only=False
            ),
            dtype=bool,
        )
        if not gone.any():
            return None
        return keys.filter(pa.array(gone)), kgs[gone]

    def check_restored(self, schema: pa.Schema, where: str, what: str) -> None:
        """A restored table's ``schema`` has the ``_written`` stamps if and only if a TTL
        is set: else a StateError (``what``: whose state, for the message), since
        switching the TTL on or off against kept state needs a new uid.

        Example: ``expiry.check_restored(table.schema.schema, "join (1/2)", "join")``
        """
        if (WRITTEN_COLUMN in schema.names) != (self.ttl > 0):
            raise StateError(
                f"{where}: the restored {what} state was written "
                f"{'with' if self.ttl == 0 else 'without'} a state TTL; switching "
                "table.exec.state.ttl on or off needs a new uid (or an empty state)"
            )
