"""Flink SQL's window Top-N on batches: ``ROW_NUMBER() OVER (PARTITION BY window_start,
window_end, p... ORDER BY o...) <= n`` over a windowed input (a window aggregation's or
a window assignment's output: columns ``window_start`` and ``window_end``).

Rows are kept per window in a row table of the job's keyed-state backend,
``topn@<window_end>`` (its rows filed under their key group), dropped when the window
fires: when the watermark passes ``window_end - 1``, each partition's rows are ranked
and the first ``n`` emitted, with ``_ts = window_end - 1`` and, when the spec names
one, the row number column. Rows of a fired window are late: dropped and counted in
``late_records_dropped``.

Only a partition's best ``n`` rows can ever be emitted, so state is pruned as it comes:
each batch keeps its own best ``n`` per (window, partition) before it is appended, and
a window's table is re-ranked down to ``n`` per partition whenever it has doubled
since its last pruning (amortized: each row is ranked a constant number of times), so
a window holds at most about twice the rows it will emit (or ``_PRUNE_FLOOR`` rows),
whatever the input rate.

Ranking (:func:`rank_rows`) is vectorized: partitions become integer ids (a dictionary
code per column), one stable Arrow ``sort_indices`` orders rows by id and order keys,
and the row numbers are positions minus each partition's first position. NULLs sort
first ascending and last descending, as Flink's planner sets it (``NullCollation.LOW``
in ``FlinkPlannerImpl``: "null values appear first when the order is ASC, and ordered
last when the order is DESC"); NaN is the largest float, as in Java's
``Double.compare``. Ties get distinct row numbers by arrival order: the sort is stable,
and a table keeps a partition's rows in arrival order (pruned survivors first, in rank
order, then the rows that came after), through snapshots too.

A restored subtask starts from no watermark, so each snapshot also files, per key
group, the watermark its windows had fired up to (row table ``topn-fired``): after a
restore, at any parallelism, a row of a window its key group had fired is late as it
would have been without the restore, not emitted a second time.

Example::

    op = ColumnarWindowTopNOperator(spec, ctx)   # WindowTopNSpec(("cat",), (("price", "desc"),), 2)
    op.process_batch(windowed_batch, None)       # columns cat, price, window_start, window_end
    op.process_watermark(9_999)                  # the top 2 per cat of windows ending by 10 s
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.exceptions import DataError, StateError
from epochstream.graph.specs import WindowTopNSpec
from epochstream.runtime.operators.base import Operator, SnapshotParts
from epochstream.runtime.operators.columnar_aggregates import own_backend
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.runtime.operators.fired_watermarks import NO_WATERMARK, FiredWatermarks
from epochstream.state.backends.base import RowSchema, RowTable, SnapshotTarget
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.columnar_checks import require_columns
from epochstream.state.handles import OperatorRestore
from epochstream.state.key_index import canonical_float_keys

__all__ = ["ColumnarWindowTopNOperator", "partition_ids", "rank_rows"]

#: The row tables' key column: each row's key group, as uint64 so a table is a queue by
#: key and ``pop_until`` takes all its rows out without dropping it (a window's rows are
#: read whole; dropping and making a RocksDB column family per pruning costs more).
_GROUP = "_tn_group"
_ALL_GROUPS = 2**32 - 1
#: The row table of the watermark each key group had fired windows up to at the last
#: snapshot (one row per key group), and its watermark column.
_FIRED_MARKS = FiredWatermarks("topn-fired", _GROUP, "_tn_watermark")
#: Between the table prefix and the window end in a row table's name.
_PREFIX = "topn@"
#: A window's table is not re-ranked below this many rows (small tables stay as they are).
_PRUNE_FLOOR = 1_024


def partition_ids(table: pa.Table, columns: list[str]) -> np.ndarray:
    """One int64 id per row, equal for rows of one partition (NULL is a value, equal
    floats alike: ``-0.0`` is ``0.0``, every NaN one NaN).

    Each column's dictionary codes are digits of a mixed-radix number (one
    multiply-add per column); ids need not be dense, only equal per partition. When the
    radices' product would overflow int64, rows of codes are ranked instead (slower:
    ``unique`` sorts them).
    """
    if not columns:
        return np.zeros(table.num_rows, dtype=np.int64)
    codes, radices = [], []
    for name in columns:
        column = canonical_float_keys(table.column(name).combine_chunks())
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        radices.append(max(len(encoded.dictionary), 1))
    if float(np.prod(np.array(radices, dtype=np.float64))) < 2.0**62:
        ids = codes[0]
        for code, radix in zip(codes[1:], radices[1:], strict=True):
            ids = ids * radix + code
        return ids
    _, ids = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
    return ids.reshape(-1).astype(np.int64)


def _sort_columns(
    table: pa.Table, order_by: tuple[tuple[str, str], ...]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Helper columns and sort keys ordering ``table`` by ``order_by`` with Flink's
    NULL placement and NaN as the largest float (Arrow places both by one option for
    all keys, so each key's NULLs and NaNs are ordered by a boolean column of its own)."""
    columns: dict[str, Any] = {}
    keys: list[tuple[str, str]] = []
    for i, (name, direction) in enumerate(order_by):
        way = "ascending" if direction == "asc" else "descending"
        column = table.column(name)
        # valid False < True: ascending puts NULLs first, descending last.
        columns[f"v{i}"] = pc.is_valid(column)
        keys.append((f"v{i}", way))
        if pa.types.is_floating(column.type):
            columns[f"n{i}"] = pc.fill_null(pc.is_nan(column), False)
            keys.append((f"n{i}", way))
        columns[f"o{i}"] = column
        keys.append((f"o{i}", way))
    return columns, keys


def rank_rows(
    table: pa.Table, partition_by: list[str], order_by: tuple[tuple[str, str], ...], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, row_numbers)`` of the first ``n`` rows of each partition of
    ``table`` by ``order_by`` (ties by position), grouped by partition, in rank order.

    Example::

        t = pa.table({"p": ["a", "a", "b"], "x": [1, 5, 3]})
        rank_rows(t, ["p"], (("x", "desc"),), 1)   # positions [1, 2], row numbers [1, 1]
    """
    rows = table.num_rows
    if not rows:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    helpers, keys = _sort_columns(table, order_by)
    sortable = pa.table({"p": pa.array(partition_ids(table, partition_by)), **helpers})
    order = pc.sort_indices(sortable, sort_keys=[("p", "ascending"), *keys]).to_numpy()
    part = sortable.column("p").to_numpy()[order]
    first = np.ones(rows, dtype=bool)
    np.not_equal(part[1:], part[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    row_numbers = np.arange(rows) - starts[np.cumsum(first) - 1] + 1
    keep = row_numbers <= n
    return order[keep], row_numbers[keep]


def _window_ends(batch: pa.RecordBatch | pa.Table, where: str) -> np.ndarray:
    """The ``window_end`` column as int64 ms; a null end is bad data."""
    column = batch.column("window_end")
    if column.null_count:
        raise DataError(f"{where}: a row has no window_end; a window Top-N needs it on every row")
    kind = column.type
    if not (pa.types.is_timestamp(kind) or pa.types.is_integer(kind)):
        raise DataError(f"{where}: window_end is {kind}, not a timestamp or integer (ms)")
    if pa.types.is_timestamp(kind):
        column = column.cast(pa.timestamp("ms")).cast(pa.int64())
    return np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _table_name(end: int) -> str:
    """The row table of the window ending at ``end``: ``_table_name(10) == "topn@10"``."""
    return f"{_PREFIX}{end}"


def _end_of(name: str) -> int | None:
    """The window end of a Top-N row table's name, else None."""
    prefix, sep, end = name.partition("@")
    if not sep or f"{prefix}@" != _PREFIX:
        return None
    try:
        return int(end)
    except ValueError:
        return None


class ColumnarWindowTopNOperator(Operator):
    """Window Top-N on record batches (see the module docstring).

    Output batches: the input's columns (without ``_ts`` and ``_kg``), the row number
    column (int64) when ``rank_column`` is set, and ``_ts = window_end - 1``; one batch
    per watermark that fires windows, windows by end, each partition's rows by rank.
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        #: The key groups of this subtask (those its backend holds).
        self.key_groups = self.keyed.key_group_range
        self.topn: WindowTopNSpec = spec.payload
        self.watermark = NO_WATERMARK
        #: Per key group of this subtask (from its first), the restored watermark its
        #: windows had fired up to; None without a restore.
        self.fired: np.ndarray | None = None
        #: Per open window end: rows held, and rows held after its last pruning.
        self.sizes: dict[int, list[int]] = {}
        self._schema: RowSchema | None = None
        self._where = ctx.task_name
        self._ranked_by = [*self.topn.partition_by, "window_end"]

    # ---------------------------------------------------------------- state
    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        names = [n for n in self.keyed.row_tables() if n != _FIRED_MARKS.table]
        other = [n for n in names if _end_of(n) is None] + self.keyed.column_tables()
        if other:
            raise StateError(
                f"{self._where}: restored state is not a window Top-N's (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )
        for name in names:
            table = self.keyed.row_table(name)
            assert table is not None
            self._schema = table.schema
            held = len(table)
            self.sizes[int(_end_of(name) or 0)] = [held, held]
        self.fired = _FIRED_MARKS.restore(self.keyed, self.key_groups)

    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        assert self.keyed is not None
        _FIRED_MARKS.file(self.keyed, self.key_groups, self.watermark, self.fired)
        return super().snapshot(target)

    def _table(self, end: int) -> RowTable:
        assert self.keyed is not None and self._schema is not None
        table = self.keyed.row_table(_table_name(end), self._schema)
        assert table is not None
        return table

    # ---------------------------------------------------------------- batches
    def _check(self, batch: pa.RecordBatch) -> None:
        order = tuple(c for c, _ in self.topn.order_by)
        columns = (*self.topn.partition_by, *order, "window_start", "window_end")
        require_columns(batch.schema, columns, self._where)
        rank = self.topn.rank_column
        if rank is not None and rank in batch.schema.names:
            raise DataError(
                f"{self._where}: the input has a column {rank!r} already, the Top-N's rank "
                "column; name the rank column otherwise"
            )

    def _rows(self, batch: pa.RecordBatch) -> pa.Table:
        """The batch's rows as the tables keep them: without ``_ts`` and ``_kg``, with
        their key group under ``_tn_group``."""
        names = batch.schema.names
        if KG_COLUMN in names:
            groups = batch.column(KG_COLUMN).cast(pa.uint64())
        else:  # driven without a hash edge (tests, tools): the edge's key groups
            columns = [batch.column(c) for c in self.topn.partition_by]
            groups = pa.array(
                key_groups_by_columns(columns, self.ctx.max_parallelism, rows=batch.num_rows),
                pa.uint64(),
            )
        kept = [n for n in names if n not in (KG_COLUMN, TS_COLUMN)]
        rows = pa.Table.from_batches([batch.select(kept)]).append_column(_GROUP, groups)
        if self._schema is None:
            self._schema = RowSchema(rows.schema, _GROUP)
        return rows

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        self._check(batch)
        ends = _window_ends(batch, self._where)
        rows = self._rows(batch)
        fired = np.full(len(ends), self.watermark, dtype=np.int64)
        if self.fired is not None:
            slots = rows.column(_GROUP).to_numpy().astype(np.int64) - self.key_groups.start
            np.maximum(fired, self.fired[slots], out=fired)
        late = ends - 1 <= fired
        if late.any():
            self.counters.late_records_dropped += int(late.sum())
            rows, ends = rows.filter(pa.array(~late)), ends[~late]
            if not rows.num_rows:
                return
        # Only a batch's own best n per (window, partition) can make a window's best n.
        positions, _ = rank_rows(rows, self._ranked_by, self.topn.order_by, self.topn.n)
        positions.sort()  # arrival order kept within a partition (ties)
        rows, ends = rows.take(pa.array(positions)), ends[positions]
        for end in np.unique(ends).tolist():
            self._append(int(end), rows.filter(pa.array(ends == end)))

    def _append(self, end: int, rows: pa.Table) -> None:
        """Add ``rows`` to window ``end``'s table; prune it when it has doubled."""
        self._table(end).append(*_with_groups(rows))
        size = self.sizes.setdefault(end, [0, 0])
        size[0] += rows.num_rows
        if size[0] > max(2 * size[1], _PRUNE_FLOOR):
            table = self._table(end)
            kept = self._ranked(table.pop_until(_ALL_GROUPS))[0]
            table.append(*_with_groups(kept))
            size[:] = [kept.num_rows, kept.num_rows]

    def _take(self, end: int) -> pa.Table:
        """Drop window ``end``'s table and return its rows."""
        assert self.keyed is not None
        name = _table_name(end)
        table = self.keyed.row_table(name)
        rows = table.table() if table is not None else None
        self.keyed.drop_row_table(name)
        if rows is None:
            assert self._schema is not None
            return self._schema.schema.empty_table()
        return rows.drop_columns([KG_COLUMN])

    def _ranked(self, rows: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """Each partition's first n of ``rows`` in rank order, and their row numbers."""
        positions, numbers = rank_rows(rows, self._ranked_by, self.topn.order_by, self.topn.n)
        return rows.take(pa.array(positions)), numbers

    # ---------------------------------------------------------------- firing
    def process_watermark(self, watermark: int) -> None:
        self.watermark = max(self.watermark, watermark)
        due = sorted(end for end in self.sizes if end - 1 <= watermark)
        out = [self._fire(end) for end in due]
        out = [b for b in out if b.num_rows]
        if out:
            self.output.collect(pa.concat_batches(out), None)
        self.emit_watermark(watermark)

    def _fire(self, end: int) -> pa.RecordBatch:
        """Window ``end``'s result rows, its table dropped."""
        del self.sizes[end]
        kept, numbers = self._ranked(self._take(end))
        kept = kept.drop_columns([_GROUP])
        if self.topn.rank_column is not None:
            kept = kept.append_column(self.topn.rank_column, pa.array(numbers, pa.int64()))
        ts = pa.array(np.full(kept.num_rows, end - 1, dtype=np.int64))
        return _one_batch(kept.append_column(TS_COLUMN, ts))

    def state_table(self) -> pa.Table:
        """Every open window's rows (``_kg``, input columns, ``_tn_group``): tests, tools."""
        assert self.keyed is not None
        tables = [
            t.table()
            for end in sorted(self.sizes)
            if (t := self.keyed.row_table(_table_name(end))) is not None
        ]
        if not tables:
            return pa.table({KG_COLUMN: pa.array([], pa.int32())})
        return pa.concat_tables(tables)


def _one_batch(rows: pa.Table) -> pa.RecordBatch:
    """``rows`` as one record batch."""
    return pa.RecordBatch.from_arrays(
        [c.combine_chunks() for c in rows.columns], schema=rows.schema
    )


def _with_groups(rows: pa.Table) -> tuple[pa.RecordBatch, np.ndarray]:
    """``rows`` as one record batch and their key groups (column ``_tn_group``)."""
    record = _one_batch(rows)
    groups = record.column(_GROUP).to_numpy(zero_copy_only=False)
    return record, groups.astype(np.int32)
