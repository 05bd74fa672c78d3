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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from epochstream.core.functions import OutputTag, ProcessJoinFunction
from epochstream.exceptions import ConfigurationError
from epochstream.graph.evictors import Evictor
from epochstream.graph.triggers import Trigger
from epochstream.graph.windowing import ProcessWindowFunction, WindowAssigner

__all__ = [
    "JOIN_WINDOW_COLUMN",
    "AggregateSpec",
    "DedupSpec",
    "IntervalJoinSpec",
    "JoinSpec",
    "SessionWindowSpec",
    "WindowAggregateSpec",
    "WindowSpec",
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
