"""Joins on the columnar path: two keyed streams of Arrow record batches, joined with
Arrow's hash join (Acero).

- :class:`ColumnarWindowJoinOperator`: every pair of left and right rows with equal
  keys in the same tumbling or sliding event-time window, emitted when the watermark
  (the minimum of both inputs') passes the window's end;
- :class:`ColumnarRegularJoinOperator`: Flink SQL's regular (unbounded) inner
  equi-join: each arriving batch is joined with the other side's rows so far, then kept.

Both inputs arrive hash-partitioned by their key column (``_kg`` per row), so equal keys
meet in one subtask. Integer keys are widened to int64 on arrival (their key groups do
not depend on the width); other key types must be equal on both sides. Rows whose key
is null never join (SQL semantics) and are dropped on arrival. Output batches hold the
left columns, then the right ones (a right column whose name a left column has already
gets the suffix ``_right``), then ``window_start``, ``window_end`` (window joins) and
``_ts``; the internal ``_kg`` columns are dropped.

State is each side's rows in a row table of the job's keyed-state backend
(``env.set_state_backend``; :meth:`KeyedStateBackend.row_table`), keyed by the side's
key column: ``left`` and ``right`` for regular joins, ``left@<start>`` and
``right@<start>`` per open window for window joins (dropped when the window fires).
The backend snapshots and restores them (at another parallelism, by key group); on
RocksDB they live on disk, so a join's state may outgrow memory.

Example::

    op = create_operator(spec, ctx)        # spec.payload = JoinSpec("seller", "id")
    op.process_input(1, persons, None)     # kept: no auction yet
    op.process_input(0, auctions, None)    # emits (auction columns..., person columns...)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.arrow import same_columns, schema_difference, shown_columns
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import (
    JOIN_WINDOW_COLUMN,
    JoinSpec,
    join_key_type,
    reserved_join_columns,
)
from epochstream.graph.transformations import ColumnKey, ColumnKeys
from epochstream.runtime.columnar_routing import with_key_groups
from epochstream.runtime.operators.columnar_aggregates import own_backend, window_starts
from epochstream.runtime.operators.columnar_transforms import apply_batch_function, need_batch
from epochstream.runtime.operators.twoinput import TwoInputOperator
from epochstream.state.backends.base import RowSchema, RowTable
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.columnar_checks import event_times
from epochstream.state.handles import OperatorRestore

__all__ = [
    "RIGHT_SUFFIX",
    "ColumnarRegularJoinOperator",
    "ColumnarWindowJoinOperator",
    "JoinInputs",
    "distinct_keys",
]

#: Appended to a right column whose name a left column has already.
RIGHT_SUFFIX = "_right"
_SIDES = ("left", "right")


def distinct_keys(
    key: pa.Array | pa.ChunkedArray, key_groups: np.ndarray
) -> tuple[pa.Array, np.ndarray]:
    """The distinct values of a key column (in order of first appearance) with their
    key groups (``key_groups``: one per row): what a row table is read by.

    Example: ``distinct_keys(pa.array([7, 3, 7]), np.array([1, 2, 1]))`` gives
    ``([7, 3], [1, 2])``
    """
    if isinstance(key, pa.ChunkedArray):
        key = key.combine_chunks()
    codes = key.dictionary_encode().indices.to_numpy(zero_copy_only=False)
    _, first = np.unique(codes, return_index=True)
    return key.take(pa.array(first)), key_groups[first]


class JoinInputs:
    """Checks and normalizes each input's batches: key columns present, key types of
    both sides compatible (position by position), integer keys as int64, rows with a
    null key dropped, ``_kg`` present (the key group of the key, or of the tuple of
    keys when there are several, as ``key_by`` computes it).

    ``keys`` are each side's key columns (as many on both sides); ``reserved`` the
    column names the inputs may not have, each with the reason.

    Example::

        inputs = JoinInputs((("a", "b"), ("x", "y")), {}, "join (1/1)", 128)
        batch = inputs.prepare(0, left_batch)     # int keys as int64, _kg added
    """

    def __init__(
        self,
        keys: tuple[tuple[str, ...], tuple[str, ...]],
        reserved: dict[str, str],
        where: str,
        max_parallelism: int,
    ) -> None:
        self.keys = keys
        self.where = where
        self.max_parallelism = max_parallelism
        #: Each side's key types (one per key column), set by its first batch.
        self.key_types: list[tuple[pa.DataType, ...] | None] = [None, None]
        self.reserved = reserved
        # Each side's schema (every field nullable), set by its first batch.
        self.schemas: list[pa.Schema | None] = [None, None]

    def prepare(
        self, index: int, batch: pa.RecordBatch, *, drop_null_keys: bool = True
    ) -> pa.RecordBatch:
        """``batch`` of input ``index`` checked, keys widened, ``_kg`` added, and rows
        with a null key dropped (kept with ``drop_null_keys=False``: an outer join pads
        them)."""
        kinds = []
        for key in self.keys[index]:
            position = batch.schema.get_field_index(key)
            if position < 0:
                raise ConfigurationError(
                    f"{self.where}: the {_SIDES[index]} input has no key column {key!r} "
                    f"(columns: {shown_columns(batch.schema)})"
                )
            column = batch.column(position)
            if join_key_type(column.type) != column.type:
                try:
                    column = column.cast(join_key_type(column.type))
                except pa.ArrowInvalid as exc:  # uint64 keys above the int64 range
                    raise DataError(
                        f"{self.where}: the {_SIDES[index]} key column {key!r} ({column.type}) "
                        f"does not fit int64: {exc}"
                    ) from exc
                batch = batch.set_column(position, key, column)
            kinds.append(column.type)
        self._check_types(index, tuple(kinds))
        if KG_COLUMN not in batch.schema.names:  # driven directly, not through a hash edge
            names = self.keys[index]
            selector = ColumnKey(names[0]) if len(names) == 1 else ColumnKeys(names)
            batch = with_key_groups(batch, selector, self.max_parallelism)
        batch = self._conformed(index, batch)
        nulls = [batch.column(key) for key in self.keys[index]]
        if drop_null_keys and any(c.null_count for c in nulls):
            valid = pc.is_valid(nulls[0])
            for column in nulls[1:]:
                valid = pc.and_(valid, pc.is_valid(column))
            batch = batch.filter(valid)
        return batch

    def _conformed(self, index: int, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` in its side's first schema (which may not have a column the join
        reserves): columns in the same order, integer widths and nullability as there.
        Any other difference is a :class:`DataError`
        naming the column, before the batch is joined (a regular join put out the
        pairs of such a batch, mixing the column's types in its output)."""
        first = self.schemas[index]
        schema = batch.schema
        if first is None:
            # Checked once per side: every later batch must have these same columns.
            clash = next((n for n in schema.names if n in self.reserved), None)
            if clash is not None:
                raise DataError(
                    f"{self.where}: the {_SIDES[index]} input has a column named {clash!r}, "
                    f"{self.reserved[clash]}; rename it in map_batches"
                )
            first = self.schemas[index] = pa.schema(
                [f.with_nullable(True) for f in schema], metadata=schema.metadata
            )
        if schema.equals(first):
            return batch
        if same_columns(schema, first):
            try:
                return batch.select(first.names).cast(first)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise DataError(
                    f"{self.where}: a batch of the {_SIDES[index]} input does not fit the "
                    f"input's first schema ({shown_columns(first)}): {exc}"
                ) from exc
        raise DataError(
            f"{self.where}: batches of the {_SIDES[index]} input must share a schema (integer "
            f"widths, nullability and column order may differ): "
            f"{schema_difference([first, schema]) or 'the schemas differ'}"
        )

    def _check_types(self, index: int, kinds: tuple[pa.DataType, ...]) -> None:
        if self.key_types[index] is None:
            self.key_types[index] = kinds
        other = self.key_types[1 - index]
        if other is None:
            return
        for position, (kind, other_kind) in enumerate(zip(kinds, other, strict=True)):
            if kind != other_kind:
                left, right = (kind, other_kind) if index == 0 else (other_kind, kind)
                raise ConfigurationError(
                    f"{self.where}: the join keys have incompatible types: left "
                    f"{self.keys[0][position]!r} is {left}, right {self.keys[1][position]!r} "
                    f"is {right}; equal keys must have one type on both sides (cast one in "
                    "map_batches)"
                )


def _payload(table: Any, keep_ts: bool) -> Any:
    """``table`` (a table or a batch) without ``_kg``/``_window_start`` (and ``_ts``
    unless ``keep_ts``)."""
    drop = [
        n
        for n in table.schema.names
        if n in (KG_COLUMN, JOIN_WINDOW_COLUMN) or (n == TS_COLUMN and not keep_ts)
    ]
    return table.drop_columns(drop) if drop else table


def _carried_by_acero(kind: pa.DataType) -> bool:
    """Whether Arrow's hash join can carry a non-key column of this type (it refuses
    lists, structs, maps, unions and the null type)."""
    return not (pa.types.is_nested(kind) or pa.types.is_null(kind))


def _join_tables(
    left: pa.Table, right: pa.Table, spec: JoinSpec, *, build: int, where: str
) -> pa.Table:
    """Inner equi-join of ``left`` and ``right`` (payload columns and at most one
    ``_ts``): the left columns, then the right ones (``_right`` on clashes), then ``_ts``.
    ``build`` (0: left, 1: right) is the side Acero hashes; the other one is probed."""
    right_names = [n + RIGHT_SUFFIX if n in left.schema.names else n for n in right.schema.names]
    names = [n for n in left.schema.names + right_names if n != TS_COLUMN]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash is not None:
        raise DataError(
            f"{where}: the joined batch would have two columns named {clash!r} (left columns "
            f"{left.schema.names}, right columns {right.schema.names}; a right column whose "
            f"name the left has gets {RIGHT_SUFFIX!r}): rename one in map_batches"
        )
    if TS_COLUMN in left.schema.names or TS_COLUMN in right.schema.names:
        names.append(TS_COLUMN)
    carried = all(_carried_by_acero(f.type) for t in (left, right) for f in t.schema)
    joined_left, joined_right = (
        (left, right)
        if carried
        else (_row_ids(left, spec.left_key, _LEFT_ROW), _row_ids(right, spec.right_key, _RIGHT_ROW))
    )
    try:
        if build == 1:  # Acero builds its hash table on the right table of the call
            joined = joined_left.join(
                joined_right,
                keys=spec.left_key,
                right_keys=spec.right_key,
                join_type="inner",
                right_suffix=RIGHT_SUFFIX,
                coalesce_keys=False,
                use_threads=False,
            )
        else:
            joined = joined_right.join(
                joined_left,
                keys=spec.right_key,
                right_keys=spec.left_key,
                join_type="inner",
                left_suffix=RIGHT_SUFFIX,
                coalesce_keys=False,
                use_threads=False,
            )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise DataError(
            f"{where}: cannot join left columns {left.schema.names} with right columns "
            f"{right.schema.names}: {exc}"
        ) from exc
    if not carried:
        # Acero joined the keys and row numbers only; the rows are taken from the inputs.
        pairs = (left.take(joined.column(_LEFT_ROW)), right.take(joined.column(_RIGHT_ROW)))
        columns = {n: c for n, c in zip(left.schema.names, pairs[0].columns, strict=True)}
        columns.update(zip(right_names, pairs[1].columns, strict=True))
        return pa.table({n: columns[n] for n in names})
    return joined.select(names)


_LEFT_ROW, _RIGHT_ROW = "_left_row", "_right_row"


def _row_ids(table: pa.Table, key: str, name: str) -> pa.Table:
    """``table``'s key column and its row numbers as column ``name``: what Acero joins
    when it cannot carry the other columns."""
    return pa.table(
        {key: table.column(key), name: pa.array(np.arange(table.num_rows, dtype=np.int64))}
    )


def _side_schema(prepared: pa.Schema, key: str) -> RowSchema:
    """The row table schema of a side: its first batch's schema without ``_kg``."""
    fields = [f for f in prepared if f.name != KG_COLUMN]
    return RowSchema(pa.schema(fields, metadata=prepared.metadata), key)


class _ColumnarJoinOperator(TwoInputOperator):
    """Shared by both joins: input checks, output (with the optional function), the
    sides' row tables in the keyed-state backend."""

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        #: The key groups of this subtask (those its backend holds).
        self.key_groups = self.keyed.key_group_range
        self.join: JoinSpec = spec.payload
        self.inputs = JoinInputs(
            ((self.join.left_key,), (self.join.right_key,)),
            reserved_join_columns(self.join.size is not None),
            ctx.task_name,
            ctx.max_parallelism,
        )

    def _side_table(self, index: int, name: str) -> RowTable:
        """Row table ``name`` of side ``index``, made with the side's schema if new."""
        schema = self.inputs.schemas[index]
        assert schema is not None and self.keyed is not None
        table = self.keyed.row_table(name, _side_schema(schema, self.inputs.keys[index][0]))
        assert table is not None
        return table

    def _adopt(self, index: int, schema: RowSchema) -> None:
        """Take up a restored side's schema, as if its first batch had come."""
        if self.inputs.schemas[index] is None:
            self.inputs.schemas[index] = pa.schema(
                [*schema.schema, pa.field(KG_COLUMN, pa.int32())], metadata=schema.schema.metadata
            )
            self.inputs.key_types[index] = (schema.schema.field(schema.key).type,)

    def _restored(self, names: list[str]) -> None:
        """Refuse restored state that is not this join's (``names``: its tables)."""
        assert self.keyed is not None
        other = [n for n in self.keyed.row_tables() if n not in names]
        other += self.keyed.column_tables()
        if other:
            raise StateError(
                f"{self.ctx.task_name}: restored state is not this join's (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )

    def _emit_joined(self, joined: pa.Table) -> None:
        if not joined.num_rows:
            return
        batch = joined.combine_chunks().to_batches()[0]
        if self.join.function is not None:
            batch = apply_batch_function(
                self.join.function, batch, self.ctx.task_name, "join apply"
            )
        if batch.num_rows:
            self.output.collect(batch, None)


def _rows_of(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
    """A prepared batch's rows (without ``_kg``) and their key groups."""
    kgs = batch.column(KG_COLUMN).to_numpy(zero_copy_only=False)
    return batch.drop_columns([KG_COLUMN]), kgs


class ColumnarRegularJoinOperator(_ColumnarJoinOperator):
    """Regular (unbounded) inner equi-join: a batch of one input is joined with the rows
    of the other input received so far under the batch's keys (read from the other
    side's row table; Acero hashes the arriving batch and probes them), then appended
    to its own side. Output ``_ts`` is the arriving row's (with event time; the kept
    row's when only the kept side has it).

    State grows without bound: every row of both inputs is kept (``left``, ``right``).

    Example::

        op = create_operator(spec, ctx)    # kind "columnar_join", JoinSpec("seller", "id")
        op.process_input(1, pa.record_batch([pa.array([7]), pa.array(["ann"])], names=["id", "name"]), None)
        op.process_input(0, pa.record_batch([pa.array([1]), pa.array([7])], names=["id", "seller"]), None)
        # emits {"id": 1, "seller": 7, "id_right": 7, "name": "ann"}
    """

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        self._restored(list(_SIDES))
        for index, side in enumerate(_SIDES):
            table = self.keyed.row_table(side)
            if table is not None:
                self._adopt(index, table.schema)

    def process_input(self, index: int, records: Any, timestamps: list[Any] | None) -> None:
        batch = self.inputs.prepare(index, need_batch(self, records))
        if not batch.num_rows:
            return
        rows, kgs = _rows_of(batch)
        assert self.keyed is not None
        other = self.keyed.row_table(_SIDES[1 - index])
        if other is not None:
            keys = pc.unique(rows.column(self.inputs.keys[index][0]))
            kept = other.read(keys, key_groups_of_column(keys, self.ctx.max_parallelism))
            if kept.num_rows:
                arriving = _payload(pa.Table.from_batches([rows]), keep_ts=True)
                # One _ts per pair: the arriving row's, else (only the kept side has event
                # time) the kept row's, so every output batch has the same columns.
                kept = _payload(kept, keep_ts=TS_COLUMN not in arriving.schema.names)
                pair = (arriving, kept) if index == 0 else (kept, arriving)
                self._emit_joined(
                    _join_tables(*pair, self.join, build=index, where=self.ctx.task_name)
                )
        self._side_table(index, _SIDES[index]).append(rows, kgs)


class ColumnarWindowJoinOperator(_ColumnarJoinOperator):
    """Window join: each side's rows are kept per window (tumbling or sliding, assigned
    from ``_ts``) in row tables ``left@<start>`` and ``right@<start>``; when the
    watermark passes a window's end, the window's pairs are joined and emitted as one
    batch (then the watermark moves on), with ``window_start``, ``window_end`` and
    ``_ts = window_end - 1``, and the window's tables are dropped. A row whose windows
    have all fired is late: dropped and counted in the ``late_records_dropped`` metric.

    Example::

        op = create_operator(spec, ctx)    # JoinSpec("seller", "id", size=1_000, slide=1_000)
        op.process_input(0, auctions, None)   # rows with _ts in [0, 1000)
        op.process_input(1, persons, None)
        op.process_watermark(999)             # emits the window's pairs, then the watermark
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        #: The open windows' starts (each has a row table per side that received rows).
        self.windows: set[int] = set()
        self.watermark = -(2**63)

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        names = self.keyed.row_tables()
        self._restored([n for n in names if _window_of(n) is not None])
        for name in names:
            side, start = _window_of(name) or ("", 0)
            self.windows.add(start)
            table = self.keyed.row_table(name)
            assert table is not None
            self._adopt(_SIDES.index(side), table.schema)

    def process_input(self, index: int, records: Any, timestamps: list[Any] | None) -> None:
        batch = self.inputs.prepare(index, need_batch(self, records))
        if not batch.num_rows:
            return
        if TS_COLUMN not in batch.schema.names:
            raise DataError(
                f"{self.ctx.task_name}: a window join needs event time on both inputs; give "
                f"the {_SIDES[index]} source a watermark strategy with .with_timestamp_column(name)"
            )
        join = self.join
        assert join.size is not None and join.slide is not None
        late, windows = window_starts(
            event_times(batch, self.ctx.task_name),
            join.size,
            join.slide,
            join.offset,
            self.watermark,
        )
        self.counters.late_records_dropped += late
        for start, mask in windows:
            part = batch if mask.all() else batch.filter(pa.array(mask))
            self.windows.add(start)
            self._side_table(index, _window_table(_SIDES[index], start)).append(*_rows_of(part))

    def process_watermark(self, watermark: int) -> None:
        self.watermark = watermark
        size = self.join.size
        assert size is not None and self.keyed is not None
        for start in sorted(s for s in self.windows if s + size - 1 <= watermark):
            self.windows.discard(start)
            names = [_window_table(side, start) for side in _SIDES]
            tables = [self.keyed.row_table(name) for name in names]
            left, right = (None if t is None else t.table() for t in tables)
            for name in names:
                self.keyed.drop_row_table(name)
            if left is None or right is None:
                continue
            joined = _join_tables(
                _payload(left, keep_ts=False),
                _payload(right, keep_ts=False),
                self.join,
                build=int(right.num_rows <= left.num_rows),
                where=self.ctx.task_name,
            )
            n = joined.num_rows
            for name, value in (
                ("window_start", start),
                ("window_end", start + size),
                (TS_COLUMN, start + size - 1),
            ):
                joined = joined.append_column(name, pa.array(np.full(n, value, dtype=np.int64)))
            self._emit_joined(joined)
        self.emit_watermark(watermark)


#: Between a side's name and its window's start in a window join's row table name.
_AT = "@"


def _window_table(side: str, start: int) -> str:
    """The row table of one side of one window: ``_window_table("left", 0) == "left@0"``."""
    return f"{side}{_AT}{start}"


def _window_of(name: str) -> tuple[str, int] | None:
    """``(side, start)`` of a window join's row table name, else None."""
    side, sep, start = name.partition(_AT)
    if not sep or side not in _SIDES:
        return None
    try:
        return side, int(start)
    except ValueError:
        return None
