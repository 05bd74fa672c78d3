"""Flink SQL's ``GROUP BY`` without a window on batches: running aggregates per group,
emitted as a changelog.

Each batch is folded into its groups' partial aggregates (:class:`AggregateCalls`, the
window aggregation's: one Arrow ``group_by`` of the batch, a second merging with the
groups' held partials), and the groups it changed come out as changes in an ``_op``
column (:mod:`epochstream.core.changelog`): ``+I`` for a group seen the first time,
``-U`` (its old result) then ``+U`` (the new) for a group whose result changed, nothing
for one whose result stayed the same (Flink's ``GroupAggFunction``). A batch emits
once per group it touched, whatever the number of its rows. With a mini-batch
(``GroupAggregateSpec.mini_batch``, Flink's ``table.exec.mini-batch``) batches are held
(:class:`MiniBatchBuffer`) and folded as one at its size or latency, and before every
watermark, checkpoint barrier (:meth:`prepare_snapshot_pre_barrier`) and the end of the
input, so the held rows are never in a checkpoint's blind spot.

State, in row tables of the job's keyed-state backend keyed by the group key
(:class:`GroupKeys`): ``groups`` per group its key columns (for a tuple key) and
partials; ``distinct<i>`` per group the distinct values of ``COUNT(DISTINCT)``
aggregate ``i`` (:class:`DistinctValues`: a batch appends only the values new to its
groups). A batch pops the groups it touches and appends them back.

Over an updating input (``GroupAggregateSpec.updating_input``: the changelog of another
aggregation) each row is weighted by its kind (+1 for ``+I``/``+U``, -1 for ``-U``/``-D``)
and every partial is a sum (:meth:`AggregateCalls.signed_partials`), which takes
retractions (COUNT, SUM, AVG); MIN, MAX and COUNT(DISTINCT) keep per group each value with its
count (:class:`ValueCounts`, row table ``values<i>`` instead of ``distinct<i>``), so a
retracted extreme falls back to the next value. A group whose rows are all retracted is
deleted (``-D``).

**State TTL** (``GroupAggregateSpec.state_ttl_ms > 0``, Flink's ``table.exec.state.ttl``
with ``OnCreateAndWrite``; :class:`~.row_expiry.RowExpiry`, the regular join's): each
group row carries ``_written``, the processing time of the last batch that wrote it, and
a group expires ``state_ttl_ms`` later. An expired group is gone, with its ``distinct<i>``
or ``values<i>`` rows: expiry emits nothing, and the key's next row starts a new group,
emitted as ``+I`` (the downstream may still hold the old result: Flink's documented loss
of results under a TTL). Retractions for state that is gone are ignored (Flink's
``GroupAggFunction`` drops a retraction without an accumulator) and counted in
``late_records_dropped``: the retractions of a group without live state before its
first add in the batch, and retractions of a value beyond its count. Without a TTL the
latter stay a DataError. Deleting expired groups goes by the queue table ``groups_due``
(:meth:`RowExpiry.expire`), at most every tenth of the TTL, on batches and watermarks.

Example::

    op = create_operator(spec, ctx)   # payload GroupAggregateSpec(("k",), (count_star,))
    op.process_batch(pa.record_batch({"k": ["a", "a"]}), None)   # +I a, 2
    op.process_batch(pa.record_batch({"k": ["a"]}), None)        # -U a, 2; +U a, 3
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import table_batch
from epochstream.core.changelog import OP, RowKind, weights
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import GroupAggregateSpec
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.operators.columnar_aggregates import own_backend
from epochstream.runtime.operators.columnar_distinct_values import DistinctValues
from epochstream.runtime.operators.columnar_group_keys import (
    TUPLE_KEY,
    BatchKeys,
    GroupKeys,
    key_slots,
)
from epochstream.runtime.operators.columnar_mini_batch import MiniBatchBuffer
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.runtime.operators.columnar_value_counts import (
    ValueCounts,
    distinct_counts,
    per_group_extreme,
)
from epochstream.runtime.operators.columnar_window_aggregates import (
    AggregateCalls,
    check_aggregate_input,
)
from epochstream.runtime.operators.row_expiry import DUE_SUFFIX, WRITTEN_COLUMN, RowExpiry
from epochstream.state.backends.base import RowSchema, RowTable
from epochstream.state.handles import OperatorRestore

__all__ = ["ColumnarGroupAggregateOperator"]

#: The row tables: the groups' partials, each COUNT(DISTINCT)'s values (append-only
#: input), and each valued aggregate's values with their counts (a changelog input).
GROUPS, _DISTINCT, _VALUES = "groups", "distinct", "values"
#: A group's position among the batch's distinct keys (the group_by key).
_ID = "_ga_id"
#: The partial counting a group's rows (the window aggregation's name for it).
_ROWS = "_wa_rows"


class ColumnarGroupAggregateOperator(Operator):
    """Running SQL aggregates per group of an append-only or changelog input, as a
    changelog (see the module docstring).

    Output batches: the key columns, each aggregate's ``output`` column and ``_op``
    (``-U`` rows before the ``+U`` rows of the same groups). No ``_ts``: an updating
    result has no event time (as in Flink); watermarks pass through.

    Example::

        op = create_operator(spec, ctx)   # kind "columnar_group_aggregate"
        op.process_batch(pa.record_batch({"k": ["a"], "v": [5]}), None)
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        self.agg: GroupAggregateSpec = spec.payload
        self.keys = list(self.agg.keys)
        self._where = ctx.task_name
        self._keys = GroupKeys(self.agg.keys, self._where, ctx.max_parallelism)
        self._types: dict[str, pa.DataType] = {}
        self._calls: AggregateCalls | None = None
        self._groups: RowTable | None = None
        self._distinct: dict[int, DistinctValues] = {}
        #: Over a changelog: per MIN, MAX or COUNT(DISTINCT) aggregate, its values' counts.
        self._values: dict[int, ValueCounts] = {}
        #: The mini-batch's held input (None: each batch is folded as it comes).
        self._buffer = MiniBatchBuffer(self.agg.mini_batch) if self.agg.mini_batch else None
        #: The state TTL: ``_written`` stamps on ``groups`` and their due queue.
        self.expiry = RowExpiry(self.agg.state_ttl_ms, ctx.clock)
        if self.expiry.ttl and WRITTEN_COLUMN in self.keys:
            raise ConfigurationError(
                f"{self._where}: key column {WRITTEN_COLUMN!r} is the name a group "
                "aggregation with a state TTL keeps its groups' write times under; rename it"
            )

    # ---------------------------------------------------------------- state

    def _bound_columns(self) -> list[str]:
        """The columns of ``groups`` other than the partials (``_written`` last)."""
        stamps = [WRITTEN_COLUMN] if self.expiry.ttl else []
        return list(dict.fromkeys([self._keys.state_key, *self.keys, *stamps]))

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        names = self.keyed.row_tables()
        own = {GROUPS, GROUPS + DUE_SUFFIX}
        other = [n for n in names if n not in own and _numbered(n) is None]
        other += self.keyed.column_tables()
        if other:
            raise StateError(
                f"{self._where}: restored state is not a group aggregation's (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )
        groups = self.keyed.row_table(GROUPS)
        if groups is None:
            return
        schema = groups.schema.schema
        self.expiry.check_restored(schema, self._where, "group aggregation")
        calls = AggregateCalls.restored(
            self.agg.aggs, schema, self._types, signed=self.agg.updating_input
        )
        needed = {*self._bound_columns(), *(p.name for p in calls.partials)}
        if calls.signed:
            parts = {f"{_VALUES}{i}" for i, _ in calls.valued}
        else:
            parts = {f"{_DISTINCT}{i}" for i, _ in calls.distinct}
        if set(schema.names) != needed or not {n for n in names if n not in own} <= parts:
            raise StateError(
                f"{self._where}: restored state does not hold this query's keys and "
                "aggregates (it was written by another query); give the new operator "
                "another uid"
            )
        for name in self.keys:  # later batches' keys are cast to the restored types
            self._types.setdefault(name, schema.field(name).type)
        self._calls = calls
        self._groups = groups
        if calls.signed:
            self._open_value_counts(calls)
            return
        for i, column in calls.distinct:
            table = self.keyed.row_table(f"{_DISTINCT}{i}")
            if table is not None:
                self._distinct[i] = self._distinct_values(table, column)

    def _tables(self, stored: pa.Schema, calls: AggregateCalls) -> RowTable:
        """The groups table (made with the first batch's types, or restored) and the
        distinct tables (made when missing: an empty table may not be restored)."""
        assert self.keyed is not None
        state_key = self._keys.state_key
        if self._groups is None:
            schema = pa.schema([f.with_nullable(True) for f in stored])
            self._groups = self.keyed.row_table(GROUPS, RowSchema(schema, state_key))
        assert self._groups is not None
        key_type = self._groups.schema.schema.field(state_key).type
        if calls.signed:
            self._open_value_counts(calls)
            return self._groups
        for i, column in calls.distinct:
            if i not in self._distinct:
                value_type = self._types[str(self.agg.aggs[i].column)]
                schema = pa.schema([(state_key, key_type), (column, value_type)])
                table = self.keyed.row_table(f"{_DISTINCT}{i}", RowSchema(schema, state_key))
                assert table is not None
                self._distinct[i] = self._distinct_values(table, column)
        return self._groups

    def _distinct_values(self, table: RowTable, column: str) -> DistinctValues:
        """A COUNT(DISTINCT)'s values; indexed in memory on the heap backend, whose state
        is in memory anyway (RocksDB's need not fit)."""
        assert self.keyed is not None
        heap = self.keyed.NAME == "heap"
        return DistinctValues(table, self._keys.state_key, column, indexed=heap)

    def _open_value_counts(self, calls: AggregateCalls) -> None:
        """The valued aggregates' value counts (their tables restored, or made with the
        first values kept)."""
        assert self.keyed is not None
        for i, _ in calls.valued:
            if i not in self._values:
                name = f"{_VALUES}{i}"
                self._values[i] = ValueCounts(
                    self.keyed,
                    name,
                    self._keys.state_key,
                    self._where,
                    forgiving=self.expiry.ttl > 0,
                )

    # ---------------------------------------------------------------- batches

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        if self._buffer is None:
            self._fold(batch)
        elif self._buffer.add(batch, self.ctx.clock_ms()):
            self._flush_buffer()

    # ---------------------------------------------------------------- mini-batch

    def _flush_buffer(self) -> None:
        """Fold the mini-batch buffer's rows as one batch (nothing when it is empty)."""
        if self._buffer is not None and (held := self._buffer.take()) is not None:
            self._fold(held)

    def on_processing_time(self, now_ms: int) -> None:
        if self._buffer is not None and self._buffer.due(now_ms):
            self._flush_buffer()

    def next_processing_time(self) -> int | None:
        """When the mini-batch buffer's latency runs out (None: nothing buffered)."""
        return None if self._buffer is None else self._buffer.deadline

    def process_watermark(self, watermark: int) -> None:
        self._flush_buffer()  # the watermark follows the buffered rows' changes
        self._cleanup(self.expiry.now())
        self.emit_watermark(watermark)

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self._flush_buffer()  # the barrier follows every change of the rows before it

    def end_input(self) -> None:
        self._flush_buffer()

    # ---------------------------------------------------------------- folding

    def _fold(self, batch: pa.RecordBatch) -> None:
        """Fold ``batch`` into its groups and emit their changes."""
        signed = self.agg.updating_input
        if OP in batch.schema.names and not signed:
            raise DataError(
                f"{self._where}: the input is a changelog (it has an {OP!r} column); this "
                "group aggregation was built for an append-only input"
            )
        checked = check_aggregate_input(
            batch, self.keys, self.agg.aggs, self._types, self._where, event_time=False
        )
        if self._calls is None:
            self._calls = AggregateCalls(
                self.agg.aggs, checked.floats, signed=signed, decimal_scales=checked.decimals
            )
        calls = self._calls
        now = self.expiry.now()
        self._cleanup(now)
        found = self._keys.of(batch, self._types)
        held = self._groups.pop(found.keys, found.key_groups) if self._groups is not None else None
        held_groups = None  # per key, whether its group is held (None: all that are found)
        if self.expiry.ttl:
            # Expired groups were popped and are not written back: they are gone.
            held = self.expiry.live(held, now) if held is not None else None
            held_groups = self._held_groups(held, found)
            if signed:
                kept = self._drop_gone_retractions(batch, found, held_groups)
                if kept is None:
                    return
                if kept.num_rows < batch.num_rows:
                    batch = kept
                    found = self._keys.of(batch, self._types)
                    held_groups = self._held_groups(held, found)
        n = len(found.keys)
        old_at = (
            key_slots(held.column(self._keys.state_key), found.keys)
            if held is not None
            else np.empty(0, np.int64)
        )
        derived = calls.derived(batch)
        signs = weights(batch)
        if calls.signed:
            signed = calls.signed_partials(derived, signs, found.slots)
            parts = [signed.rename_columns([_ID, *signed.schema.names[1:]])]
        else:
            rows = pa.table({_ID: found.slots, **derived})
            grouped = rows.group_by([_ID], use_threads=False).aggregate(calls.batch_aggregations())
            parts = [calls.batch_partials(grouped, [_ID])]
        old_partials = None
        if held is not None and held.num_rows:
            old_partials = held.drop_columns(self._bound_columns()).add_column(
                0, _ID, pa.array(old_at)
            )
            parts.insert(0, old_partials)
        merged = calls.merge(pa.concat_tables(parts, promote_options="permissive"), [_ID])
        merged = merged.take(pc.sort_indices(merged.column(_ID)))  # every key: ids 0..n-1
        # A group lives while it has rows: retractions may take its last one.
        alive = np.asarray(merged.column(_ROWS).to_numpy(), dtype=np.int64) > 0
        stored = self._stored(found, merged, now)
        table = self._tables(stored.schema, calls)
        if alive.all():
            table.append(table_batch(stored), found.key_groups)
        elif alive.any():
            table.append(table_batch(stored.filter(pa.array(alive))), found.key_groups[alive])
        assert self.keyed is not None
        self.expiry.file(
            self.keyed, GROUPS, self._keys.state_key, found.keys, found.key_groups, now
        )
        if calls.signed:
            old_columns, new_columns = self._counted(calls, found, derived, signs, held_groups)
        else:
            old_columns, new_columns = self._distinct_counts(calls, found, derived, n, held_groups)
        new_values = calls.values(_with_columns(merged, new_columns), self._where)
        self._emit(calls, found, old_partials, old_columns, new_values, alive)

    def _held_groups(self, held: pa.Table | None, found: BatchKeys) -> np.ndarray:
        """Per key of ``found``, whether ``held`` (the live groups popped) has it."""
        held_groups = np.zeros(len(found.keys), dtype=bool)
        if held is not None and held.num_rows:
            held_groups[key_slots(held.column(self._keys.state_key), found.keys)] = True
        return held_groups

    def _drop_gone_retractions(
        self, batch: pa.RecordBatch, found: BatchKeys, held_groups: np.ndarray
    ) -> pa.RecordBatch | None:
        """``batch`` without the retractions of groups without state (expired, under a
        TTL) before the group's first add in the batch, as Flink ignores a retraction
        without an accumulator; they are counted in ``late_records_dropped``. None when
        nothing is left."""
        adds = weights(batch) > 0
        positions = np.arange(batch.num_rows)
        first_add = np.full(len(found.keys), batch.num_rows, dtype=np.int64)
        np.minimum.at(first_add, found.slots[adds], positions[adds])
        gone = ~adds & ~held_groups[found.slots] & (positions < first_add[found.slots])
        if not gone.any():
            return batch
        self.counters.late_records_dropped += int(gone.sum())
        kept = batch.filter(pa.array(~gone))
        return kept if kept.num_rows else None

    def _cleanup(self, now: int) -> None:
        """Delete the expired groups and their values (at most every tenth of the TTL)."""
        if not self.expiry.cleanup_due(now):
            return
        assert self.keyed is not None
        gone = self.expiry.expire(self.keyed, GROUPS, self._keys.state_key, now)
        if gone is None:
            return
        keys, kgs = gone
        for distinct in self._distinct.values():
            distinct.drop(keys, kgs)  # the expired groups' values go with them
        for name in self.keyed.row_tables():
            if name.startswith(_VALUES) and (values := self.keyed.row_table(name)):
                values.pop(keys, kgs)

    def _counted(
        self,
        calls: AggregateCalls,
        found: BatchKeys,
        derived: dict[str, pa.Array],
        signs: np.ndarray,
        held_groups: np.ndarray | None,
    ) -> tuple[dict[str, pa.Array], dict[str, pa.Array]]:
        """Over a changelog: the valued aggregates' columns of the partials
        (``COUNT(DISTINCT)``'s count, MIN's or MAX's extreme ``_m``) per key, before and
        after the batch, from their value counts (updated with the batch; the values of
        groups not ``held_groups`` are dropped)."""
        assert self._groups is not None
        key_type = self._groups.schema.schema.field(self._keys.state_key).type
        n = len(found.keys)
        before: dict[str, pa.Array] = {}
        after: dict[str, pa.Array] = {}
        for i, column in calls.valued:
            change = self._values[i].update(found, derived[column], signs, key_type, held_groups)
            self.counters.late_records_dropped += change.ignored
            agg = self.agg.aggs[i]
            if agg.distinct:
                before[column] = pa.array(distinct_counts(change.before, n))
                after[column] = pa.array(distinct_counts(change.after, n))
            else:
                before[f"_wa{i}_m"] = per_group_extreme(change.before, agg.kind, n)
                after[f"_wa{i}_m"] = per_group_extreme(change.after, agg.kind, n)
        return before, after

    def _distinct_counts(
        self,
        calls: AggregateCalls,
        found: BatchKeys,
        derived: dict[str, pa.Array],
        n: int,
        held_groups: np.ndarray | None,
    ) -> tuple[dict[str, pa.Array], dict[str, pa.Array]]:
        """Per ``COUNT(DISTINCT)`` aggregate (its column), each key's count before and
        after the batch (:class:`DistinctValues`); the values of groups not
        ``held_groups`` (expired) are forgotten first: such a group starts over."""
        before: dict[str, pa.Array] = {}
        after: dict[str, pa.Array] = {}
        gone = None if held_groups is None or held_groups.all() else ~held_groups
        for i, column in calls.distinct:
            values = self._distinct[i]
            if gone is not None:
                values.drop(found.keys.filter(pa.array(gone)), found.key_groups[gone])
            then, now = values.update(found, derived[column])
            before[column], after[column] = pa.array(then), pa.array(now)
        return before, after

    def _stored(self, found: BatchKeys, merged: pa.Table, now: int) -> pa.Table:
        """The groups as ``groups`` keeps them: state key, key columns, ``_written``
        (written ``now``, with a TTL), partials."""
        out: dict[str, Any] = {self._keys.state_key: found.keys}
        if self._keys.state_key == TUPLE_KEY:
            for name in self.keys:
                out[name] = found.columns[name].take(pa.array(found.first))
        if self.expiry.ttl:
            out[WRITTEN_COLUMN] = self.expiry.stamps(len(found.keys), now)
        for name in merged.schema.names:
            if name != _ID:
                out[name] = merged.column(name)
        return pa.table(out)

    def _emit(
        self,
        calls: AggregateCalls,
        found: BatchKeys,
        old_partials: pa.Table | None,
        old_columns: dict[str, pa.Array],
        new_values: list[pa.Array],
        alive: np.ndarray,
    ) -> None:
        """Emit ``+I`` for the new groups, ``-U``/``+U`` for the changed ones and ``-D``
        for those whose last row was retracted (``alive``: per key, whether it has rows)."""
        n = len(found.keys)
        keys = [found.columns[k].take(pa.array(found.first)) for k in self.keys]
        had = np.zeros(n, dtype=bool)
        changed = np.zeros(n, dtype=bool)
        old_values: list[pa.Array] = []
        old_at = np.empty(0, np.int64)
        if old_partials is not None:
            old_at = old_partials.column(_ID).to_numpy()
            had[old_at] = True
            at = pa.array(old_at)
            held = {name: c.take(at) for name, c in old_columns.items()}
            old_values = calls.values(_with_columns(old_partials, held), self._where)
            for old, new in zip(old_values, new_values, strict=True):
                changed[old_at] |= ~_same(old, new.take(pa.array(old_at)))
        deleted = had & ~alive
        changed &= alive
        inserted = ~had & alive
        names = [*self.keys, *(a.output for a in self.agg.aggs), OP]
        out = []
        for gone, kind in ((changed, RowKind.UPDATE_BEFORE), (deleted, RowKind.DELETE)):
            if not gone.any():
                continue
            before = gone[old_at]
            rows = pa.array(np.flatnonzero(before))
            at = pa.array(old_at[before])
            out.append(
                _changes(
                    [k.take(at) for k in keys] + [v.take(rows) for v in old_values],
                    kind,
                    names,
                )
            )
        after = np.flatnonzero(changed | inserted)
        if len(after):
            kinds = np.where(inserted[after], RowKind.INSERT, RowKind.UPDATE_AFTER)
            picked = pa.array(after)
            out.append(
                _changes(
                    [k.take(picked) for k in keys] + [v.take(picked) for v in new_values],
                    kinds,
                    names,
                )
            )
        if out:
            self.output.collect(pa.concat_batches(out) if len(out) > 1 else out[0], None)

    def state_table(self) -> pa.Table:
        """The groups (``_kg``, the state key, key columns, partials): tests, tools."""
        if self._groups is None:
            return pa.table({KG_COLUMN: pa.array([], pa.int32())})
        return self._groups.table()


def _with_columns(partials: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    """``partials`` with the valued aggregates' ``columns`` (one value per row)."""
    for name, column in columns.items():
        partials = partials.append_column(name, column)
    return partials


def _changes(columns: list[pa.Array], kinds: Any, names: list[str]) -> pa.RecordBatch:
    """One batch of changes: ``columns`` and their row kinds."""
    n = len(columns[0]) if columns else 0
    ops = np.broadcast_to(np.asarray(kinds, dtype=np.int8), (n,))
    return pa.record_batch([*columns, pa.array(ops, pa.int8())], names=names)


def _same(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Where ``a`` and ``b`` hold the same value (NULL = NULL, NaN = NaN)."""
    equal = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    same = pc.or_(equal, both_null)
    if pa.types.is_floating(a.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)


def _numbered(name: str) -> int | None:
    """The aggregate a ``distinct<i>`` or ``values<i>`` table is of (None: neither)."""
    for prefix in (_DISTINCT, _VALUES):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return int(name[len(prefix) :])
    return None
