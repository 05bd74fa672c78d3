"""Flink SQL's Top-N without a window on batches: ``ROW_NUMBER() OVER (PARTITION BY
p... ORDER BY o...) <= n`` over an append-only input, an updating result.

Per partition the operator keeps the first ``n`` rows so far (a row outside them can
never come back: the input only adds), in a row table of the job's keyed-state backend
keyed by the partition key (:class:`GroupKeys`), each row with its arrival number
``_tn_seq`` (ties rank by arrival, the earlier first, as Flink's ``AppendOnlyTopNFunction``
ranks them). A batch pops the partitions it touches, ranks their kept rows with its
own (:func:`rank_rows`) and writes the first ``n`` back; what changed comes out as a
changelog (:mod:`epochstream.core.changelog`):

- with the row number column (``rank_column``): per (partition, row number) whose row
  changed, ``-U`` of the old row and ``+U`` of the new, or ``+I`` for a row number
  filled the first time (the unique key is partition and row number, as in Flink);
- without it, ``n == 1`` (deduplication, Nexmark q9 and q18): ``-U``/``+U`` of the
  partition's row when it changes, ``+I`` for its first (unique key: the partition);
- without it, ``n > 1`` (q19): ``-D`` for each row pushed out, ``+I`` for each row let
  in (no unique key: for ``print``, ``blackhole`` or ``to_changelog()``).

**State TTL** (``TopNSpec.state_ttl_ms > 0``, Flink's ``table.exec.state.ttl``;
:class:`~.row_expiry.RowExpiry`, the regular join's): every batch that touches a
partition writes its rows back stamped ``_written`` (processing time), so a partition's
rows expire together ``state_ttl_ms`` after it was last written. An expired partition
is gone (expiry emits nothing) and starts fresh: its next rows come out as ``+I`` (the
downstream may still hold the old ones: Flink's loss of results under a TTL). Expired
rows are deleted by the queue table ``top_due``, at most every tenth of the TTL, on
batches and watermarks.

Example::

    op = create_operator(spec, ctx)   # payload TopNSpec(("auction",), (("price", "desc"),), 1)
    op.process_batch(pa.record_batch({"auction": [1], "price": [5]}), None)   # +I 1, 5
    op.process_batch(pa.record_batch({"auction": [1], "price": [9]}), None)   # -U 1, 5; +U 1, 9
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.arrow import table_batch
from epochstream.core.changelog import OP, RowKind
from epochstream.exceptions import DataError, StateError
from epochstream.graph.specs import TopNSpec
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.operators.columnar_aggregates import own_backend
from epochstream.runtime.operators.columnar_group_keys import TUPLE_KEY, GroupKeys, key_slots
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.runtime.operators.columnar_window_topn import rank_rows
from epochstream.runtime.operators.row_expiry import DUE_SUFFIX, WRITTEN_COLUMN, RowExpiry
from epochstream.state.backends.base import RowSchema, RowTable
from epochstream.state.columnar_checks import require_columns
from epochstream.state.handles import OperatorRestore

__all__ = ["ColumnarTopNOperator"]

#: The row table of each partition's first n rows, and their arrival numbers.
_TOP, _SEQ = "top", "_tn_seq"
#: A row's partition among a batch's (a column of the ranked table only).
_SLOT = "_tn_slot"


class ColumnarTopNOperator(Operator):
    """Top-N per partition of an append-only input, as a changelog (see the module
    docstring).

    Output batches: the input's columns (without ``_ts`` and ``_kg``), the row number
    column (int64) when ``rank_column`` is set, and ``_op``.

    Example::

        op = create_operator(spec, ctx)   # kind "columnar_top_n"
        op.process_batch(pa.record_batch({"auction": [1, 1], "price": [5, 9]}), None)
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        self.topn: TopNSpec = spec.payload
        self._where = ctx.task_name
        self._keys = GroupKeys(self.topn.partition_by, self._where, ctx.max_parallelism)
        self._types: dict[str, pa.DataType] = {}
        self._table: RowTable | None = None
        #: The state TTL: ``_written`` stamps on ``top`` and their due queue.
        self.expiry = RowExpiry(self.topn.state_ttl_ms, ctx.clock)

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        own = {_TOP, _TOP + DUE_SUFFIX}
        other = [n for n in self.keyed.row_tables() if n not in own] + self.keyed.column_tables()
        if other:
            raise StateError(
                f"{self._where}: restored state is not a Top-N's (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )
        table = self.keyed.row_table(_TOP)
        if table is None:
            return
        schema = table.schema.schema
        self.expiry.check_restored(schema, self._where, "Top-N")
        needed = {*self.topn.partition_by, *(c for c, _ in self.topn.order_by), _SEQ}
        if not needed <= set(schema.names):
            raise StateError(
                f"{self._where}: restored state does not hold this query's partition and "
                "order columns (it was written by another query); give the new operator "
                "another uid"
            )
        for name in self.topn.partition_by:
            self._types.setdefault(name, schema.field(name).type)
        self._table = table

    def _check(self, batch: pa.RecordBatch) -> None:
        if OP in batch.schema.names:
            raise DataError(
                f"{self._where}: the input is a changelog (it has an {OP!r} column); a "
                "Top-N takes an append-only input"
            )
        order = tuple(c for c, _ in self.topn.order_by)
        require_columns(batch.schema, (*self.topn.partition_by, *order), self._where)
        if self.expiry.ttl and WRITTEN_COLUMN in batch.schema.names:
            raise DataError(
                f"{self._where}: the input has a column {WRITTEN_COLUMN!r}, the name a Top-N "
                "with a state TTL keeps its rows' write times under; rename it"
            )
        rank = self.topn.rank_column
        if rank is not None and rank in batch.schema.names:
            raise DataError(
                f"{self._where}: the input has a column {rank!r} already, the Top-N's rank "
                "column; name the rank column otherwise"
            )

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        self._check(batch)
        now = self.expiry.now()
        self._cleanup(now)
        found = self._keys.of(batch, self._types)
        for name, column in found.columns.items():
            self._types.setdefault(name, column.type)
        kept_names = [n for n in batch.schema.names if n not in (KG_COLUMN, TS_COLUMN)]
        rows = pa.table({**{n: batch.column(n) for n in kept_names}, **found.columns}).select(
            kept_names
        )
        if self._keys.state_key == TUPLE_KEY:  # the state's key of several columns
            rows = rows.append_column(TUPLE_KEY, found.keys.take(pa.array(found.slots)))
        held = self._table.pop(found.keys, found.key_groups) if self._table is not None else None
        if held is not None:  # expired partitions were popped and are not written back
            held = self.expiry.live(held, now)
        n_held = held.num_rows if held is not None else 0
        # Later rows number after every held one of these partitions: ties rank by arrival.
        base = int(np.max(held.column(_SEQ).to_numpy())) + 1 if held is not None and n_held else 0
        rows = rows.append_column(_SEQ, pa.array(np.arange(batch.num_rows) + base, pa.int64()))
        slots = found.slots
        if held is not None and n_held:
            held_slots = key_slots(held.column(self._keys.state_key), found.keys)
            rows = pa.concat_tables([held.select(rows.schema.names), rows])
            slots = np.concatenate([held_slots, slots])
        # Arrival order is position order: rank_rows breaks ties by position.
        rows = rows.append_column(_SLOT, pa.array(slots))
        order = np.argsort(rows.column(_SEQ).to_numpy(), kind="stable")
        rows = rows.take(pa.array(order))
        top_at, top_ranks = rank_rows(rows, [_SLOT], self.topn.order_by, self.topn.n)
        old_mask = rows.column(_SEQ).to_numpy() < base
        old_at, old_ranks = rank_rows(
            rows.filter(pa.array(old_mask)), [_SLOT], self.topn.order_by, self.topn.n
        )
        old_at = np.flatnonzero(old_mask)[old_at]
        top = rows.take(pa.array(top_at))
        stored = top.drop_columns([_SLOT])
        if self.expiry.ttl:
            stored = stored.append_column(WRITTEN_COLUMN, self.expiry.stamps(stored.num_rows, now))
        kgs = found.key_groups[top.column(_SLOT).to_numpy()]
        self._store(stored, kgs)
        assert self.keyed is not None
        self.expiry.file(self.keyed, _TOP, self._keys.state_key, found.keys, found.key_groups, now)
        self._emit(rows, old_at, old_ranks, top_at, top_ranks)

    def _cleanup(self, now: int) -> None:
        """Delete the expired partitions' rows (at most every tenth of the TTL)."""
        if self.expiry.cleanup_due(now):
            assert self.keyed is not None
            self.expiry.expire(self.keyed, _TOP, self._keys.state_key, now)

    def process_watermark(self, watermark: int) -> None:
        self._cleanup(self.expiry.now())
        self.emit_watermark(watermark)

    def _store(self, stored: pa.Table, kgs: np.ndarray) -> None:
        if self._table is None:
            assert self.keyed is not None
            schema = pa.schema([f.with_nullable(True) for f in stored.schema])
            self._table = self.keyed.row_table(_TOP, RowSchema(schema, self._keys.state_key))
        assert self._table is not None
        if stored.num_rows:
            self._table.append(table_batch(stored), kgs)

    def _emit(
        self,
        rows: pa.Table,
        old_at: np.ndarray,
        old_ranks: np.ndarray,
        new_at: np.ndarray,
        new_ranks: np.ndarray,
    ) -> None:
        """The changes from the partitions' old first rows (positions ``old_at`` in
        ``rows``, ranks ``old_ranks``) to the new ones."""
        slots = rows.column(_SLOT).to_numpy()
        out_names = [n for n in rows.schema.names if n not in (_SEQ, _SLOT, TUPLE_KEY)]
        rank = self.topn.rank_column
        if rank is not None:
            # By (partition, row number): the row there before, and the row there now.
            n = self.topn.n
            before = dict(
                zip((slots[old_at] * n + old_ranks - 1).tolist(), old_at.tolist(), strict=True)
            )
            after = dict(
                zip((slots[new_at] * n + new_ranks - 1).tolist(), new_at.tolist(), strict=True)
            )
            retract = [
                (before[k], k % n + 1) for k in after if k in before and before[k] != after[k]
            ]
            add = [
                (after[k], k % n + 1, RowKind.UPDATE_AFTER if k in before else RowKind.INSERT)
                for k in after
                if before.get(k) != after[k]
            ]
            parts = []
            if retract:
                at, ranks = zip(*retract, strict=True)
                parts.append(self._changes(rows, out_names, at, ranks, RowKind.UPDATE_BEFORE))
            if add:
                at, ranks, kinds = zip(*add, strict=True)
                parts.append(self._changes(rows, out_names, at, ranks, kinds))
        else:
            gone = np.setdiff1d(old_at, new_at)
            came = np.setdiff1d(new_at, old_at)
            parts = []
            if self.topn.n == 1:
                had = np.zeros(int(slots.max()) + 1 if len(slots) else 0, dtype=bool)
                had[slots[old_at]] = True
                if len(gone):
                    parts.append(self._changes(rows, out_names, gone, None, RowKind.UPDATE_BEFORE))
                if len(came):
                    updated = np.where(had[slots[came]], RowKind.UPDATE_AFTER, RowKind.INSERT)
                    parts.append(self._changes(rows, out_names, came, None, updated))
            else:
                if len(gone):
                    parts.append(self._changes(rows, out_names, gone, None, RowKind.DELETE))
                if len(came):
                    parts.append(self._changes(rows, out_names, came, None, RowKind.INSERT))
        if parts:
            self.output.collect(pa.concat_batches(parts) if len(parts) > 1 else parts[0], None)

    def _changes(
        self, rows: pa.Table, names: list[str], at: Any, ranks: Any, kinds: Any
    ) -> pa.RecordBatch:
        picked = rows.select(names).take(pa.array(np.asarray(at, dtype=np.int64)))
        columns = [c.combine_chunks() for c in picked.columns]
        out = list(names)
        if self.topn.rank_column is not None:
            columns.append(pa.array(np.asarray(ranks, dtype=np.int64)))
            out.append(self.topn.rank_column)
        if not self.topn.by_arrival:  # by arrival, a kept row stays: inserts only
            ops = np.broadcast_to(np.asarray(kinds, dtype=np.int8), (picked.num_rows,))
            columns.append(pa.array(ops, pa.int8()))
            out.append(OP)
        return pa.record_batch(columns, names=out)

    def state_table(self) -> pa.Table:
        """Each partition's first rows (``_kg``, the columns, ``_tn_seq``): tests, tools."""
        if self._table is None:
            return pa.table({KG_COLUMN: pa.array([], pa.int32())})
        return self._table.table()
