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
    "JOIN_WINDOW_COLUMN",
    "AggCall",
    "AggregateSpec",
    "DedupSpec",
    "IntervalJoinSpec",
    "JoinSpec",
    "SessionWindowSpec",
    "SliceWindowAggregateSpec",
    "WindowAggregateSpec",
    "WindowSpec",
    "WindowTvf",
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

    Example::

        SliceWindowAggregateSpec(
            keys=("auction",),
            window=WindowTvf.hop(10_000, 2_000),
            aggs=(AggCall("count_star", None, "bids"), AggCall("max", "price", "top")),
        )
    """

    keys: tuple[str, ...]
    window: WindowTvf
    aggs: tuple[AggCall, ...]

    def __post_init__(self) -> None:
        if not self.aggs:
            raise ConfigurationError("a window aggregation needs at least one aggregate")
        names = [*self.keys, "window_start", "window_end", *(a.output for a in self.aggs), "_ts"]
        clash = next((n for n in names if names.count(n) > 1), None)
        if clash is not None:
            raise ConfigurationError(
                f"a window aggregation's output would have two columns named {clash!r} "
                f"(its columns: {', '.join(names)}); rename the key or the aggregate"
            )
        internal = next((n for n in names if n.startswith("_wa") or n == "_kg"), None)
        if internal is not None:
            raise ConfigurationError(
                f"column {internal!r}: names starting with '_wa' and '_kg' are the window "
                "aggregation's own; rename it"
            )
