"""Flink SQL's OVER aggregation over event time on batches: ``agg(x) OVER (PARTITION BY
k ORDER BY rowtime ROWS|RANGE BETWEEN ... PRECEDING AND CURRENT ROW)``: every input row
comes out once, with its aggregates appended, when the watermark passes its time.

Semantics (Flink's ``RowTime{Rows,Range}{Bounded,Unbounded}PrecedingFunction``): rows
wait per key until the watermark passes their time, then are processed in time order,
rows of equal time by arrival. For ``ROWS n`` a row's frame is itself and the ``n``
rows before it (earlier peers included, later ones not); for ``RANGE r`` it is every
row of the key at most ``r`` ms older, peers of equal time included (so peers get the
same values); ``UNBOUNDED`` is every row before (ROWS) or up to its time (RANGE). Rows
at or behind the watermark when they come are late: dropped, counted in
``late_records_dropped``.

Vectorized per watermark: the due rows and the key groups' retained history are one
table, sorted by (partition, time, arrival); each row's frame is an index interval
``[lo, hi]`` (ROWS: a subtraction; RANGE: ``searchsorted`` on a (partition, time rank)
key), COUNT/SUM/AVG are prefix-sum differences and MIN/MAX sparse-table range queries:
no Python per row or per key.

Rows enter the frames as *contributions* (:class:`Contributions`): per aggregate its
non-null count, its sum (a float sum's NaN and infinities counted apart, so a prefix
sum stays finite), its MIN/MAX candidate (NaN counted apart: NaN is SQL's largest
float). A contribution row may stand for many rows: ``UNBOUNDED`` frames keep per key
one row of the whole past's contributions (its running accumulators).

State, in row tables of the job's keyed-state backend (snapshotted, restored at any
parallelism by key group, on heap and RocksDB alike):

- ``over-buffer``: the rows the watermark has not passed, keyed by their time (a uint64
  queue, so a watermark pops exactly its due rows), filed under their key group;
- ``over-history``: per key what later frames still need, as contributions, keyed by
  key group (a watermark rewrites only the key groups it touched): the last ``n`` rows
  (ROWS), the rows newer than ``watermark - r`` (RANGE), one accumulator row
  (UNBOUNDED);
- ``over-fired``: per key group the watermark at the last snapshot, so after a restore
  (which starts from no watermark) rows the old subtask would have dropped as late are
  dropped too.

Processing time (spec ``proctime=True``, ``ORDER BY`` a ``PROCTIME()`` attribute): a
batch's rows take the operator clock's time on arrival (never behind an earlier
batch's), are aggregated and emitted at once, and watermarks are only forwarded; a
batch's rows are peers of one time (a RANGE frame sees them all), rows of a later batch
at the same millisecond see them, not the other way round (Flink's
``ProcTimeRangeBoundedPrecedingFunction`` waits for the millisecond's end instead).

Example::

    op = ColumnarOverAggregateOperator(spec, ctx)   # OverAggregateSpec(("k",), aggs, "rows", 2)
    op.process_batch(pa.record_batch({"k": ["a", "a"], "v": [1, 2], "_ts": [5, 7]}), None)
    op.process_watermark(7)                         # both rows, each with its frame's values
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.exceptions import DataError, StateError
from epochstream.graph.specs import AggCall, OverAggregateSpec
from epochstream.runtime.operators.base import Operator, SnapshotParts
from epochstream.runtime.operators.columnar_aggregates import own_backend
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.runtime.operators.columnar_window_aggregates import check_aggregate_input
from epochstream.runtime.operators.columnar_window_topn import partition_ids
from epochstream.runtime.operators.fired_watermarks import NO_WATERMARK, FiredWatermarks
from epochstream.state.backends.base import RowSchema, RowTable, SnapshotTarget
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.columnar_checks import event_times
from epochstream.state.handles import OperatorRestore
from epochstream.state.key_index import canonical_float_keys

__all__ = ["ColumnarOverAggregateOperator", "Contributions", "frame_bounds"]

_BUFFER, _HISTORY, _FIRED = "over-buffer", "over-history", "over-fired"
#: Columns of the tables: the buffer's queue key (time as uint64), each row's time,
#: arrival number and key group, and the fired table's watermark.
_QUEUE, _TIME, _SEQ, _GROUP, _MARK = "_ov_queue", "_ov_ts", "_ov_seq", "_ov_group", "_ov_mark"
_ROWS = "_ov_rows"
_FIRED_MARKS = FiredWatermarks(_FIRED, _GROUP, _MARK)
#: Buffer keys (:func:`_queue_keys`): event times within +-2**47 ms (4,000 years
#: around 1970), key groups below 2**16.
_TIME_OFFSET, _GROUP_BITS = 2**47, 16


def _queue_keys(times: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The buffer's keys: time, then key group, in one uint64 (a row table's key must
    not span key groups, and a watermark pops the keys up to its time's last)."""
    return ((times + _TIME_OFFSET).astype(np.uint64) << np.uint64(_GROUP_BITS)) | groups.astype(
        np.uint64
    )


def _due_bound(watermark: int) -> int:
    """The last buffer key at or before ``watermark`` (-1: none)."""
    if watermark < -_TIME_OFFSET:
        return -1
    last = min(watermark, _TIME_OFFSET - 1) + _TIME_OFFSET
    return (last << _GROUP_BITS) | ((1 << _GROUP_BITS) - 1)


def _without(rows: pa.Table, names: tuple[str, ...]) -> pa.Table:
    """``rows`` without those of ``names`` it has (``_kg`` comes with some reads only)."""
    return rows.drop_columns([n for n in names if n in rows.schema.names])


def _numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False))


class Contributions:
    """What each row adds to a frame, per aggregate (columns ``_ov<i>_<part>``): ``n``
    non-null values, ``s`` sum (NULL adds 0; an int sum's float shadow ``f`` checks
    int64 overflow), ``m`` MIN/MAX candidate (NULL when none, NaN not one), ``z`` NaN
    count; ``_ov_rows`` counts rows. Contribution rows merge (:meth:`collapse`): sums
    add, candidates take their min/max.

    Example::

        parts = Contributions((AggCall("sum", "v", "s"),), floats=set())
        parts.of(pa.table({"v": [1, None]}))   # _ov_rows [1, 1], _ov0_s [1, 0], _ov0_n [1, 0]...
    """

    def __init__(self, aggs: tuple[AggCall, ...], floats: set[str]) -> None:
        self.aggs = aggs
        self.floats = floats

    def of(self, rows: pa.Table) -> dict[str, pa.Array]:
        """The contributions of raw input ``rows``."""
        out: dict[str, pa.Array] = {_ROWS: pa.array(np.ones(rows.num_rows, np.int64))}
        for i, agg in enumerate(self.aggs):
            if agg.column is None:
                continue
            p = f"_ov{i}"
            value = rows.column(agg.column).combine_chunks()
            floating = agg.column in self.floats
            if agg.kind in ("min", "max"):
                if floating:
                    nan = pc.fill_null(pc.is_nan(value), False)
                    out[f"{p}_z"] = nan.cast(pa.int64())
                    value = pc.if_else(nan, pa.scalar(None, value.type), value)
                out[f"{p}_m"] = value
                continue
            out[f"{p}_n"] = pc.is_valid(value).cast(pa.int64())
            if agg.kind in ("sum", "avg"):
                kind = pa.float64() if floating else pa.int64()
                out[f"{p}_s"] = pc.fill_null(value.cast(kind), 0)
                if not floating:
                    out[f"{p}_f"] = pc.fill_null(value.cast(pa.float64()), 0.0)
        return out

    def collapse(self, rows: pa.Table, lo: np.ndarray, hi: np.ndarray) -> pa.Table:
        """One contribution row per interval ``[lo, hi]`` of ``rows`` (an UNBOUNDED
        frame's accumulator): the interval's last row with its contributions merged
        (counts and sums added, candidates reduced)."""
        merged = rows.take(pa.array(hi))
        for name in merged.schema.names:
            if name == _ROWS or (name.startswith("_ov") and name[3].isdigit()):
                at = merged.schema.get_field_index(name)
                merged = merged.set_column(at, name, self._merged(name, rows, lo, hi))
        return merged

    def _merged(self, name: str, rows: pa.Table, lo: np.ndarray, hi: np.ndarray) -> pa.Array:
        column = rows.column(name).combine_chunks()
        if name.endswith("_m"):
            kind = self.aggs[int(name[3:].split("_")[0])].kind
            return _frame_extreme(column, lo, hi, kind)
        values = _numpy(column)
        if values.dtype == np.float64:
            return pa.array(_float_range_sum(values, lo, hi))
        return pa.array(_range_sum(values, lo, hi), column.type)

    def values(self, rows: pa.Table, lo: np.ndarray, hi: np.ndarray, where: str) -> list[pa.Array]:
        """Each aggregate over the frames ``[lo, hi]`` (index intervals into ``rows``,
        contribution rows sorted by partition and time)."""
        return [self._value(i, agg, rows, lo, hi, where) for i, agg in enumerate(self.aggs)]

    def _value(
        self, i: int, agg: AggCall, rows: pa.Table, lo: np.ndarray, hi: np.ndarray, where: str
    ) -> pa.Array:
        p = f"_ov{i}"

        def frame_sum(name: str) -> np.ndarray:
            return _range_sum(_numpy(rows.column(name)), lo, hi)

        if agg.kind == "count_star":
            return pa.array(frame_sum(_ROWS), pa.int64())
        if agg.kind in ("min", "max"):
            return self._extreme(agg, p, rows, lo, hi)
        count = frame_sum(f"{p}_n")
        if agg.kind == "count":
            return pa.array(count, pa.int64())
        none = count == 0
        floating = agg.column in self.floats
        if floating:
            total = _float_range_sum(_numpy(rows.column(f"{p}_s")).astype(np.float64), lo, hi)
        else:
            shadow = _range_sum(_numpy(rows.column(f"{p}_f")), lo, hi)
            if len(shadow) and float(np.max(np.abs(shadow))) >= 2.0**63:
                raise DataError(
                    f"{where}: {agg.kind.upper()}({agg.column}) for {agg.output!r} leaves the "
                    "int64 range; cast the column to DOUBLE first"
                )
            total = _range_sum(_numpy(rows.column(f"{p}_s")).astype(np.int64), lo, hi)
        if agg.kind == "sum":
            return pa.array(total, mask=none)
        if floating:
            with np.errstate(invalid="ignore", divide="ignore"):
                return pa.array(total / np.maximum(count, 1), pa.float64(), mask=none)
        # AVG of integers is an integer, truncated toward zero (Flink's, DuckDB's trunc).
        quotient = np.abs(total) // np.maximum(count, 1) * np.sign(total)
        return pa.array(quotient, pa.int64(), mask=none)

    def _extreme(
        self, agg: AggCall, p: str, rows: pa.Table, lo: np.ndarray, hi: np.ndarray
    ) -> pa.Array:
        """MIN/MAX over the frames, NaN as the largest float."""
        result = _frame_extreme(rows.column(f"{p}_m").combine_chunks(), lo, hi, agg.kind)
        if agg.column not in self.floats:
            return result
        nans = _range_sum(_numpy(rows.column(f"{p}_z")), lo, hi) > 0
        if agg.kind == "min":  # NaN only when every non-null value is NaN
            nans &= _numpy(pc.is_null(result)).astype(bool)
        return pc.if_else(pa.array(nans), pa.scalar(float("nan"), result.type), result)


def _frame_extreme(column: pa.Array, lo: np.ndarray, hi: np.ndarray, kind: str) -> pa.Array:
    """MIN (``kind == "min"``) or MAX of ``column`` per frame ``[lo, hi]``, NULL where a
    frame has no value: a sparse-table range query, NULLs filled with the identity."""
    valid = _numpy(pc.is_valid(column)).astype(bool)
    present = _range_sum(valid.astype(np.int64), lo, hi) > 0
    kind_of = column.type
    sorted_values: pa.Array | None = None
    if pa.types.is_floating(kind_of):
        values = _numpy(pc.fill_null(column.cast(pa.float64()), 0.0)).astype(np.float64)
        fill: float | int = np.inf if kind == "min" else -np.inf
    else:
        if pa.types.is_integer(kind_of) or pa.types.is_timestamp(kind_of):
            codes = column.cast(pa.int64())
        else:  # strings, decimals, dates...: their ranks among the distinct values
            distinct = pc.unique(column.drop_null())
            sorted_values = distinct.take(pc.sort_indices(distinct))
            codes = pc.index_in(column, value_set=sorted_values)
        values = _numpy(pc.fill_null(codes, 0)).astype(np.int64)
        info = np.iinfo(np.int64)
        fill = int(info.max) if kind == "min" else int(info.min)
    values = np.where(valid, values, fill).astype(values.dtype)
    best = _range_extreme(values, lo, hi, np.minimum if kind == "min" else np.maximum)
    if sorted_values is not None:
        return sorted_values.take(pa.array(np.where(present, best, 0), mask=~present))
    return pa.array(best, mask=~present).cast(kind_of)


def _range_sum(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``values[lo:hi + 1].sum()`` per frame, by prefix sums (int64 wraps, the frame
    difference is exact when the frame's sum fits)."""
    prefix = np.zeros(len(values) + 1, dtype=values.dtype)
    np.cumsum(values, out=prefix[1:])
    return prefix[hi + 1] - prefix[lo]


def _float_range_sum(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Frame sums of floats: NaN and the infinities counted apart, so one of them does
    not poison every later prefix; a frame with NaN, or with both infinities, is NaN."""
    nan = np.isnan(values)
    up = np.isposinf(values)
    down = np.isneginf(values)
    finite = np.where(nan | up | down, 0.0, values)
    total = _range_sum(finite, lo, hi)
    has_nan = _range_sum(nan.astype(np.int64), lo, hi) > 0
    has_up = _range_sum(up.astype(np.int64), lo, hi) > 0
    has_down = _range_sum(down.astype(np.int64), lo, hi) > 0
    total = np.where(has_up, np.inf, total)
    total = np.where(has_down, -np.inf, total)
    return np.where(has_nan | (has_up & has_down), np.nan, total)


def _range_extreme(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, fn: Any) -> np.ndarray:
    """``fn``-reduction (``np.minimum``/``np.maximum``) of ``values[lo:hi + 1]`` per frame:
    a sparse table (level ``j`` holds the reduction of ``2**j`` values from each index),
    two overlapping blocks per frame."""
    if not len(lo):
        return values[:0]
    levels = [values]
    width = 1
    longest = int(np.max(hi - lo)) + 1
    while width * 2 <= longest:
        last = levels[-1]
        levels.append(fn(last[:-width], last[width:]))
        width *= 2
    span = hi - lo + 1
    level = np.floor(np.log2(span)).astype(np.int64)
    out = np.empty(len(lo), dtype=values.dtype)
    for j in np.unique(level).tolist():
        at = level == j
        table = levels[j]
        out[at] = fn(table[lo[at]], table[hi[at] - (1 << j) + 1])
    return out


def _segments(parts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first and last index of each run of equal ``parts`` (sorted ids)."""
    first = np.ones(len(parts), dtype=bool)
    np.not_equal(parts[1:], parts[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return starts, np.append(starts[1:] - 1, len(parts) - 1)


def frame_bounds(
    parts: np.ndarray, times: np.ndarray, frame: str, preceding: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` per row: the index interval of its frame in rows sorted by
    (partition id ``parts``, time, arrival).

    Example::

        frame_bounds(np.array([0, 0, 0]), np.array([1, 2, 2]), "range", 0)  # lo [0, 1, 1], hi [0, 2, 2]
    """
    n = len(parts)
    index = np.arange(n, dtype=np.int64)
    first = np.ones(n, dtype=bool)
    np.not_equal(parts[1:], parts[:-1], out=first[1:])
    starts = index[first][np.cumsum(first) - 1]
    if frame == "rows":
        lo = starts if preceding is None else np.maximum(starts, index - preceding)
        return lo, index
    # RANGE: (segment, rank of time) keys; a frame ends at its last peer.
    segment = np.cumsum(first) - 1
    low_times = times - (preceding or 0)
    ranks = np.unique(np.concatenate([times, low_times]))
    width = len(ranks) + 1
    keys = segment * width + np.searchsorted(ranks, times)
    hi = np.searchsorted(keys, keys, "right") - 1
    if preceding is None:
        return starts, hi
    low_keys = segment * width + np.searchsorted(ranks, low_times)
    return np.searchsorted(keys, low_keys, "left"), hi


class ColumnarOverAggregateOperator(Operator):
    """OVER aggregation over event time on record batches (see the module docstring).

    Output batches: the input's columns (without ``_kg``), each aggregate's ``output``
    column, and ``_ts`` (the row's own time); per watermark one batch of the rows it
    passed, by partition, time and arrival.
    """

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        self.key_groups = self.keyed.key_group_range
        self.over: OverAggregateSpec = spec.payload
        self.watermark = NO_WATERMARK
        #: Per key group (from this subtask's first), the restored fired watermark.
        self.fired: np.ndarray | None = None
        self.seq = 0
        #: The latest time rows took (processing time: the clock, never going back).
        self.latest = NO_WATERMARK
        self._types: dict[str, pa.DataType] = {}
        self._where = ctx.task_name
        self._keys = list(self.over.partition_by)

    # ---------------------------------------------------------------- state
    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        other = [n for n in self.keyed.row_tables() if n not in (_BUFFER, _HISTORY, _FIRED)]
        other += self.keyed.column_tables()
        if other:
            raise StateError(
                f"{self._where}: restored state is not an OVER aggregation's (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )
        for name in (_BUFFER, _HISTORY):
            table = self.keyed.row_table(name)
            if table is not None and len(table):
                rows = table.table()
                self.seq = max(self.seq, int(pc.max(rows.column(_SEQ)).as_py()) + 1)
                self.latest = max(self.latest, int(pc.max(rows.column(_TIME)).as_py()))
        self.fired = _FIRED_MARKS.restore(self.keyed, self.key_groups)

    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        assert self.keyed is not None
        _FIRED_MARKS.file(self.keyed, self.key_groups, self.watermark, self.fired)
        return super().snapshot(target)

    def _table(self, name: str, schema: pa.Schema, key: str) -> RowTable:
        assert self.keyed is not None
        table = self.keyed.row_table(name)
        if table is None:
            table = self.keyed.row_table(name, RowSchema(schema, key))
            assert table is not None
        return table

    # ---------------------------------------------------------------- batches
    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        proctime = self.over.proctime
        check_aggregate_input(
            batch, self._keys, self.over.aggs, self._types, self._where, event_time=not proctime
        )
        self._check(batch)
        groups = self._key_groups(batch)
        if proctime:
            # The batch's rows take the clock's time on arrival (never behind an earlier
            # batch's) and are aggregated at once: nothing waits.
            self.latest = max(self.latest, self.ctx.clock_ms())
            times = np.full(batch.num_rows, self.latest, dtype=np.int64)
            rows = self._rows(batch, times, groups)
            # Later rows may share this time: the history keeps the rows they reach.
            out = self._aggregate(pa.Table.from_batches([rows]), self.latest - 1)
            self.output.collect(out, None)
            return
        times = event_times(batch, self._where)
        fired = np.full(len(times), self.watermark, dtype=np.int64)
        if self.fired is not None:
            np.maximum(fired, self.fired[groups - self.key_groups.start], out=fired)
        if len(times) and (times.min() < -_TIME_OFFSET or times.max() >= _TIME_OFFSET):
            raise DataError(
                f"{self._where}: an event time is outside +-2**47 ms of 1970 (the OVER "
                "aggregation's buffer orders rows by it within that range)"
            )
        late = times <= fired
        if late.any():
            self.counters.late_records_dropped += int(late.sum())
            keep = ~late
            batch, times, groups = batch.filter(pa.array(keep)), times[keep], groups[keep]
            if not batch.num_rows:
                return
        rows = self._rows(batch, times, groups)
        queue = pa.array(_queue_keys(times, groups))
        rows = pa.RecordBatch.from_arrays(
            [*rows.columns, queue], names=[*rows.schema.names, _QUEUE]
        )
        self._table(_BUFFER, rows.schema, _QUEUE).append(rows, groups.astype(np.int32))

    def _rows(self, batch: pa.RecordBatch, times: np.ndarray, groups: np.ndarray) -> pa.RecordBatch:
        """The batch's rows (without ``_kg`` and ``_ts``) with their time, arrival
        number and key group."""
        kept = [n for n in batch.schema.names if n not in (KG_COLUMN, TS_COLUMN)]
        seqs = np.arange(self.seq, self.seq + batch.num_rows, dtype=np.int64)
        self.seq += batch.num_rows
        return pa.RecordBatch.from_arrays(
            [
                *(batch.column(n) for n in kept),
                pa.array(times),
                pa.array(seqs),
                pa.array(groups.astype(np.uint64)),
            ],
            names=[*kept, _TIME, _SEQ, _GROUP],
        )

    def _check(self, batch: pa.RecordBatch) -> None:
        """Aggregate outputs not among the input's columns."""
        taken = [a.output for a in self.over.aggs if a.output in batch.schema.names]
        if taken:
            raise DataError(
                f"{self._where}: the input has a column {taken[0]!r} already, an OVER "
                "aggregate's output; name the aggregate otherwise"
            )

    def _key_groups(self, batch: pa.RecordBatch) -> np.ndarray:
        if KG_COLUMN in batch.schema.names:
            return _numpy(batch.column(KG_COLUMN)).astype(np.int64)
        columns = [canonical_float_keys(batch.column(k)) for k in self._keys]
        kgs = key_groups_by_columns(columns, self.ctx.max_parallelism, rows=batch.num_rows)
        return np.asarray(kgs, dtype=np.int64)

    # ---------------------------------------------------------------- firing
    def process_watermark(self, watermark: int) -> None:
        if watermark > self.watermark and not self.over.proctime:
            self.watermark = watermark
            out = self._fire(watermark)
            if out is not None and out.num_rows:
                self.output.collect(out, None)
        self.emit_watermark(watermark)

    def _fire(self, watermark: int) -> pa.RecordBatch | None:
        """The rows the watermark passed, with their aggregates; history updated."""
        assert self.keyed is not None
        buffer = self.keyed.row_table(_BUFFER)
        if buffer is None or not len(buffer):
            return None
        due = buffer.pop_until(_due_bound(watermark))
        if not due.num_rows:
            return None
        return self._aggregate(_without(due, (KG_COLUMN, _QUEUE)), watermark)

    def _aggregate(self, due: pa.Table, now: int) -> pa.RecordBatch:
        """The ``due`` rows with their aggregates, the history updated (rows no frame
        after time ``now`` reaches are let go)."""
        floats = {
            a.column
            for a in self.over.aggs
            if a.column is not None and pa.types.is_floating(due.schema.field(a.column).type)
        }
        parts = Contributions(self.over.aggs, floats)
        touched = np.unique(_numpy(due.column(_GROUP)))
        history = self._pop_history(touched)
        fresh = pa.table(
            {
                **{k: due.column(k) for k in self._keys},
                _TIME: due.column(_TIME),
                _SEQ: due.column(_SEQ),
                _GROUP: due.column(_GROUP),
                **parts.of(due),
            }
        )
        combined = (
            fresh
            if history is None
            else pa.concat_tables(
                [history, fresh.select(history.schema.names).cast(history.schema)]
            )
        )
        new = np.zeros(combined.num_rows, dtype=bool)
        new[combined.num_rows - fresh.num_rows :] = True
        ids = partition_ids(combined, self._keys)
        times = _numpy(combined.column(_TIME)).astype(np.int64)
        order = np.lexsort((_numpy(combined.column(_SEQ)), times, ids))
        combined, ids, times, new = (
            combined.take(pa.array(order)),
            ids[order],
            times[order],
            new[order],
        )
        lo, hi = frame_bounds(ids, times, self.over.frame, self.over.preceding)
        positions = np.flatnonzero(new)
        values = parts.values(combined, lo[positions], hi[positions], self._where)
        self._keep_history(combined, ids, times, now, parts)
        # The due rows in the output's order: their positions among the new rows.
        fresh_order = order[positions] - (combined.num_rows - fresh.num_rows)
        rows = due.take(pa.array(fresh_order))
        inputs = [n for n in rows.schema.names if n not in (_TIME, _SEQ, _GROUP)]
        columns = [rows.column(n).combine_chunks() for n in inputs]
        columns += [*values, rows.column(_TIME).combine_chunks()]
        names = [*inputs, *(a.output for a in self.over.aggs), TS_COLUMN]
        return pa.RecordBatch.from_arrays(columns, names=names)

    def _pop_history(self, groups: np.ndarray) -> pa.Table | None:
        assert self.keyed is not None
        table = self.keyed.row_table(_HISTORY)
        if table is None:
            return None
        rows = table.pop(pa.array(groups.astype(np.uint64)), groups.astype(np.int32))
        return _without(rows, (KG_COLUMN,))

    def _keep_history(
        self,
        rows: pa.Table,
        ids: np.ndarray,
        times: np.ndarray,
        watermark: int,
        parts: Contributions,
    ) -> None:
        """What later frames need of the sorted contribution ``rows``, put back."""
        preceding = self.over.preceding
        if preceding is None:
            kept = parts.collapse(rows, *_segments(ids))
        elif self.over.frame == "rows":
            _, ends = _segments(ids)
            end_of = ends[np.searchsorted(ends, np.arange(len(ids)))]
            kept = rows.filter(pa.array(np.arange(len(ids)) > end_of - preceding))
        else:
            kept = rows.filter(pa.array(times > watermark - preceding))
        if not kept.num_rows:
            return
        batch = pa.RecordBatch.from_arrays(
            [c.combine_chunks() for c in kept.columns], schema=kept.schema
        )
        groups = _numpy(batch.column(_GROUP)).astype(np.int32)
        self._table(_HISTORY, batch.schema, _GROUP).append(batch, groups)

    def state_table(self) -> pa.Table:
        """The buffered rows (tests, tools)."""
        assert self.keyed is not None
        table = self.keyed.row_table(_BUFFER)
        return table.table() if table is not None else pa.table({})
