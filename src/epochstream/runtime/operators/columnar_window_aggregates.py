"""The SQL window aggregation on batches: ``GROUP BY window_start, window_end, keys...``
over ``TABLE(TUMBLE|HOP|CUMULATE(...))`` with Flink SQL's semantics and slice sharing.

Each row goes to exactly one *slice* (``size`` wide for tumble, ``gcd(size, slide)``
for hop, ``step`` for cumulate; :class:`SliceAssigner`), so a row costs the same
whatever the window's size and slide. A batch is folded into per-(key, slice) partial
aggregates by one Arrow hash ``group_by`` (:class:`AggregateCalls` says which columns
each aggregate needs); when the watermark passes ``window_end - 1`` a window is the
merge of its slices' partials (one more ``group_by``), emitted in order of window end.
Slices no unfired window needs are dropped; rows all of whose windows fired are late
(dropped, counted in ``late_records_dropped``).

State: row tables of the job's keyed-state backend (``env.set_state_backend``;
:meth:`KeyedStateBackend.row_table`, :class:`SliceTables`), so on RocksDB a window
aggregation's state is on disk and may outgrow memory, and the backend snapshots,
restores and rescales it by key group as it does the session and join operators'.
Per open slice, ``slice@<start>`` holds the batches' partials (keys, partial columns)
and ``distinct<i>@<start>`` the distinct (key, value) rows of ``COUNT(DISTINCT)``
aggregate ``i``. The operator never reads one key: a window reads its slices whole. So
a table's key column is ``_wa_kg``, the rows' key group (that of the group key, one
column's value or the tuple of several, as the hash edge routed it), not the group
key: on RocksDB an append is one entry per key group (an IPC message of its rows), not
one per key, and a window's read as many (23x the rows per second of keying by the
group key's ``encode_key`` bytes: 193 k against 7.7 k over 131 k rows of
``bench/window_aggregate_operator.py``). Rescaling, which moves whole key groups, is
unaffected. A batch only appends (per slice it touched), a window reads its slices'
tables whole (:meth:`RowTable.table`, each once per watermark) and merges them per
group key with one ``group_by``, and a slice's tables are dropped when its last window
fired. A
slice's table is compacted (its rows merged per key, the table dropped and written
again) every ``_COMPACT_AT`` appends to it: as cheap per row as the appends on the
heap, one scan and one write on RocksDB, and it bounds the rows a window merges to a
few per key whatever the batch count; compacting at snapshots instead would leave a
long slice's rows unmerged between checkpoints.

The ``_wa_fired`` rule: a restore starts again from no watermark, so the windows the
snapshotting subtask emitted already must not be emitted again. At each snapshot the
operator stamps its key groups with its watermark (row table ``fired``:
:class:`FiredStamps`); after a restore, whatever subtask holds a key group skips a
window whose end - 1 the group's stamp reached, and drops as late the rows whose
windows it all reached (as the snapshotting subtask would have). A stamp per key group
rather than per row: the backend snapshots the rows as they are, without a rewrite of
every row at each checkpoint.

Processing time (:class:`ProcessingTimeWindowAggregateOperator`, spec ``proctime=True``):
the same slices, tables and stamps, with the operator clock's time at a batch's arrival
for every row of it and the clock, not the watermark, firing the windows (all of them at
the end of a bounded input); the stamps hold the processing time fired to.

Example::

    op = ColumnarWindowAggregateOperator(spec, ctx)   # spec.payload: SliceWindowAggregateSpec
    op.process_batch(pa.record_batch({"k": ["a", "b"], "v": [1, 2], "_ts": [5, 7]}), None)
    op.process_watermark(10_000)                       # windows ending by 10 s are emitted
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import TS as TS_COLUMN
from epochstream.core.arrow import table_batch
from epochstream.core.events import MAX_WATERMARK
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import AggCall, SliceWindowAggregateSpec, WindowTvf
from epochstream.runtime.operators.base import Operator, SnapshotParts
from epochstream.runtime.operators.columnar_aggregates import own_backend
from epochstream.runtime.operators.columnar_transforms import need_batch
from epochstream.state.backends.base import (
    KeyedStateBackend,
    RowSchema,
    RowTable,
    SnapshotTarget,
)
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.columnar_checks import event_times, require_columns
from epochstream.state.handles import OperatorRestore
from epochstream.state.key_index import canonical_float_keys, checked_key_type

__all__ = [
    "AggregateCalls",
    "ColumnarWindowAggregateOperator",
    "FiredStamps",
    "ProcessingTimeWindowAggregateOperator",
    "SliceAssigner",
    "SliceTables",
    "check_aggregate_input",
]

_INT64_MIN = -(2**63)
#: A batch's slice end per group (dropped before the rows are kept).
SLICE = "_wa_slice"
#: The key column of the slices' tables: the group key's key group (module docstring).
_KEY = "_wa_kg"
_ROWS = "_wa_rows"  # rows per group: a group exists once a row of it came
_MAIN = -1
#: Row table names: ``slice@<start>``, ``distinct<i>@<start>``, and ``fired``.
_PARTIALS, _DISTINCT, _AT, _FIRED_TABLE = "slice", "distinct", "@", "fired"
#: The ``fired`` table's columns: a key group (its key) and its stamp.
_GROUP, FIRED = "_wa_group", "_wa_fired"
_FIRED_SCHEMA = pa.schema([(_GROUP, pa.int64()), (FIRED, pa.int64())])
# A slice's table is merged per key every this many appends (amortized compaction).
_COMPACT_AT = 16
_TS_TYPE = pa.timestamp("ms")


class SliceAssigner:
    """The slices and windows of a :class:`WindowTvf`: one slice per row, each window
    the slices ending in ``(start, end]``.

    Example::

        hop = SliceAssigner(WindowTvf.hop(10, 4))        # slices of 2 ms
        hop.slice_ends(np.array([5])).tolist() == [6]
        hop.windows_ending(np.array([6]), -100, 100)[1].tolist() == [6, 10, 14]
    """

    def __init__(self, window: WindowTvf) -> None:
        self.kind = window.kind
        self.size = window.size
        self.width = window.slice_width
        self.period = window.period  # between window starts
        self.offset = window.offset
        # Between window ends: every step of a cumulate window ends one.
        self.end_step = self.width if self.kind == "cumulate" else self.period

    def slice_ends(self, ts: np.ndarray) -> np.ndarray:
        """The end of the slice of each event time."""
        return ts - (ts - self.offset) % self.width + self.width

    def last_window_end(self, slice_ends: np.ndarray) -> np.ndarray:
        """The end of the last window each slice (by its end) belongs to."""
        starts = slice_ends - self.width
        return starts - (starts - self.offset) % self.period + self.size

    def window_starts(self, ends: np.ndarray) -> np.ndarray:
        """The start of the window of each end (one per end, for every kind)."""
        if self.kind != "cumulate":
            return ends - self.size
        first = ends - self.width  # the last slice's start: in the window
        return first - (first - self.offset) % self.size

    def windows_ending(
        self, slice_ends: np.ndarray, after: int, upto: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` of the windows with ``after < end <= upto`` holding at least
        one of ``slice_ends`` (sorted), by end."""
        if not len(slice_ends):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        low = max(after + 1, int(slice_ends[0]))
        high = min(upto, int(slice_ends[-1]) + self.size)
        if low > high:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        phase = (self.offset + self.size) % self.end_step  # window ends are = phase mod step
        first = low + (phase - low) % self.end_step
        ends = np.arange(first, high + 1, self.end_step, dtype=np.int64)
        starts = self.window_starts(ends)
        inside = np.searchsorted(slice_ends, ends, "right") - np.searchsorted(
            slice_ends, starts, "right"
        )
        return starts[inside > 0], ends[inside > 0]


@dataclass(frozen=True)
class _Partial:
    """One partial column: ``name`` is ``batch_fn`` of ``source`` per (key, slice) in a
    batch, and ``merge_fn`` of itself across batches and slices."""

    name: str
    source: str
    batch_fn: str
    merge_fn: str


class AggregateCalls:
    """What the aggregates of a window aggregation compute: the columns each derives from
    a batch, its partials (Arrow hash aggregates), and its value from merged partials.

    Example::

        calls = AggregateCalls((AggCall("sum", "v", "total"),), float_columns={"v"})
        [p.name for p in calls.partials] == ["_wa_rows", "_wa0_s"]
    """

    def __init__(
        self,
        aggs: tuple[AggCall, ...],
        float_columns: set[str],
        *,
        signed: bool = False,
        decimal_scales: dict[str, int] | None = None,
    ) -> None:
        self.aggs = aggs
        self.floats = float_columns
        #: DECIMAL columns and their scales: SUM and AVG add them exactly as
        #: decimal128(38, scale) (Flink's SUM type), without the int64 overflow shadow.
        self.decimals = dict(decimal_scales or {})
        #: Whether rows come with signed weights (a changelog: -U/-D retract): every
        #: partial is then a sum, and SUM keeps its value count (NULL when it is 0).
        #: MIN and MAX keep no partial of their extreme then (a float's NaN count
        #: ``_z`` stays, a sum): the caller keeps their values' multiplicities
        #: (:attr:`valued`) and adds each group's extreme as column ``_wa<i>_m``.
        self.signed = signed
        self.partials: list[_Partial] = [_Partial(_ROWS, _ROWS, "count_all", "sum")]
        for i, agg in enumerate(aggs):
            self.partials += self._partials_of(i, agg)
        #: The aggregates that keep distinct values (their index and value column).
        self.distinct = [(i, f"_wa{i}_d") for i, a in enumerate(aggs) if a.distinct]
        #: The aggregates whose values the caller keeps with their multiplicities (index
        #: and the derived value column): the distinct ones and, over a changelog, MIN
        #: and MAX (a retraction may take the extreme's last copy).
        self.valued = [
            (i, f"_wa{i}_d" if a.distinct else f"_wa{i}_v")
            for i, a in enumerate(aggs)
            if a.distinct or (signed and a.kind in ("min", "max"))
        ]

    @classmethod
    def restored(
        cls,
        aggs: tuple[AggCall, ...],
        partials: pa.Schema,
        types: dict[str, pa.DataType],
        *,
        signed: bool = False,
    ) -> AggregateCalls:
        """The calls whose partials ``partials`` (a restored table's schema) holds: which
        columns were floats shows in which partials exist (an int64 sum keeps its float
        shadow ``_f``, a float MIN/MAX its NaN count ``_z``). Fills ``types`` with the
        MIN/MAX value types the partials keep."""
        floats, decimals = set(), {}
        for i, agg in enumerate(aggs):
            if agg.column is None:
                continue
            summed = partials.field(f"_wa{i}_s").type if f"_wa{i}_s" in partials.names else None
            if agg.kind in ("sum", "avg") and summed is not None and pa.types.is_decimal(summed):
                decimals[agg.column] = summed.scale
            elif agg.kind in ("sum", "avg") and f"_wa{i}_f" not in partials.names:
                floats.add(agg.column)
            if agg.kind in ("min", "max") and f"_wa{i}_z" in partials.names:
                floats.add(agg.column)
            if agg.kind in ("min", "max") and f"_wa{i}_m" in partials.names:
                types.setdefault(agg.column, partials.field(f"_wa{i}_m").type)
        return cls(aggs, floats, signed=signed, decimal_scales=decimals)

    def _partials_of(self, i: int, agg: AggCall) -> list[_Partial]:
        p = f"_wa{i}"
        if agg.distinct:
            return []
        if agg.kind == "count_star":
            if agg.filter is None:
                return []  # the group's row count
            return [_Partial(f"{p}_n", f"{p}_c", "sum", "sum")]
        if agg.kind == "count":
            return [_Partial(f"{p}_n", f"{p}_v", "count", "sum")]
        parts = []
        if agg.kind in ("sum", "avg"):
            parts.append(_Partial(f"{p}_s", f"{p}_v", "sum", "sum"))
            if agg.column not in self.floats and agg.column not in self.decimals:
                # the int64 sum's overflow check
                parts.append(_Partial(f"{p}_f", f"{p}_f", "sum", "sum"))
            if agg.kind == "avg" or self.signed:
                parts.append(_Partial(f"{p}_n", f"{p}_v", "count", "sum"))
            return parts
        if not self.signed:
            parts.append(_Partial(f"{p}_m", f"{p}_v", agg.kind, agg.kind))
        if agg.column in self.floats:  # NaN is SQL's largest value: counted apart
            parts.append(_Partial(f"{p}_z", f"{p}_z", "sum", "sum"))
        return parts

    # ------------------------------------------------------------ batch side
    def derived(self, batch: pa.RecordBatch) -> dict[str, pa.Array]:
        """The columns the partials aggregate, derived from ``batch``."""
        out: dict[str, pa.Array] = {}
        for i, agg in enumerate(self.aggs):
            p = f"_wa{i}"
            mask = None
            if agg.filter is not None:
                mask = pc.fill_null(batch.column(agg.filter), False)
            if agg.kind == "count_star":
                if mask is not None:
                    out[f"{p}_c"] = mask.cast(pa.int64())
                continue
            value = batch.column(agg.column)
            if mask is not None:
                value = pc.if_else(mask, value, pa.scalar(None, value.type))
            floating = agg.column in self.floats
            if agg.distinct:
                out[f"{p}_d"] = canonical_float_keys(value) if floating else value
            elif agg.kind in ("sum", "avg"):
                if floating:
                    out[f"{p}_v"] = value.cast(pa.float64())
                elif agg.column in self.decimals:
                    out[f"{p}_v"] = value.cast(pa.decimal128(38, self.decimals[agg.column]))
                else:
                    out[f"{p}_v"] = value.cast(pa.int64())
                    out[f"{p}_f"] = value.cast(pa.float64())
            elif agg.kind in ("min", "max") and floating:
                nan = pc.is_nan(value)
                out[f"{p}_v"] = pc.if_else(nan, pa.scalar(None, value.type), value)
                out[f"{p}_z"] = nan.cast(pa.int64())
            else:
                out[f"{p}_v"] = value
        return out

    def batch_aggregations(self) -> list[tuple[Any, str]]:
        """The hash aggregates of a batch's group_by (``count_all`` takes no column)."""
        return [([] if p.batch_fn == "count_all" else p.source, p.batch_fn) for p in self.partials]

    @staticmethod
    def _named(grouped: pa.Table, names: Iterable[tuple[str, str]], keys: list[str]) -> pa.Table:
        columns = {k: grouped.column(k) for k in keys}
        for name, arrow_name in names:
            columns[name] = grouped.column(arrow_name)
        return pa.table(columns)

    def batch_partials(self, grouped: pa.Table, keys: list[str]) -> pa.Table:
        """A batch's group_by result with the partials under their own names."""
        names = [
            (p.name, "count_all" if p.batch_fn == "count_all" else f"{p.source}_{p.batch_fn}")
            for p in self.partials
        ]
        return self._named(grouped, names, keys)

    def signed_partials(
        self, derived: dict[str, pa.Array], weights: np.ndarray, ids: np.ndarray
    ) -> pa.Table:
        """A changelog batch's partials per ``ids`` (``_wa_id``-like group numbers, as
        column ``_id``): each row's contribution times its weight (+1 adds, -1
        retracts), summed, so merging stays a sum."""
        columns: dict[str, Any] = {"_id": ids}
        for part in self.partials:
            if part.batch_fn == "count_all":
                columns[part.name] = weights
                continue
            value = derived[part.source]
            if part.batch_fn == "count":
                valid = np.asarray(pc.is_valid(value).to_numpy(zero_copy_only=False), bool)
                columns[part.name] = np.where(valid, weights, 0)
                continue
            if pa.types.is_decimal(value.type):  # exact: negated where retracted
                columns[part.name] = pc.if_else(pa.array(weights < 0), pc.negate(value), value)
                continue
            # sum: NULL adds nothing; ints stay exact (int64 times +-1)
            filled = pc.fill_null(value, 0).to_numpy(zero_copy_only=False)
            columns[part.name] = filled * weights.astype(filled.dtype, copy=False)
        table = pa.table(columns)
        grouped = table.group_by(["_id"], use_threads=False).aggregate(
            [(p.name, "sum") for p in self.partials]
        )
        return self._named(grouped, [(p.name, f"{p.name}_sum") for p in self.partials], ["_id"])

    def merge(self, table: pa.Table, keys: list[str], distinct: bool = False) -> pa.Table:
        """``table``'s partials (and distinct values) merged per ``keys``."""
        aggregations: list[tuple[Any, ...]] = [(p.name, p.merge_fn) for p in self.partials]
        names = [(p.name, f"{p.name}_{p.merge_fn}") for p in self.partials]
        if distinct:
            for _, column in self.distinct:
                aggregations.append((column, "count_distinct"))
                names.append((column, f"{column}_count_distinct"))
        grouped = table.group_by(keys, use_threads=False).aggregate(aggregations)
        return self._named(grouped, names, keys)

    # ------------------------------------------------------------ results
    def values(self, merged: pa.Table, where: str) -> list[pa.Array]:
        """Each aggregate's result column from a window's merged partials."""
        return [self._value(i, agg, merged, where) for i, agg in enumerate(self.aggs)]

    def _value(self, i: int, agg: AggCall, merged: pa.Table, where: str) -> pa.Array:
        p = f"_wa{i}"

        def col(name: str) -> pa.Array:
            return merged.column(name).combine_chunks()

        if agg.distinct:
            return pc.fill_null(col(f"{p}_d"), 0)
        if agg.kind == "count_star":
            return col(_ROWS) if agg.filter is None else pc.fill_null(col(f"{p}_n"), 0)
        if agg.kind == "count":
            return pc.fill_null(col(f"{p}_n"), 0)
        if agg.kind in ("min", "max"):
            value = col(f"{p}_m")
            if agg.column not in self.floats:
                return value
            nan = pc.greater(pc.fill_null(col(f"{p}_z"), 0), 0)
            if agg.kind == "min":  # NaN only when every non-null value is NaN
                nan = pc.and_(nan, pc.is_null(value))
            return pc.if_else(nan, pa.scalar(float("nan"), value.type), value)
        total = col(f"{p}_s")
        if agg.column not in self.floats and agg.column not in self.decimals:
            top = pc.max(pc.abs(col(f"{p}_f"))).as_py()
            if top is not None and top >= 2.0**63:
                raise DataError(
                    f"{where}: {agg.kind.upper()}({agg.column}) for {agg.output!r} leaves the "
                    "int64 range; cast the column to float64 in map_batches first"
                )
        if agg.kind == "sum":
            if self.signed:  # every value retracted: NULL again
                return pc.if_else(pc.greater(col(f"{p}_n"), 0), total, pa.scalar(None, total.type))
            return total
        count = col(f"{p}_n")
        # No value (all NULL, or all retracted): NULL.
        some = pc.greater(pc.fill_null(count, 0), 0)
        if agg.column in self.floats:
            return pc.if_else(some, pc.divide(total, count), pa.scalar(None, pa.float64()))
        if agg.column in self.decimals:
            return _decimal_average(total, count, self.decimals[agg.column])
        # AVG of integers is an integer, truncated toward zero (Flink's, DuckDB's trunc).
        valid = np.asarray(some.to_numpy(zero_copy_only=False), dtype=bool)
        sums = pc.fill_null(total, 0).to_numpy(zero_copy_only=False)
        counts = np.maximum(pc.fill_null(count, 1).to_numpy(zero_copy_only=False), 1)
        quotient = np.abs(sums) // counts * np.sign(sums)
        return pa.array(quotient, pa.int64(), mask=~valid)


def _decimal_average(total: pa.Array, count: pa.Array, scale: int) -> pa.Array:
    """AVG of a DECIMAL(p, s): the exact sum over the count, rounded half up to scale
    ``max(6, s)`` (Flink's AVG type, DECIMAL(38, max(6, s))); NULL without values. In
    Python per group (the output's rows), not per input row."""
    out_scale = max(6, scale)
    quantum = decimal.Decimal(1).scaleb(-out_scale)
    # Enough digits that a 38-digit sum over a count divides exactly to the quantum.
    with decimal.localcontext(decimal.Context(prec=80)):
        values = [
            None
            if t is None or not n
            else (t / n).quantize(quantum, rounding=decimal.ROUND_HALF_UP)
            for t, n in zip(total.to_pylist(), count.to_pylist(), strict=True)
        ]
    return pa.array(values, pa.decimal128(38, out_scale))


def check_aggregate_input(
    batch: pa.RecordBatch,
    keys: Iterable[str],
    aggs: tuple[AggCall, ...],
    types: dict[str, pa.DataType],
    where: str,
    *,
    event_time: bool = True,
) -> AggregateCalls:
    """Check that ``batch`` has the columns an aggregation reads (``keys``, the
    aggregates' columns and filters, and ``_ts`` when it windows by ``event_time``),
    each of the type ``types`` noted for it before (integer widths may differ: noted in
    ``types``), filters boolean; return the calls for its float columns.

    Example: ``check_aggregate_input(batch, ["k"], (AggCall("sum", "v", "s"),), {}, "op")``
    """
    used = [a.column for a in aggs] + [a.filter for a in aggs]
    columns = (*keys, *(c for c in used if c), *((TS_COLUMN,) if event_time else ()))
    require_columns(batch.schema, columns, where)
    schema = batch.schema
    for name in columns:
        kind = schema.field(name).type
        types[name] = checked_key_type(types.get(name), kind, f"{where}: column {name!r}")
    for agg in aggs:
        if agg.filter is not None and not pa.types.is_boolean(schema.field(agg.filter).type):
            raise DataError(
                f"{where}: the filter column {agg.filter!r} of {agg.output!r} is "
                f"{schema.field(agg.filter).type}, not boolean"
            )
    floats = {
        a.column for a in aggs if a.column and pa.types.is_floating(schema.field(a.column).type)
    }
    decimals = {
        a.column: schema.field(a.column).type.scale
        for a in aggs
        if a.column and pa.types.is_decimal(schema.field(a.column).type)
    }
    return AggregateCalls(aggs, floats, decimal_scales=decimals)


class SliceTables:
    """The open slices in row tables of the keyed-state backend: per slice end and part
    (``-1`` partials, ``i`` the distinct values of aggregate ``i``) one table, named by
    the slice's start (``slice@<start>``, ``distinct<i>@<start>``), keyed by the rows'
    key group (``_wa_kg``; the module docstring says why).

    Each batch appends its partials; every ``_COMPACT_AT`` appends a table is replaced by
    its rows merged per key (:attr:`compaction`), so a slice holds a bounded number of
    rows per key however many batches fed it. A batch whose integer columns are wider
    than a table's (key or value widths changed between batches) widens that table first.

    Example::

        tables = SliceTables(backend, width=2_000)
        tables.add(6_000, -1, partials)          # rows with _kg, _wa_kg, keys, partials
        tables.read([6_000], -1, {})             # [the slice's rows, _kg first]
    """

    def __init__(self, backend: KeyedStateBackend, width: int) -> None:
        self.backend = backend
        self.width = width
        #: Per open slice end, the parts it has a table of.
        self.open: dict[int, set[int]] = {}
        #: Per part, how to merge its rows per key (set once the aggregates are known).
        self.compaction: dict[int, Callable[[pa.Table], pa.Table]] = {}
        self._appends: dict[str, int] = {}

    def name(self, end: int, part: int) -> str:
        """The table of part ``part`` of the slice ending at ``end``."""
        kind = _PARTIALS if part == _MAIN else f"{_DISTINCT}{part}"
        return f"{kind}{_AT}{end - self.width}"

    def parse(self, name: str) -> tuple[int, int] | None:
        """``(slice end, part)`` of a table name, else None (not a slice's table)."""
        kind, sep, start = name.partition(_AT)
        if not sep or not start.lstrip("-").isdigit():
            return None
        if kind == _PARTIALS:
            part = _MAIN
        elif kind.startswith(_DISTINCT) and kind[len(_DISTINCT) :].isdigit():
            part = int(kind[len(_DISTINCT) :])
        else:
            return None
        return int(start) + self.width, part

    def adopt(self, end: int, part: int) -> None:
        """Count a restored table as open."""
        self.open.setdefault(end, set()).add(part)

    def add(self, end: int, part: int, rows: pa.Table) -> None:
        """Append ``rows`` (``_kg`` first, then the table's columns) to slice ``end``'s
        ``part``, compacting it every ``_COMPACT_AT`` appends."""
        name = self.name(end, part)
        table = self._table(name, rows.schema.remove(0))
        table.append(table_batch(rows), rows.column(KG_COLUMN).to_numpy())
        self.open.setdefault(end, set()).add(part)
        appends = self._appends[name] = self._appends.get(name, 0) + 1
        if appends >= _COMPACT_AT:
            self._replace(name, self.compaction[part](table.table()), table.schema.schema)
            self._appends[name] = 1

    def _table(self, name: str, schema: pa.Schema) -> RowTable:
        """Table ``name``, made for rows of ``schema`` or widened to fit them."""
        table = self.backend.row_table(name)
        if table is None:
            made = self.backend.row_table(name, RowSchema(schema, _KEY))
            assert made is not None
            return made
        held = table.schema.schema
        if held.equals(schema):
            return table
        wider = pa.unify_schemas([held, schema], promote_options="permissive")
        if not wider.equals(held):
            table = self._replace(name, table.table(), wider)
        return table

    def _replace(self, name: str, rows: pa.Table, schema: pa.Schema) -> RowTable:
        """Table ``name`` holding just ``rows`` (``_kg`` first) in ``schema``: dropped and
        made again, one write of the rows on either backend."""
        self.backend.drop_row_table(name)
        table = self.backend.row_table(name, RowSchema(schema, _KEY))
        assert table is not None
        if rows.num_rows:
            table.append(table_batch(rows), rows.column(KG_COLUMN).to_numpy())
        return table

    def read(
        self, ends: Iterable[int], part: int, cache: dict[tuple[int, int], pa.Table]
    ) -> list[pa.Table]:
        """The rows (``_kg`` first) of ``part`` in the open slices of ``ends``, each table
        read once per ``cache`` (windows of one watermark share slices)."""
        found: list[pa.Table] = []
        for end in ends:
            if part not in self.open.get(end, ()):
                continue
            rows = cache.get((end, part))
            if rows is None:
                table = self.backend.row_table(self.name(end, part))
                assert table is not None
                rows = cache[(end, part)] = table.table()
            found.append(rows)
        return found

    def ends(self) -> np.ndarray:
        """The open slices' ends, sorted."""
        return np.array(sorted(self.open), dtype=np.int64)

    def drop(self, ends: Iterable[int]) -> None:
        """Drop slices ``ends``' tables."""
        for end in ends:
            for part in self.open.pop(end, ()):
                name = self.name(end, part)
                self.backend.drop_row_table(name)
                self._appends.pop(name, None)


class FiredStamps:
    """The ``_wa_fired`` rule (module docstring): per key group, the watermark its windows
    had fired to when it was snapshotted, in row table ``fired`` (``_wa_group``,
    ``_wa_fired``), so a restore (which starts from no watermark) neither emits a
    window again nor lets in a row the snapshotting subtask would have found late.

    Example::

        stamps = FiredStamps(backend)
        stamps.write(20)                    # at a snapshot: every key group fired to 20
        stamps.restore(); stamps.unfired(pa.array([3]), 15)   # -> [False]: emitted already
    """

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend
        self.stamps = np.full(backend.max_parallelism, _INT64_MIN, dtype=np.int64)
        #: The highest stamp: past it the rule excludes nothing.
        self.top = _INT64_MIN

    def restore(self) -> None:
        """Take the restored stamps (each key group's, from the subtask that held it)."""
        table = self.backend.row_table(_FIRED_TABLE)
        if table is None:
            return
        rows = table.table()
        groups = rows.column(_GROUP).to_numpy()
        np.maximum.at(self.stamps, groups, rows.column(FIRED).to_numpy())
        self.top = int(self.stamps.max())

    def unfired(self, key_groups: pa.ChunkedArray | pa.Array, end: int) -> np.ndarray | None:
        """Which rows of ``key_groups`` window ``[..., end)`` has not been emitted with
        (None: all of them)."""
        if self.top < end - 1:
            return None
        kgs = np.asarray(key_groups.to_numpy(), dtype=np.int64)
        return self.stamps[kgs] < end - 1

    def fired_to(self, key_groups: np.ndarray) -> np.ndarray:
        """Each key group's stamp (the lowest int64 where none was restored)."""
        return self.stamps[key_groups]

    def write(self, watermark: int) -> None:
        """Stamp this subtask's key groups with ``watermark`` (at a snapshot)."""
        groups = np.asarray(self.backend.key_group_range, dtype=np.int64)
        fired = np.maximum(self.stamps[groups], watermark)
        if not len(groups) or int(fired.max()) == _INT64_MIN:
            return  # nothing fired yet: no stamp to keep
        self.backend.drop_row_table(_FIRED_TABLE)
        table = self.backend.row_table(_FIRED_TABLE, RowSchema(_FIRED_SCHEMA, _GROUP))
        assert table is not None
        table.append(
            pa.record_batch([pa.array(groups), pa.array(fired)], schema=_FIRED_SCHEMA), groups
        )


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")


class ColumnarWindowAggregateOperator(Operator):
    """SQL window aggregation (tumble, hop, cumulate) on record batches, fired by the
    watermark (see the module docstring for slices, state and restore).

    Output batches: the key columns, ``window_start``, ``window_end``
    (``timestamp[ms]``), each aggregate's ``output`` column, ``_ts = window_end - 1``.

    Example::

        op = create_operator(spec, ctx)   # kind "columnar_window_aggregate"
        op.process_batch(pa.record_batch({"k": ["a"], "_ts": [5]}), None)
        op.process_watermark(MAX_WATERMARK)   # emits k="a", its window, the aggregates
    """

    #: Whether rows take the clock's time (:class:`ProcessingTimeWindowAggregateOperator`).
    processing_time = False

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self.keyed = self.keyed or own_backend(spec, ctx)
        #: The key groups of this subtask (those its backend holds).
        self.key_groups = self.keyed.key_group_range
        self.agg: SliceWindowAggregateSpec = spec.payload
        self.keys = list(self.agg.keys)
        self.assigner = SliceAssigner(self.agg.window)
        #: The time windows fired to: the watermark (event time) or the clock (processing time).
        self.progress = _INT64_MIN
        self.tables = SliceTables(self.keyed, self.assigner.width)
        self.stamps = FiredStamps(self.keyed)
        self._calls: AggregateCalls | None = None  # once the first batch tells float columns
        self._types: dict[str, pa.DataType] = {}
        self._where = ctx.task_name
        if self.agg.proctime != self.processing_time:
            # The spec's uid and the kind's firing would disagree about the job's windows.
            time = "processing" if self.agg.proctime else "event"
            raise ConfigurationError(
                f"{self._where}: the spec's windows are {time}-time ones; build the operator "
                "with ColumnarWindowedStream.aggregate, which picks the kind for it"
            )

    # ------------------------------------------------------------ input
    def _check(self, batch: pa.RecordBatch) -> None:
        if not self.processing_time and TS_COLUMN not in batch.schema.names:
            raise DataError(
                f"{self._where}: window aggregations need event time; give the source a "
                "watermark strategy with .with_timestamp_column(name)"
            )
        calls = check_aggregate_input(
            batch,
            self.keys,
            self.agg.aggs,
            self._types,
            self._where,
            event_time=not self.processing_time,
        )
        if self._calls is None:
            self._use_calls(calls)

    def _use_calls(self, calls: AggregateCalls) -> None:
        self._calls = calls
        # _wa_kg equals _kg (a key's key group): in the keys only to come out as columns.
        keys = [KG_COLUMN, _KEY, *self.keys]
        compact: dict[int, Callable[[pa.Table], pa.Table]] = {_MAIN: lambda t: calls.merge(t, keys)}
        for i, column in calls.distinct:
            compact[i] = partial(_distinct_rows, columns=[*keys, column])
        self.tables.compaction = compact

    def process_batch(self, records: Any, timestamps: list[Any] | None) -> None:
        batch = need_batch(self, records)
        if not batch.num_rows:
            return
        self._check(batch)
        calls = self._calls
        assert calls is not None
        ends = self.assigner.slice_ends(self._times(batch))
        late = self.assigner.last_window_end(ends) - 1 <= self._fired_to(batch)
        if late.any():
            self.counters.late_records_dropped += int(late.sum())
            batch = batch.filter(pa.array(~late))
            ends = ends[~late]
            if not batch.num_rows:
                return
        columns = {k: canonical_float_keys(batch.column(k)) for k in self.keys}
        columns[SLICE] = pa.array(ends)
        columns.update(calls.derived(batch))
        table = pa.table(columns)
        group = [*self.keys, SLICE]
        grouped = table.group_by(group, use_threads=False).aggregate(calls.batch_aggregations())
        self._keep(_MAIN, calls.batch_partials(grouped, group))
        for i, column in calls.distinct:
            values = table.select([*group, column])
            values = values.filter(pc.is_valid(values.column(column)))
            self._keep(i, _distinct_rows(values, [*group, column]))

    def _times(self, batch: pa.RecordBatch) -> np.ndarray:
        """Each row's time: its event time."""
        return event_times(batch, self._where)

    def _fired_to(self, batch: pa.RecordBatch) -> np.ndarray | int:
        """The time each row's windows fired to: this subtask's progress, or after a
        restore the higher one its key group was snapshotted with."""
        if self.stamps.top <= self.progress:
            return self.progress
        if KG_COLUMN in batch.schema.names:  # routed by a hash edge
            kgs = batch.column(KG_COLUMN).to_numpy(zero_copy_only=False)
        else:
            keys = [canonical_float_keys(batch.column(k)) for k in self.keys]
            kgs = key_groups_by_columns(keys, self.ctx.max_parallelism, rows=batch.num_rows)
        return np.maximum(self.stamps.fired_to(kgs), self.progress)

    def _keep(self, part: int, rows: pa.Table) -> None:
        """Add a batch's ``rows`` (with a ``_wa_slice`` column) to their slices' ``part``,
        each under its key's key group."""
        columns = [rows.column(k) for k in self.keys]
        kgs = pa.array(key_groups_by_columns(columns, self.ctx.max_parallelism, rows=rows.num_rows))
        rows = rows.add_column(0, _KEY, kgs).add_column(0, KG_COLUMN, kgs)
        for end, slice_rows in _per_slice(rows):
            self.tables.add(end, part, slice_rows)

    # ------------------------------------------------------------ firing
    def process_watermark(self, watermark: int) -> None:
        self._advance(watermark)
        self.emit_watermark(watermark)

    def _advance(self, time: int) -> None:
        """Fire the windows whose end - 1 is in ``(progress, time]`` and drop the slices
        no unfired window needs."""
        if time <= self.progress:
            return
        self._fire(self.progress, time)
        self.progress = time
        ends = self.tables.ends()
        done = self.assigner.last_window_end(ends) - 1 <= time
        self.tables.drop(ends[done].tolist())

    def _fire(self, before: int, time: int) -> None:
        """Emit the windows whose end - 1 is in ``(before, time]``, by end."""
        if self._calls is None:
            return
        slices = self.tables.ends()
        starts, ends = self.assigner.windows_ending(slices, before + 1, time + 1)
        cache: dict[tuple[int, int], pa.Table] = {}
        out = [
            result
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True)
            if (result := self._window(start, end, cache)) is not None
        ]
        if out:
            self.output.collect(pa.concat_batches(out), None)

    def _window_rows(
        self, inside: range, part: int, end: int, cache: dict[tuple[int, int], pa.Table]
    ) -> pa.Table | None:
        """``part``'s rows in the slices ``inside`` that window ``[..., end)`` was not
        emitted with (None: no such rows)."""
        tables = self.tables.read(inside, part, cache)
        if not tables:
            return None
        rows = _concat(tables)
        unfired = self.stamps.unfired(rows.column(KG_COLUMN), end)
        if unfired is not None:
            rows = rows.filter(pa.array(unfired))
        # Without the key groups: Acero's group_by would carry them along.
        rows = rows.drop_columns([KG_COLUMN, _KEY])
        return rows if rows.num_rows else None

    def _window(
        self, start: int, end: int, cache: dict[tuple[int, int], pa.Table]
    ) -> pa.RecordBatch | None:
        """The result of window ``[start, end)``: its slices' partials merged per key."""
        calls = self._calls
        assert calls is not None
        inside = range(start + self.assigner.width, end + 1, self.assigner.width)
        main = self._window_rows(inside, _MAIN, end, cache)
        if main is None:
            return None
        tables = [main]
        for i, _ in calls.distinct:
            values = self._window_rows(inside, i, end, cache)
            if values is not None:
                tables.append(values)
        rows = _concat(tables)
        for i, column in calls.distinct:
            if column not in rows.schema.names:  # no value in this window's slices
                kind = self._types.get(str(self.agg.aggs[i].column), pa.null())
                rows = rows.append_column(column, pa.nulls(rows.num_rows, kind))
        merged = calls.merge(rows, self.keys, distinct=True)
        n = merged.num_rows
        columns = [merged.column(k).combine_chunks() for k in self.keys]
        columns += [
            pa.array(np.full(n, start, dtype=np.int64)).cast(_TS_TYPE),
            pa.array(np.full(n, end, dtype=np.int64)).cast(_TS_TYPE),
            *calls.values(merged, self._where),
            pa.array(np.full(n, end - 1, dtype=np.int64)),
        ]
        names = [*self.keys, "window_start", "window_end"]
        names += [a.output for a in self.agg.aggs] + [TS_COLUMN]
        return pa.record_batch(columns, names=names)

    # ------------------------------------------------------------ snapshots
    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        self.stamps.write(self.progress)
        return super().snapshot(target)

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        assert self.keyed is not None
        names = self.keyed.row_tables()
        parts = {n: p for n in names if (p := self.tables.parse(n)) is not None}
        other = [n for n in names if n not in parts and n != _FIRED_TABLE]
        other += self.keyed.column_tables()
        if other:
            raise StateError(
                f"{self._where}: restored state is not a SQL window aggregation's (it holds "
                f"{', '.join(sorted(other))}); give the new operator another uid"
            )
        self.stamps.restore()
        schemas: dict[int, list[pa.Schema]] = {}
        for name, (end, part) in parts.items():
            table = self.keyed.row_table(name)
            assert table is not None
            schemas.setdefault(part, []).append(table.schema.schema)
            self.tables.adopt(end, part)
        if schemas:
            self._restore_calls(schemas)

    def _restore_calls(self, schemas: dict[int, list[pa.Schema]]) -> None:
        """The aggregates' float columns from the restored partials' types, and a check
        that the restored tables hold this query's keys and aggregates."""
        if _MAIN not in schemas:
            raise StateError(
                f"{self._where}: restored state has distinct values but no partials; give "
                "the new operator another uid"
            )
        main = pa.unify_schemas(schemas[_MAIN], promote_options="permissive")
        missing = [k for k in self.keys if k not in main.names]
        if missing:
            raise StateError(
                f"{self._where}: restored state has no key column {missing[0]!r}: it was "
                "written by another query; give the new operator another uid"
            )
        calls = AggregateCalls.restored(self.agg.aggs, main, self._types)
        needed = {_MAIN: [*self.keys, *(p.name for p in calls.partials)]}
        for i, column in calls.distinct:
            needed[i] = [*self.keys, column]
        for part, found in schemas.items():
            if part not in needed or any(
                c not in schema.names for schema in found for c in needed[part]
            ):
                raise StateError(
                    f"{self._where}: restored state does not hold this query's aggregates; "
                    "give the new operator another uid"
                )
        self._use_calls(calls)


class ProcessingTimeWindowAggregateOperator(ColumnarWindowAggregateOperator):
    """The SQL window aggregation over processing time (``TUMBLE|HOP|CUMULATE(TABLE t,
    DESCRIPTOR(proc), ...)`` of a ``PROCTIME()`` attribute; spec ``proctime=True``).

    A batch's rows take ``ctx.clock_ms()`` when it arrives, so the batch goes whole into
    that time's slice; it needs no ``_ts`` column (one it has is not read). A window
    fires when the clock passes its end - 1: the task calls :meth:`on_processing_time`
    by :meth:`next_processing_time`, which follows the open slices, so restored windows
    are timed again without timer state. Input watermarks are forwarded and fire
    nothing, and no row is late: should the clock stand at or behind the time windows
    fired to (a restore on a host whose clock is behind), rows take the first
    millisecond after it. At the end of a bounded input (the final watermark) every open
    window fires, so nothing accepted is lost (Flink drops them there). After a restore
    the stamps (:class:`FiredStamps`, of the processing time fired to) keep windows the
    snapshotting subtask emitted from being emitted again.

    Example::

        op = create_operator(spec, ctx)   # kind "columnar_processing_window_aggregate",
                                          # spec.payload.window: WindowTvf.tumble(60_000)
        op.process_batch(pa.record_batch({"k": ["a"]}), None)   # at 12:00:03 on ctx.clock
        op.next_processing_time()                          # 12:00:59.999
        op.on_processing_time(op.next_processing_time())   # emits k="a", [12:00, 12:01)
    """

    processing_time = True

    def _times(self, batch: pa.RecordBatch) -> np.ndarray:
        """The clock's time for every row, past the time windows fired to."""
        now = np.full(batch.num_rows, self.ctx.clock_ms(), np.int64)
        return np.maximum(now, np.asarray(self._fired_to(batch), np.int64) + 1)

    def process_watermark(self, watermark: int) -> None:
        if watermark >= MAX_WATERMARK:
            self._advance(MAX_WATERMARK)
        self.emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        self._advance(now_ms)

    def next_processing_time(self) -> int | None:
        """The end - 1 of the first unfired window holding an open slice (None: none)."""
        slices = self.tables.ends()
        if not len(slices):
            return None
        upto = int(slices[-1]) + self.assigner.size
        _, ends = self.assigner.windows_ending(slices, self.progress + 1, upto)
        return int(ends[0]) - 1 if len(ends) else None


def _distinct_rows(table: pa.Table, columns: list[str]) -> pa.Table:
    """The distinct rows of ``table`` by ``columns``."""
    return table.group_by(columns, use_threads=False).aggregate([]).select(columns)


def _per_slice(rows: pa.Table) -> Iterable[tuple[int, pa.Table]]:
    """``rows``' slice ends (column ``_wa_slice``), each with its rows (without it)."""
    if not rows.num_rows:
        return
    ends = rows.column(SLICE).to_numpy()
    order = np.argsort(ends, kind="stable")
    rows = rows.take(pa.array(order)).drop_columns([SLICE])
    ends = ends[order]
    bounds = np.flatnonzero(np.diff(ends)) + 1
    starts = [0, *bounds.tolist()]
    stops = [*bounds.tolist(), len(ends)]
    for start, stop in zip(starts, stops, strict=True):
        yield int(ends[start]), rows.slice(start, stop - start)
