"""Every operator spec: what the API puts into a graph node for the runtime to run.

A spec is a frozen dataclass, the :attr:`~epochstream.graph.transformations.Transformation.payload`
of its node: plain settings and the user's functions, no runtime objects, so the API
builds it without knowing the runtime and the runtime reads it without knowing the API.
Validation that needs no state (sizes, gaps) happens here, at build time; the aggregation
kinds are checked where their accumulators live (``state/columnar_aggregates.py``).

Example::

    g.add("columnar_aggregate", "sum", payload=AggregateSpec("sum", key="k", value="v"))
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from epochstream.core.functions import OutputTag, ProcessJoinFunction
from epochstream.exceptions import ConfigurationError
from epochstream.graph.evictors import Evictor
from epochstream.graph.triggers import Trigger
from epochstream.graph.windowing import ProcessWindowFunction, WindowAssigner

__all__ = [
    "AGG_KINDS",
    "JOIN_TYPES",
    "JOIN_WINDOW_COLUMN",
    "OVER_FRAMES",
    "AggCall",
    "AggregateSpec",
    "DedupSpec",
    "EquiJoinSpec",
    "GroupAggregateSpec",
    "IntervalBounds",
    "IntervalJoinSpec",
    "JoinSpec",
    "MiniBatch",
    "OverAggregateSpec",
    "SessionAggregateSpec",
    "SessionWindowSpec",
    "SliceWindowAggregateSpec",
    "TopNSpec",
    "WindowAggregateSpec",
    "WindowAssignSpec",
    "WindowEnd",
    "WindowSpec",
    "WindowTopNSpec",
    "WindowTvf",
    "check_state_ttl",
    "join_key_type",
    "reserved_join_columns",
]

#: The column a join's state keeps each row's window start under (inputs may not have it).
JOIN_WINDOW_COLUMN = "_window_start"


@dataclass(frozen=True)
class AggregateSpec:
    """What a columnar aggregation computes: ``kind`` of column ``value`` per ``key``.

    Example: ``AggregateSpec("sum", key="k", value="v")``
    """

    kind: str
    key: str
    value: str | None


@dataclass(frozen=True)
class WindowAggregateSpec:
    """A columnar window aggregation: ``kind`` of ``value`` per ``key`` and event-time
    window of ``size`` ms every ``slide`` ms (tumbling: ``slide == size``).

    Example: ``WindowAggregateSpec("sum", key="k", value="v", size=10_000, slide=10_000)``
    """

    kind: str
    key: str
    value: str | None
    size: int
    slide: int
    offset: int = 0


@dataclass(frozen=True)
class SessionWindowSpec:
    """A columnar session-window aggregation: ``kind`` of ``value`` per ``key`` and
    session of event time closed by ``gap`` ms without rows.

    Example: ``SessionWindowSpec("sum", key="bidder", value="price", gap=10_000)``
    """

    kind: str
    key: str
    value: str | None
    gap: int

    def __post_init__(self) -> None:
        if self.kind != "count" and not self.value:
            raise ConfigurationError(f"{self.kind}() needs the column to aggregate")
        if self.gap <= 0:
            raise ConfigurationError(f"a session gap must be positive, got {self.gap} ms")


@dataclass(frozen=True)
class JoinSpec:
    """A columnar join: ``left_key`` equal to ``right_key``; with ``size`` (ms) a window
    join over windows of ``size`` every ``slide`` ms, else a regular join; ``function``
    (optional) maps each joined batch.

    Example: ``JoinSpec("seller", "id", size=10_000, slide=10_000)``
    """

    left_key: str
    right_key: str
    function: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None
    size: int | None = None
    slide: int | None = None
    offset: int = 0

    @property
    def kind(self) -> str:
        """Names the state in snapshots: ``window_join`` or ``join``."""
        return "join" if self.size is None else "window_join"


@dataclass(frozen=True)
class IntervalBounds:
    """An interval join's time condition: a left row and a right row pair only when
    ``lower <= left._ts - right._ts <= upper`` (ms; Flink SQL's ``l.t BETWEEN r.t +
    lower AND r.t + upper``). Either bound may be negative; :meth:`of` turns exclusive
    bounds into inclusive ones (timestamps are whole ms).

    Example::

        IntervalBounds(-5_000, 0)          # the left row at most 5 s before the right one
        IntervalBounds.of(0, 1_000, upper_inclusive=False) == IntervalBounds(0, 999)
    """

    lower: int
    upper: int

    @classmethod
    def of(
        cls, lower: int, upper: int, *, lower_inclusive: bool = True, upper_inclusive: bool = True
    ) -> IntervalBounds:
        """Bounds with exclusive ends allowed (``l.t > r.t + lower``: ``lower + 1``).

        Example: ``IntervalBounds.of(0, 10, lower_inclusive=False) == IntervalBounds(1, 10)``
        """
        return cls(lower + (not lower_inclusive), upper - (not upper_inclusive))

    def __post_init__(self) -> None:
        for name in ("lower", "upper"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigurationError(f"an interval join's {name} bound must be an int (ms)")
        if self.lower > self.upper:
            raise ConfigurationError(
                f"an interval join's lower bound ({self.lower} ms) is above its upper bound "
                f"({self.upper} ms): no pair could ever join"
            )

    @property
    def delay(self) -> int:
        """How far the join holds its output watermark back: ``max(-lower, upper)``
        (Flink's ``RowTimeIntervalJoin.getMaxOutputDelay``). Example:
        ``IntervalBounds(-5_000, 1_000).delay == 5_000``"""
        return max(-self.lower, self.upper)


@dataclass(frozen=True)
class WindowEnd:
    """A window join's retention: both inputs carry the end of the window each row
    belongs to (``left_column``, ``right_column``: int64 ms or timestamps; window
    aggregation outputs), and a row is kept until the watermark reaches ``end - 1``.

    Example: ``WindowEnd("window_end", "window_end")``
    """

    left_column: str
    right_column: str


#: A pair's output columns of one side: (input column, output column) pairs, in order.
OutputColumns = tuple[tuple[str, str], ...]


#: The regular join's kinds: which sides keep their unmatched rows, padded with nulls.
JOIN_TYPES = ("inner", "left", "right", "full")


@dataclass(frozen=True)
class EquiJoinSpec:
    """An equi-join of two columnar streams, the operators SQL's regular (kind
    ``columnar_regular_join``), interval and window joins (kind ``columnar_equi_join``)
    plan onto: :attr:`operator_kind`.

    - ``left_keys`` equal ``right_keys`` (as many; integers of any width compare as
      int64; a row with a null key never joins);
    - ``left_output``/``right_output``: the (input column, output column) pairs each
      pair is emitted with, left ones first, then ``_ts``;
    - ``condition`` (optional, picklable): ``condition(batch) -> BooleanArray`` on the
      candidate pairs (output columns and ``_ts``); pairs are kept where it is TRUE;
    - ``retention``: ``None`` (regular join, rows kept forever or for
      ``state_ttl_ms``), :class:`IntervalBounds` (interval join) or :class:`WindowEnd`
      (window join of window aggregations); the last two are inner joins of append-only
      inputs;
    - ``join_type`` (regular joins): one of :data:`JOIN_TYPES`; an outer join pads the
      unmatched rows of its outer side(s) with nulls, typed by ``output_schema`` (the
      output columns' Arrow types, required for outer joins);
    - ``updating_input`` (regular joins): an input is a changelog (``_op`` column);
    - ``state_ttl_ms`` (regular joins): a kept row expires this long after it was
      written (processing time; 0: never).

    A regular join's output is a changelog (``+I``/``-D`` rows, no ``_ts``) when it is
    an outer join or has an updating input (:attr:`changelog`); an inner join of
    append-only inputs is append-only, stamped with ``_ts``.

    Example::

        EquiJoinSpec(
            left_keys=("auction",), right_keys=("id",),
            left_output=(("auction", "auction"), ("price", "price")),
            right_output=(("seller", "seller"),),
            retention=IntervalBounds(-10_000, 0),
        )
    """

    left_keys: tuple[str, ...]
    right_keys: tuple[str, ...]
    left_output: OutputColumns
    right_output: OutputColumns
    condition: Callable[[pa.RecordBatch], Any] | None = None
    retention: IntervalBounds | WindowEnd | None = None
    join_type: str = "inner"
    updating_input: bool = False
    state_ttl_ms: int = 0
    output_schema: pa.Schema | None = None

    @property
    def kind(self) -> str:
        """Names the state in snapshots."""
        return "equi_join"

    @property
    def operator_kind(self) -> str:
        """The operator running the join: ``columnar_regular_join`` without retention,
        else ``columnar_equi_join``."""
        return "columnar_regular_join" if self.retention is None else "columnar_equi_join"

    @property
    def outer(self) -> tuple[bool, bool]:
        """Whether the left and the right side keep their unmatched rows (null-padded).
        Example: ``replace(spec, join_type="left").outer == (True, False)``"""
        return self.join_type in ("left", "full"), self.join_type in ("right", "full")

    @property
    def changelog(self) -> bool:
        """Whether the output carries row kinds (``_op``): an outer join, or a join of an
        updating input."""
        return self.join_type != "inner" or self.updating_input

    @property
    def output_names(self) -> tuple[str, ...]:
        """The output columns, ``_ts`` last. Example: ``spec.output_names[-1] == "_ts"``"""
        return (*(o for _, o in self.left_output), *(o for _, o in self.right_output), "_ts")

    def __post_init__(self) -> None:
        if not self.left_keys or len(self.left_keys) != len(self.right_keys):
            raise ConfigurationError(
                f"an equi-join needs as many left keys as right keys, at least one (left "
                f"{list(self.left_keys)}, right {list(self.right_keys)})"
            )
        names = self.output_names
        clash = next((n for n in names if names.count(n) > 1), None)
        if clash is not None:
            raise ConfigurationError(
                f"an equi-join's output would have two columns named {clash!r} (its columns: "
                f"{', '.join(names)}); name one otherwise"
            )
        if "_kg" in names:
            raise ConfigurationError(
                "an equi-join's output may not have a column named '_kg', the name keyed "
                "batches keep their key groups under; name it otherwise"
            )
        if self.condition is not None and not callable(self.condition):
            raise ConfigurationError(
                f"an equi-join's condition must be callable, got {type(self.condition).__name__}"
            )
        self._check_regular()

    def _check_regular(self) -> None:
        """The regular join's own settings: a known type, a non-negative TTL, output
        types for the padding of an outer join, and none of them on the others."""
        if self.join_type not in JOIN_TYPES:
            raise ConfigurationError(
                f"an equi-join's join_type is one of {', '.join(JOIN_TYPES)}, got "
                f"{self.join_type!r}"
            )
        ttl = self.state_ttl_ms
        check_state_ttl("an equi-join", ttl)
        if self.retention is not None and (self.join_type != "inner" or self.updating_input or ttl):
            raise ConfigurationError(
                "interval and window joins are inner joins of append-only inputs without "
                "a state TTL (their retention bounds the state); outer joins, updating "
                "inputs and state_ttl_ms are the regular join's"
            )
        if self.join_type != "inner":
            names = self.output_names[:-1]
            if self.output_schema is None or tuple(self.output_schema.names) != names:
                raise ConfigurationError(
                    f"a {self.join_type} join needs output_schema, the Arrow types of its "
                    f"output columns ({', '.join(names)}), to pad unmatched rows with nulls"
                )


def check_state_ttl(what: str, ttl: object) -> None:
    """A spec's ``state_ttl_ms`` (``table.exec.state.ttl``) is a non-negative int (ms;
    0: state kept forever), else a ConfigurationError naming ``what``.

    Example: ``check_state_ttl("a Top-N", 60_000)``
    """
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
        raise ConfigurationError(f"{what}'s state_ttl_ms is a non-negative int (ms), got {ttl!r}")


def join_key_type(kind: pa.DataType) -> pa.DataType:
    """The type a key column is compared as: int64 for any integer (key groups do not
    depend on the width), else its own; both sides' must be equal.

    Example: ``join_key_type(pa.int16()) == pa.int64()``
    """
    return pa.int64() if pa.types.is_integer(kind) else kind


def reserved_join_columns(windowed: bool) -> dict[str, str]:
    """Column names a join's inputs may not have, each with the reason: the window
    start its state keeps rows under, and a window join's own output columns.

    Example: ``"window_start" in reserved_join_columns(windowed=True)``
    """
    reserved = {JOIN_WINDOW_COLUMN: "which the join keeps each row's window under"}
    if windowed:
        reserved.update(
            (name, "which a window join adds to its output itself")
            for name in ("window_start", "window_end")
        )
    return reserved


@dataclass(frozen=True)
class DedupSpec:
    """Settings of a deduplicate operator (the payload of its graph node).

    Example::

        DedupSpec(ttl=timedelta(hours=1), bloom_capacity=100_000, bloom_fp_rate=0.01)
    """

    ttl: _dt.timedelta | float
    bloom_capacity: int
    bloom_fp_rate: float


@dataclass(frozen=True)
class IntervalJoinSpec:
    """The interval join operator's payload: bounds (ms) and the ProcessJoinFunction.

    Example: ``IntervalJoinSpec(lower=-2_000, upper=1_000, function=MyJoin())``
    """

    lower: int
    upper: int
    function: ProcessJoinFunction


@dataclass(frozen=True)
class WindowSpec:
    """Everything the window operator needs (the transformation's payload).

    ``kind`` is ``"reduce"``, ``"aggregate"`` or ``"process"``; ``function`` the
    ReduceFunction/callable, AggregateFunction or ProcessWindowFunction;
    ``window_function`` the optional ProcessWindowFunction after an incremental one;
    ``evictor`` the optional :class:`~epochstream.graph.evictors.Evictor`.

    Example::

        WindowSpec(TumblingEventTimeWindows.of(5_000), EventTimeTrigger(), 0, None,
                   "reduce", lambda a, b: a + b)
    """

    assigner: WindowAssigner
    trigger: Trigger
    allowed_lateness: int
    late_tag: OutputTag | None
    kind: str
    function: Any
    window_function: ProcessWindowFunction | None = None
    evictor: Evictor | None = None


#: The aggregate functions of a SQL window aggregation (:class:`AggCall` kinds).
AGG_KINDS = ("count_star", "count", "sum", "min", "max", "avg")
#: The columns a SQL window aggregation adds to its keys (and its inputs may not be keyed by).
WINDOW_AGG_COLUMNS = ("window_start", "window_end", "_ts")


@dataclass(frozen=True)
class AggCall:
    """One aggregate of a SQL window aggregation: ``kind`` of ``column`` as ``output``.

    ``count_star`` is ``COUNT(*)`` (no column); ``count`` counts the non-null values;
    ``sum``/``min``/``max``/``avg`` skip nulls. ``distinct=True`` is ``COUNT(DISTINCT
    column)`` (count only); ``filter`` names a boolean column of the input: only rows
    where it is TRUE count for this aggregate (SQL ``FILTER (WHERE ...)``).

    Example::

        AggCall("count", "bidder", "bidders", distinct=True, filter="is_big")
        AggCall("count_star", None, "n")
    """

    kind: str
    column: str | None
    output: str
    distinct: bool = field(default=False, kw_only=True)
    filter: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.kind not in AGG_KINDS:
            raise ConfigurationError(
                f"unknown aggregate {self.kind!r} (known: {', '.join(AGG_KINDS)})"
            )
        if (self.kind == "count_star") != (self.column is None):
            raise ConfigurationError(
                f"{self.kind} for {self.output!r}: COUNT(*) takes no column, every other "
                "aggregate one"
            )
        if self.distinct and self.kind != "count":
            raise ConfigurationError(
                f"{self.kind.upper()}(DISTINCT ...) for {self.output!r} is not supported; "
                "only COUNT(DISTINCT column)"
            )
        if not self.output:
            raise ConfigurationError(f"{self.kind}({self.column or '*'}) needs an output name")


@dataclass(frozen=True)
class WindowTvf:
    """The window of a SQL window aggregation, as Flink's window table functions:
    ``tumble`` (``size``), ``hop`` (``size`` every ``slide``; size need not be a
    multiple of slide) and ``cumulate`` (windows of ``step``, ``2 * step`` ... ``size``
    from each ``size``-aligned start); all in ms, shifted by ``offset``.

    Rows are kept per slice of :attr:`slice_width` ms, each window is the merge of its
    slices (Flink's slice sharing).

    Example::

        WindowTvf.hop(10_000, 2_000).slice_width == 2_000
        WindowTvf.cumulate(60_000, 10_000)
    """

    kind: str
    size: int
    slide: int | None = field(default=None, kw_only=True)
    step: int | None = field(default=None, kw_only=True)
    offset: int = field(default=0, kw_only=True)

    @classmethod
    def tumble(cls, size: int, offset: int = 0) -> WindowTvf:
        """``TUMBLE(..., size)``. Example: ``WindowTvf.tumble(10_000)``"""
        return cls("tumble", size, offset=offset)

    @classmethod
    def hop(cls, size: int, slide: int, offset: int = 0) -> WindowTvf:
        """``HOP(..., slide, size)``. Example: ``WindowTvf.hop(10_000, 2_000)``"""
        return cls("hop", size, slide=slide, offset=offset)

    @classmethod
    def cumulate(cls, size: int, step: int, offset: int = 0) -> WindowTvf:
        """``CUMULATE(..., step, size)``. Example: ``WindowTvf.cumulate(60_000, 10_000)``"""
        return cls("cumulate", size, step=step, offset=offset)

    def __post_init__(self) -> None:
        params = {"tumble": (), "hop": ("slide",), "cumulate": ("step",)}
        if self.kind not in params:
            raise ConfigurationError(f"unknown window {self.kind!r} (known: tumble, hop, cumulate)")
        for name in ("slide", "step"):
            value = getattr(self, name)
            if (name in params[self.kind]) != (value is not None):
                raise ConfigurationError(
                    f"a {self.kind} window {'needs' if value is None else 'takes no'} {name}"
                )
        for name in ("size", *params[self.kind]):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigurationError(
                    f"a {self.kind} window's {name} must be a positive int (ms), got {value!r}"
                )
        if self.kind == "cumulate" and self.size % int(self.step or 1):
            raise ConfigurationError(
                f"a cumulate window's size ({self.size} ms) must be a multiple of its "
                f"step ({self.step} ms)"
            )

    @property
    def slice_width(self) -> int:
        """The width of the slices rows are kept in: size (tumble), gcd(size, slide)
        (hop), step (cumulate). Example: ``WindowTvf.hop(10, 4).slice_width == 2``"""
        if self.kind == "hop":
            return math.gcd(self.size, int(self.slide or 0))
        if self.kind == "cumulate":
            return int(self.step or 0)
        return self.size

    @property
    def period(self) -> int:
        """The distance between window starts: slide (hop), else size.
        Example: ``WindowTvf.hop(10, 4).period == 4``"""
        return int(self.slide or 0) if self.kind == "hop" else self.size


@dataclass(frozen=True)
class SliceWindowAggregateSpec:
    """A SQL window aggregation (``GROUP BY window_start, window_end, keys...`` over
    ``TABLE(TUMBLE|HOP|CUMULATE(...))``) on batches: ``aggs`` per ``keys`` (zero or more
    columns; none: a global aggregation) and ``window``.

    Output: the key columns, ``window_start``, ``window_end`` (``timestamp[ms]``), each
    aggregate's ``output`` column, and ``_ts = window_end - 1`` (int64).

    ``proctime``: windows of processing time (Flink SQL's ``DESCRIPTOR`` of a
    ``PROCTIME()`` attribute) instead of event time: a batch's rows take the operator
    clock's time when it arrives (no ``_ts`` column needed), windows fire when the clock
    passes their end - 1 (and all at the end of a bounded input), never by the
    watermark; the operator kind is ``columnar_processing_window_aggregate``.

    Example::

        SliceWindowAggregateSpec(
            keys=("auction",),
            window=WindowTvf.hop(10_000, 2_000),
            aggs=(AggCall("count_star", None, "bids"), AggCall("max", "price", "top")),
        )
        SliceWindowAggregateSpec(("auction",), WindowTvf.tumble(60_000), aggs, proctime=True)
    """

    keys: tuple[str, ...]
    window: WindowTvf
    aggs: tuple[AggCall, ...]
    proctime: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        _check_window_outputs(self.keys, self.aggs)


@dataclass(frozen=True)
class SessionAggregateSpec:
    """A SQL session window aggregation (``GROUP BY window_start, window_end, keys...``
    over ``TABLE(SESSION(TABLE t PARTITION BY keys, DESCRIPTOR(ts), gap))``) on batches:
    ``aggs`` per ``keys`` (zero or more columns) and session of event time closed by
    ``gap`` ms without rows of its key. Output as :class:`SliceWindowAggregateSpec`'s.

    Example::

        SessionAggregateSpec(
            keys=("bidder",), gap=10_000,
            aggs=(AggCall("count_star", None, "bids"), AggCall("avg", "price", "mean")),
        )
    """

    keys: tuple[str, ...]
    gap: int
    aggs: tuple[AggCall, ...]

    def __post_init__(self) -> None:
        if self.gap <= 0:
            raise ConfigurationError(f"a session gap must be positive, got {self.gap} ms")
        _check_window_outputs(self.keys, self.aggs)


@dataclass(frozen=True)
class MiniBatch:
    """Flink's ``table.exec.mini-batch``: buffer an updating aggregation's input until
    ``size`` rows or ``latency_ms`` after the first buffered row (both above 0), then
    fold the buffer as one batch, so a key's updates come out once per buffer.

    Example: ``MiniBatch(latency_ms=2_000, size=5_000)``
    """

    latency_ms: int
    size: int

    def __post_init__(self) -> None:
        if self.latency_ms <= 0 or self.size <= 0:
            raise ConfigurationError(
                f"a mini-batch needs a latency and a size above 0 (got {self.latency_ms} ms, "
                f"{self.size} rows)"
            )


@dataclass(frozen=True)
class GroupAggregateSpec:
    """A SQL ``GROUP BY`` without a window (an updating result) on batches: ``aggs`` per
    ``keys`` (zero or more columns), emitted as a changelog (``_op``): ``+I`` for a new
    group, ``-U``/``+U`` when a group's result changes, ``-D`` when its last row is
    retracted. ``updating_input``: the input is itself a changelog (its ``-U``/``-D`` rows
    retract). ``mini_batch``: buffer the input before folding it (None: fold each batch
    as it comes). ``state_ttl_ms``: a group expires this long after it was last written
    (processing time; 0: never), Flink's ``table.exec.state.ttl``.

    Example::

        GroupAggregateSpec(keys=("bidder",), aggs=(AggCall("count_star", None, "bids"),))
    """

    keys: tuple[str, ...]
    aggs: tuple[AggCall, ...]
    updating_input: bool = field(default=False, kw_only=True)
    # Not in the repr (a SQL plan's digest, hence its uid): the buffer keeps no state, so
    # turning mini-batch on or off keeps the operator's uid and its savepoint state.
    mini_batch: MiniBatch | None = field(default=None, kw_only=True, repr=False)
    # Not in the repr either, as the join's TTL is not in its digest: changing the TTL
    # keeps the uid (switching it on or off against kept state is a StateError).
    state_ttl_ms: int = field(default=0, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        _check_outputs(self.keys, self.aggs, ())
        check_state_ttl("a group aggregation", self.state_ttl_ms)


def _check_window_outputs(keys: tuple[str, ...], aggs: tuple[AggCall, ...]) -> None:
    """A window aggregation's output columns: at least one aggregate, no name twice, none
    of the operators' own."""
    _check_outputs(keys, aggs, ("window_start", "window_end", "_ts"))


def _check_outputs(keys: tuple[str, ...], aggs: tuple[AggCall, ...], more: tuple[str, ...]) -> None:
    """An aggregation's output columns (``more``: the operator's own besides the keys
    and aggregates): at least one aggregate, no name twice, no reserved name."""
    if not aggs:
        raise ConfigurationError("an aggregation needs at least one aggregate")
    names = [*keys, *more[:2], *(a.output for a in aggs), *more[2:]]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash is not None:
        raise ConfigurationError(
            f"a window aggregation's output would have two columns named {clash!r} "
            f"(its columns: {', '.join(names)}); rename the key or the aggregate"
        )
    internal = next((n for n in names if n.startswith(("_wa", "_sa")) or n in ("_kg", "_op")), None)
    if internal is not None:
        raise ConfigurationError(
            f"column {internal!r}: names starting with '_wa' and '_sa', '_kg' and '_op' are "
            "the aggregations' own; rename it"
        )


#: The columns a window assignment adds to each row (Flink's window TVF columns).
WINDOW_TVF_COLUMNS = ("window_start", "window_end", "window_time")


@dataclass(frozen=True)
class WindowAssignSpec:
    """A window table function without aggregation (Flink SQL's ``SELECT * FROM
    TABLE(TUMBLE|HOP|CUMULATE(TABLE t, DESCRIPTOR(ts), ...))``): every row once per
    ``window`` it belongs to, with ``window_start``, ``window_end`` and ``window_time``.

    Example: ``WindowAssignSpec(WindowTvf.hop(10_000, 5_000))``
    """

    window: WindowTvf

    @property
    def kind(self) -> str:
        """Names the operator in messages."""
        return "window_assign"


#: The sort directions of a window Top-N's order keys.
SORT_DIRECTIONS = ("asc", "desc")


@dataclass(frozen=True)
class WindowTopNSpec:
    """A window Top-N (Flink SQL's ``ROW_NUMBER() OVER (PARTITION BY window_start,
    window_end, partition_by... ORDER BY order_by...) <= n``): per window and partition
    the first ``n`` rows by ``order_by`` (``(column, "asc" | "desc")`` pairs; NULLs first
    ascending, last descending, as Flink orders them), with their row number in
    ``rank_column`` when it is given.

    Example::

        WindowTopNSpec(partition_by=("category",), order_by=(("price", "desc"),), n=3)
    """

    partition_by: tuple[str, ...]
    order_by: tuple[tuple[str, str], ...]
    n: int
    rank_column: str | None = None

    @property
    def kind(self) -> str:
        """Names the state in snapshots."""
        return "window_top_n"

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ConfigurationError(f"a window Top-N keeps n >= 1 rows, got {self.n!r}")
        self._check_order()
        for column, direction in self.order_by:
            if direction not in SORT_DIRECTIONS:
                raise ConfigurationError(
                    f"order key {column!r}: direction {direction!r} is not 'asc' or 'desc'"
                )
        rank = self.rank_column
        if rank is not None and (not rank or rank.startswith("_")):
            raise ConfigurationError(
                f"rank column {rank!r}: give a non-empty name not starting with '_' "
                "(those are epochstream's own columns)"
            )
        if rank is not None and rank in WINDOW_AGG_COLUMNS:
            raise ConfigurationError(f"rank column {rank!r} is a window column's name")

    def _check_order(self) -> None:
        if not self.order_by:
            raise ConfigurationError("a window Top-N needs at least one order key")


@dataclass(frozen=True)
class TopNSpec(WindowTopNSpec):
    """A Top-N without a window (Flink SQL's ``ROW_NUMBER() OVER (PARTITION BY
    partition_by... ORDER BY order_by...) <= n`` over an append-only input): per
    partition the first ``n`` rows so far, an updating result (a changelog).
    ``state_ttl_ms``: a partition's rows expire this long after the partition was last
    written (processing time; 0: never), Flink's ``table.exec.state.ttl``.

    Example::

        TopNSpec(partition_by=("auction",), order_by=(("price", "desc"),), n=10)
    """

    state_ttl_ms: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_state_ttl("a Top-N", self.state_ttl_ms)

    def _check_order(self) -> None:
        # No order keys: the first row by arrival (a processing-time deduplication).
        if not self.order_by and (self.n != 1 or self.rank_column is not None):
            raise ConfigurationError(
                "a Top-N without order keys keeps the first row by arrival: n=1, no rank column"
            )

    @property
    def by_arrival(self) -> bool:
        """Whether it keeps each partition's first row by arrival (no order keys):
        Flink's processing-time deduplication keeping the first row, an insert-only
        result (a kept row is never displaced)."""
        return not self.order_by

    @property
    def kind(self) -> str:
        """Names the state in snapshots."""
        return "top_n"


#: The frames of an OVER aggregation: ``ROWS`` (a count of preceding rows) and
#: ``RANGE`` (a time interval before the current row's time).
OVER_FRAMES = ("rows", "range")


@dataclass(frozen=True)
class OverAggregateSpec:
    """Flink SQL's OVER aggregation over event time (``agg(x) OVER (PARTITION BY
    partition_by ORDER BY rowtime frame BETWEEN preceding PRECEDING AND CURRENT ROW)``):
    every input row once, with ``aggs`` over its frame appended, emitted when the
    watermark passes its time. ``frame`` is ``"rows"`` (``preceding`` rows before it) or
    ``"range"`` (rows at most ``preceding`` ms older, and its peers of equal time);
    ``preceding=None`` is ``UNBOUNDED PRECEDING``. COUNT, SUM, AVG, MIN and MAX, without
    DISTINCT or FILTER.

    Example::

        OverAggregateSpec(("bidder",), (AggCall("sum", "price", "recent"),), "range", 10_000)
    """

    partition_by: tuple[str, ...]
    aggs: tuple[AggCall, ...]
    frame: str
    preceding: int | None
    #: Ordered by processing time: each batch's rows take the clock's time on arrival
    #: and are emitted at once (a batch's rows are peers of one time).
    proctime: bool = False

    @property
    def kind(self) -> str:
        """Names the state in snapshots."""
        return "over_aggregate"

    def __post_init__(self) -> None:
        if self.frame not in OVER_FRAMES:
            raise ConfigurationError(f"an OVER frame is 'rows' or 'range', got {self.frame!r}")
        bad = self.preceding is not None and (
            not isinstance(self.preceding, int) or self.preceding < 0
        )
        if bad:
            raise ConfigurationError(
                f"an OVER frame's PRECEDING bound is a count or ms >= 0 (or None: UNBOUNDED), "
                f"got {self.preceding!r}"
            )
        if not self.aggs:
            raise ConfigurationError("an OVER aggregation needs at least one aggregate")
        for agg in self.aggs:
            if agg.distinct or agg.filter is not None:
                raise ConfigurationError(
                    f"{agg.kind}({agg.column or '*'}) for {agg.output!r}: DISTINCT and FILTER "
                    "are not supported in OVER aggregations"
                )
            if agg.output.startswith("_"):
                raise ConfigurationError(
                    f"OVER aggregate output {agg.output!r}: names starting with '_' are "
                    "epochstream's own; rename it"
                )
