"""The columnar regular join (kind ``columnar_regular_join``, payload
:class:`~epochstream.graph.specs.EquiJoinSpec` without retention): Flink SQL's
unbounded equi-join (``StreamingJoinOperator``), inner or LEFT/RIGHT/FULL OUTER, over
append-only or updating inputs, with an optional residual condition and state TTL.

Both inputs arrive hash-partitioned by the key group of their key columns. Each side
keeps its rows (the key, output and ``_ts`` columns; ``_written``, the processing time
of the write, with a TTL) in the row table ``left`` or ``right`` of the keyed-state
backend, filed under the key column or ``_join_key`` (the key tuple's ``encode_key``
bytes), as the interval join does (:class:`~.columnar_equi_join.JoinSides`). A batch's
rows are applied in order per key: a key's consecutive rows of one direction (adds:
``+I``/``+U``; retractions: ``-U``/``-D``) form one step, and the rows of one step
over all keys are joined at once (Arrow's hash join, :class:`~.columnar_equi_join.JoinPairs`).

- An add is joined with the other side's rows of its key: ``+I`` joined rows; on an
  outer side, ``+I`` of it padded with nulls when nothing matched; when the other side
  is outer, ``-D`` of the other rows' padded rows whose match count goes from 0 to 1.
  Then it is kept.
- A retraction removes one equal row (all kept columns but ``_written`` equal) from its
  side's state and emits ``-D`` of its joined rows (of its padded row when nothing
  matched, on an outer side); when the other side is outer, ``+I`` of the padded rows
  of the other rows it met that have no match left.

Match counts are counted when needed (pairs of the key's kept rows on both sides that
meet the condition), not stored. A row with a null key never matches: on an outer side
it is emitted padded (``+I`` or ``-D``) and not kept; on an inner side dropped. Joined
rows come out as ``+I``/``-D`` (as Flink's outer joins; its inner join passes the
input's kind on, the same multiset). The
output carries ``_op`` (and no ``_ts``) when the spec's ``changelog`` is set (an outer
join or an updating input); an inner join of append-only inputs emits plain inserts
stamped with ``_ts``, the later of the pair's event times (the one side's that has
them; none without).

**State TTL** (``state_ttl_ms > 0``, :class:`~.row_expiry.RowExpiry`): a row expires
``state_ttl_ms`` after it was written (Flink's ``OnCreateAndWrite``), on the operator
clock's processing time. An expired row is never read (reads filter on ``_written``),
emits nothing when it goes, and is deleted: every write also files its keys in
``left_due``/``right_due`` (a queue by write time); at most every tenth of the TTL a
batch or watermark pops the due keys and drops their expired rows, so the state holds
about TTL x 1.1 of writes.
A row that expired no longer joins, nor is it retracted: results for keys idle longer
than the TTL are lost or stay. A retraction of an expired row emits ``-D`` of its
joined rows with the partners still kept, and their padded rows when they have no
match left. Match counts are over the kept rows (Flink stores a count per row), so when
all matches of an outer row expired, its next match retracts a padded row that was
never emitted again.

Example::

    op = create_operator(spec, ctx)   # spec.payload = EquiJoinSpec(..., join_type="left")
    op.process_input(0, left, None)   # +I (l, null)
    op.process_input(1, right, None)  # -D (l, null), +I (l, r)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.changelog import OP, RowKind, weights, with_kinds
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import EquiJoinSpec
from epochstream.runtime.operators.columnar_aggregates import own_backend
from epochstream.runtime.operators.columnar_equi_join import (
    JOIN_KEY_COLUMN,
    JoinPairs,
    JoinSides,
    Matched,
)
from epochstream.runtime.operators.columnar_joins import JoinInputs, distinct_keys
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.runtime.operators.row_expiry import (
    DUE_SUFFIX,
    WRITTEN_COLUMN,
    RowExpiry,
    groups_of,
)
from epochstream.runtime.operators.twoinput import TwoInputOperator
from epochstream.state.backends.base import RowTable
from epochstream.state.column_keygroups import tuple_keys_of_columns
from epochstream.state.handles import OperatorRestore

__all__ = ["ColumnarStreamingJoinOperator"]

_SIDES = ("left", "right")


def _phases(keys: pa.Array, adds: np.ndarray) -> np.ndarray:
    """Each row's step: how often its key changed direction (add/retract) before it in
    the batch. Rows of one step have, per key, one direction, and the steps in order
    apply the batch in order (rows of other keys never interact).

    Example: ``_phases(pa.array([1, 1, 2, 1]), np.array([1, 0, 0, 0], bool))`` is
    ``[0, 1, 0, 1]``
    """
    codes = np.asarray(keys.dictionary_encode().indices.to_numpy(zero_copy_only=False))
    order = np.argsort(codes, kind="stable")  # each key's rows together, in batch order
    ordered_codes, ordered_adds = codes[order], adds[order]
    new_key = np.ones(len(order), dtype=bool)
    new_key[1:] = ordered_codes[1:] != ordered_codes[:-1]
    turned = np.zeros(len(order), dtype=np.int64)
    turned[1:] = (ordered_adds[1:] != ordered_adds[:-1]) & ~new_key[1:]
    running = np.cumsum(turned)
    # Each row's count minus the count at its key's first row.
    key_start = np.maximum.accumulate(np.where(new_key, np.arange(len(order)), 0))
    phases = np.empty(len(order), dtype=np.int64)
    phases[order] = running - running[key_start]
    return phases


class _Output:
    """The join's output batches of one step, in order: joined rows and null-padded
    rows with their row kinds, conformed to one schema."""

    def __init__(self, spec: EquiJoinSpec) -> None:
        self.spec = spec
        self.outputs = (spec.left_output, spec.right_output)
        self.parts: list[pa.RecordBatch] = []

    def joined(self, matched: Matched, kind: RowKind) -> None:
        self._add(matched.batch, kind)

    def padded(self, index: int, rows: pa.Table | pa.RecordBatch, kind: RowKind) -> None:
        """``rows`` of side ``index`` with the other side's output columns null."""
        if not rows.num_rows:
            return
        schema = self.spec.output_schema
        assert schema is not None  # EquiJoinSpec requires it of an outer join
        columns: dict[str, Any] = {}
        for side in (0, 1):
            for source, out in self.outputs[side]:
                kind_of = schema.field(out).type
                if side == index:
                    columns[out] = rows.column(source).cast(kind_of)
                else:
                    columns[out] = pa.nulls(rows.num_rows, kind_of)
        table = pa.table(columns)
        self._add(table.combine_chunks().to_batches()[0], kind)

    def _add(self, batch: pa.RecordBatch, kind: RowKind) -> None:
        if not batch.num_rows:
            return
        if not self.spec.changelog:
            self.parts.append(batch)
            return
        if TS_COLUMN in batch.schema.names:
            batch = batch.drop_columns([TS_COLUMN])
        schema = self.spec.output_schema
        if schema is not None:
            batch = batch.select(schema.names).cast(schema)
        self.parts.append(with_kinds(batch, np.full(batch.num_rows, kind, dtype=np.int8)))

    def take(self) -> pa.RecordBatch | None:
        """The step's rows as one batch (None: none), and a fresh start."""
        parts, self.parts = self.parts, []
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]


class ColumnarStreamingJoinOperator(TwoInputOperator):
    """Flink SQL's regular join, inner or outer, over append-only or updating inputs,
    with state TTL (see the module docstring).

    Example::

        op = create_operator(spec, ctx)    # kind "columnar_regular_join"
        op.process_input(0, left, None)
        op.process_input(1, right, None)   # emits the joined rows
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        #: The key groups of this subtask (those its backend holds).
        self.key_groups = self.keyed.key_group_range
        self.join: EquiJoinSpec = spec.payload
        if self.join.retention is not None:
            raise ConfigurationError(
                f"{ctx.task_name}: a join with retention is operator kind 'columnar_equi_join'"
            )
        reserved = {
            JOIN_KEY_COLUMN: "which the join keeps its composite keys under",
            WRITTEN_COLUMN: "which the join keeps each row's write time under",
        }
        self.inputs = JoinInputs(
            (self.join.left_keys, self.join.right_keys),
            reserved,
            ctx.task_name,
            ctx.max_parallelism,
        )
        self.sides = JoinSides(self.join)
        self.pairs = JoinPairs(self.join, ctx.task_name)
        self.out = _Output(self.join)
        self.expiry = RowExpiry(self.join.state_ttl_ms, ctx.clock)

    # ------------------------------------------------------------------ state

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        known = {*_SIDES, *(side + DUE_SUFFIX for side in _SIDES)}
        other = [*self.keyed.column_tables()]
        other += [n for n in self.keyed.row_tables() if n not in known]
        if other:
            raise StateError(
                f"{self.ctx.task_name}: restored state is not this join's (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )
        for index, side in enumerate(_SIDES):
            table = self.keyed.row_table(side)
            if table is None:
                continue
            schema = table.schema
            self.expiry.check_restored(schema.schema, self.ctx.task_name, "join")
            self.sides.schemas[index] = schema
            kinds = tuple(schema.schema.field(k).type for k in self.sides.keys[index])
            self.inputs.key_types[index] = kinds

    def _table(self, index: int, *, create: bool = False) -> RowTable | None:
        assert self.keyed is not None
        return self.keyed.row_table(_SIDES[index], self.sides.schemas[index] if create else None)

    def _read(self, index: int, keys: pa.Array, kgs: np.ndarray, now: int) -> pa.Table | None:
        """Side ``index``'s live rows of ``keys`` (None when it keeps none)."""
        table = self._table(index)
        if table is None:
            return None
        rows = self.expiry.live(table.read(keys, kgs), now)
        return rows if rows.num_rows else None

    def _keep(self, index: int, rows: pa.RecordBatch | pa.Table, kgs: np.ndarray) -> None:
        """Append ``rows`` to side ``index``'s table (``kgs``: per row); their
        ``_written`` stamps are kept as they are."""
        if not rows.num_rows:
            return
        table = self._table(index, create=True)
        assert table is not None
        batches = rows.to_batches() if isinstance(rows, pa.Table) else [rows]
        start = 0
        for batch in batches:
            table.append(batch, kgs[start : start + batch.num_rows])
            start += batch.num_rows

    def _cleanup(self, now: int) -> None:
        """Delete the rows that expired (at most every tenth of the TTL)."""
        if not self.expiry.cleanup_due(now):
            return
        assert self.keyed is not None
        for index, side in enumerate(_SIDES):
            self.expiry.expire(self.keyed, side, self.sides.key_column[index], now)

    # ------------------------------------------------------------------ input

    def process_input(self, index: int, records: Any, timestamps: list[Any] | None) -> None:
        batch = self.inputs.prepare(index, need_batch(self, records), drop_null_keys=False)
        if not batch.num_rows:
            return
        if OP in batch.schema.names and not self.join.updating_input:
            raise DataError(
                f"{self.ctx.task_name}: the {_SIDES[index]} input is a changelog (it has "
                f"{OP!r}) but the join was built for append-only inputs; build it with "
                "updating_input=True"
            )
        now = self.expiry.now()
        self._cleanup(now)
        adds = weights(batch) > 0
        valid = np.ones(batch.num_rows, dtype=bool)
        for key in self.sides.keys[index]:
            valid &= np.asarray(pc.is_valid(batch.column(key)).to_numpy(zero_copy_only=False))
        if not valid.all():
            if self.join.outer[index]:
                nulls = batch.filter(pa.array(~valid))
                null_adds = adds[~valid]
                self.out.padded(index, nulls.filter(pa.array(null_adds)), RowKind.INSERT)
                self.out.padded(index, nulls.filter(pa.array(~null_adds)), RowKind.DELETE)
                self._emit()
            batch, adds = batch.filter(pa.array(valid)), adds[valid]
            if not batch.num_rows:
                return
        kgs = np.asarray(batch.column(KG_COLUMN).to_numpy(zero_copy_only=False))
        extra = None
        if self.expiry.ttl:
            extra = {WRITTEN_COLUMN: self.expiry.stamps(batch.num_rows, now)}
        rows = self.sides.stored(index, batch, self.ctx.task_name, extra)
        phases = _phases(rows.column(self.sides.key_column[index]), adds)
        for phase in range(int(phases.max()) + 1):
            step = phases == phase
            for mask, add in ((step & adds, True), (step & ~adds, False)):
                if mask.any():
                    part = rows if mask.all() else rows.filter(pa.array(mask))
                    if add:
                        self._add(index, part, kgs[mask], now)
                    else:
                        self._retract(index, part, kgs[mask], now)
            self._emit()

    def _emit(self) -> None:
        batch = self.out.take()
        if batch is not None:
            self.output.collect(batch, None)

    def _match(self, index: int, mine: pa.Table, theirs: pa.Table) -> Matched | None:
        """Pairs of side ``index``'s rows ``mine`` with the other side's ``theirs``."""
        left, right = (mine, theirs) if index == 0 else (theirs, mine)
        return self.pairs.match(left, right)

    def _match_counts(self, index: int, mine: pa.Table | None, theirs: pa.Table) -> np.ndarray:
        """How many of ``mine`` (side ``index``) each row of ``theirs`` matches."""
        counts = np.zeros(theirs.num_rows, dtype=np.int64)
        if mine is None or not mine.num_rows:
            return counts
        matched = self._match(index, mine, theirs)
        if matched is not None:
            other = matched.right if index == 0 else matched.left
            np.add.at(counts, np.asarray(other.to_numpy(zero_copy_only=False)), 1)
        return counts

    def _add(self, index: int, rows: pa.RecordBatch, kgs: np.ndarray, now: int) -> None:
        keys, key_groups = distinct_keys(rows.column(self.sides.key_column[index]), kgs)
        theirs = self._read(1 - index, keys, key_groups, now)
        arriving = pa.Table.from_batches([rows])
        matched = None
        if theirs is not None:
            matched = self._match(index, arriving, theirs)
        mine_rows, their_rows = self._sides_of(index, matched)
        if theirs is not None and matched is not None and self.join.outer[1 - index]:
            # The other rows' padded rows go when their first match arrives.
            before = self._match_counts(index, self._read(index, keys, key_groups, now), theirs)
            hit = np.zeros(theirs.num_rows, dtype=bool)
            hit[their_rows] = True
            self.out.padded(1 - index, theirs.filter(pa.array(hit & (before == 0))), RowKind.DELETE)
        if matched is not None:
            self.out.joined(matched, RowKind.INSERT)
        if self.join.outer[index]:
            self.out.padded(index, self._unmatched(arriving, mine_rows), RowKind.INSERT)
        self._keep(index, rows, kgs)
        assert self.keyed is not None
        self.expiry.file(
            self.keyed, _SIDES[index], self.sides.key_column[index], keys, key_groups, now
        )

    def _retract(self, index: int, rows: pa.RecordBatch, kgs: np.ndarray, now: int) -> None:
        key = self.sides.key_column[index]
        keys, key_groups = distinct_keys(rows.column(key), kgs)
        theirs = self._read(1 - index, keys, key_groups, now)
        table = self._table(index)
        kept = self.expiry.live(table.pop(keys, key_groups), now) if table is not None else None
        remaining = None
        if kept is not None:
            remaining = self._without(index, kept, rows)
            self._keep(index, remaining, groups_of(remaining.column(key), keys, key_groups))
        retracted = pa.Table.from_batches([rows])
        matched = None
        if theirs is not None:
            matched = self._match(index, retracted, theirs)
        mine_rows, their_rows = self._sides_of(index, matched)
        if matched is not None:
            self.out.joined(matched, RowKind.DELETE)
        if self.join.outer[index]:
            self.out.padded(index, self._unmatched(retracted, mine_rows), RowKind.DELETE)
        if theirs is not None and matched is not None and self.join.outer[1 - index]:
            # The other rows a retraction met that have no match left get their padded
            # rows back (also when the retracted row had expired: its joined row went).
            hit = np.zeros(theirs.num_rows, dtype=bool)
            hit[their_rows] = True
            after = self._match_counts(index, remaining, theirs)
            self.out.padded(1 - index, theirs.filter(pa.array(hit & (after == 0))), RowKind.INSERT)

    @staticmethod
    def _sides_of(index: int, matched: Matched | None) -> tuple[np.ndarray, np.ndarray]:
        """The row numbers of the arriving side's and the other side's rows in pairs."""
        if matched is None:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        left = np.asarray(matched.left.to_numpy(zero_copy_only=False))
        right = np.asarray(matched.right.to_numpy(zero_copy_only=False))
        return (left, right) if index == 0 else (right, left)

    @staticmethod
    def _unmatched(rows: pa.Table, matched_rows: np.ndarray) -> pa.Table:
        """The ``rows`` no pair used."""
        used = np.zeros(rows.num_rows, dtype=bool)
        used[matched_rows] = True
        return rows.filter(pa.array(~used))

    def _without(self, index: int, kept: pa.Table, retracted: pa.RecordBatch) -> pa.Table:
        """``kept`` with one row equal to each of ``retracted`` removed (rows compare on
        every kept column but ``_written``; a retraction of a row not kept removes
        nothing)."""
        columns = [c for c in retracted.schema.names if c != WRITTEN_COLUMN]
        wanted = Counter(tuple_keys_of_columns([retracted.column(c) for c in columns]).to_pylist())
        identities = tuple_keys_of_columns(
            [kept.column(c).combine_chunks() for c in columns]
        ).to_pylist()
        keep = np.ones(kept.num_rows, dtype=bool)
        for position, identity in enumerate(identities):
            if wanted[identity] > 0:
                wanted[identity] -= 1
                keep[position] = False
        return kept.filter(pa.array(keep))

    def process_watermark(self, watermark: int) -> None:
        self._cleanup(self.expiry.now())
        self.emit_watermark(watermark)
