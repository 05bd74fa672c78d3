"""Windows on a columnar keyed stream, aggregated with vectorized kernels: tumbling and
sliding event-time windows, event-time session windows, and tumbling and sliding
processing-time windows.

Example::

    (batches.key_by("auction")
        .window(es.SlidingEventTimeWindows.of(10_000, 2_000))
        .count())             # columns auction, window_start, window_end, count
    (batches.key_by("bidder")
        .window(es.EventTimeSessionWindows.with_gap(10_000))
        .sum("price"))        # one row per bidder and session
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epochstream.api.columnar_keyed import ColumnarAggregations
from epochstream.api.datastream import DataStream
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import (
    AggCall,
    SessionAggregateSpec,
    SessionWindowSpec,
    SliceWindowAggregateSpec,
    WindowAggregateSpec,
    WindowTvf,
)
from epochstream.graph.windowing import (
    CumulativeEventTimeWindows,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)

if TYPE_CHECKING:
    from epochstream.api.columnar_keyed import ColumnarKeyedStream

__all__ = ["ColumnarWindowedStream"]

_SUPPORTED = (
    "tumbling or sliding event-time windows, event-time session windows with a fixed gap, "
    "or tumbling or sliding processing-time windows"
)


class ColumnarWindowedStream(ColumnarAggregations):
    """Windows of a :class:`ColumnarKeyedStream`: tumbling/sliding event-time windows,
    ``EventTimeSessionWindows.with_gap`` sessions, or tumbling/sliding processing-time
    windows.

    Each aggregation emits once per key and window: event-time windows and sessions when
    the watermark passes the window's end (rows of a window that fired are late: dropped
    and counted); processing-time windows when the operator's clock passes their end, or
    at the end of a bounded input. Output batches hold the key column, ``window_start``,
    ``window_end`` (ms), the value column (``count`` for counts) and ``_ts`` (end - 1).

    Example::

        keyed.window(es.TumblingEventTimeWindows.of(10_000)).max("price")
        keyed.window(es.EventTimeSessionWindows.with_gap(10_000)).count()
        keyed.window(es.TumblingProcessingTimeWindows.of(10_000)).mean("price")
    """

    def __init__(self, keyed: ColumnarKeyedStream, assigner: WindowAssigner) -> None:
        self._keyed = keyed
        self._assigner = assigner
        # Cumulative windows are the SQL window aggregation's only (aggregate()).
        cumulative = isinstance(assigner, CumulativeEventTimeWindows)
        self._kind, self._describe, self._params = (
            ("", "", {}) if cumulative else _operator_for(assigner)
        )

    def _aggregate(self, kind: str, column: str | None) -> DataStream:
        if not self._kind:
            raise ConfigurationError(
                f"{kind}() of CumulativeEventTimeWindows: cumulative windows take "
                ".aggregate(es.agg...) (the SQL window aggregation) only"
            )
        key = self._keyed.key_column
        self._spec_columns(kind, key, column, window=True)
        spec: Any
        if self._kind == "columnar_session_window":
            spec = SessionWindowSpec(kind, key, column, **self._params)
        else:
            spec = WindowAggregateSpec(kind, key, column, **self._params)
        return self._keyed._then(self._kind, f"{self._describe} {kind}({column or ''})", spec)

    # The row path's window operations, refused with the way out (not an AttributeError).
    def _rows_only(self, method: str) -> Any:
        raise ConfigurationError(
            f"{method}() works on windows of rows; these windows are columnar: use sum/count/"
            "min/max/mean, or call to_rows() before key_by()"
        )

    def reduce(self, fn: Any, *args: Any) -> Any:
        """Not for columnar windows (use the aggregations or ``to_rows()``)."""
        return self._rows_only("reduce")

    def aggregate(self, *aggs: Any) -> Any:
        """The SQL window aggregation (Flink SQL's ``GROUP BY window_start, window_end,
        keys``) of ``aggs`` (:mod:`epochstream.agg` calls) per key and window: tumbling,
        sliding (HOP) or ``CumulativeEventTimeWindows`` (CUMULATE) event-time windows,
        tumbling or sliding processing-time windows (TUMBLE/HOP over ``PROCTIME()``), or
        ``EventTimeSessionWindows.with_gap`` sessions (Flink SQL's SESSION window
        aggregation: any number of keys and aggregates per session).

        Output batches: the key columns, ``window_start``, ``window_end``
        (``timestamp[ms]``), one column per aggregate, ``_ts`` (end - 1). A row per key
        and window with rows. Event time: when the watermark passes the window's end;
        rows of windows that all fired are late (dropped and counted). Processing time:
        a batch's rows take the operator clock's time when it arrives (no ``_ts``
        needed), a window fires when the clock passes its end, every open window fires
        at the end of a bounded input, watermarks fire nothing and no row is late.

        Example::

            (bids.key_by(["auction", "bidder"])
                .window(es.SlidingEventTimeWindows.of(10_000, 2_000))
                .aggregate(es.agg.count_star("bids"), es.agg.max("price", "top")))
            (bids.key_by("bidder")
                .window(es.EventTimeSessionWindows.with_gap(10_000))
                .aggregate(es.agg.count_star("bids"), es.agg.avg("price", "mean")))
            (bids.key_by("auction")
                .window(es.TumblingProcessingTimeWindows.of(60_000))
                .aggregate(es.agg.count("bidder", "bidders", distinct=True)))
        """
        if not aggs or not all(isinstance(a, AggCall) for a in aggs):
            raise ConfigurationError(
                "aggregate() works on windows of rows; these windows are columnar: give it "
                f"es.agg calls (es.agg.sum('price', 'total')...), not {aggs!r}, or call "
                "to_rows() before key_by()"
            )
        described = ", ".join(f"{a.kind}({a.column or '*'})" for a in aggs)
        if isinstance(self._assigner, EventTimeSessionWindows):
            if self._assigner.gap is None:
                raise ConfigurationError(
                    "aggregate() over session windows takes a fixed gap "
                    "(EventTimeSessionWindows.with_gap)"
                )
            sessions = SessionAggregateSpec(
                keys=self._keyed.key_columns, gap=self._assigner.gap, aggs=aggs
            )
            return self._keyed._then(
                "columnar_session_aggregate", f"session window {described}", sessions
            )
        window = _processing_time_window(self._assigner)
        proctime = window is not None
        spec = SliceWindowAggregateSpec(
            keys=self._keyed.key_columns,
            window=window or _table_window(self._assigner),
            aggs=aggs,
            proctime=proctime,
        )
        if proctime:
            kind, name = "columnar_processing_window_aggregate", "processing-time window"
        else:
            kind, name = "columnar_window_aggregate", "window"
        return self._keyed._then(kind, f"{spec.window.kind} {name} {described}", spec)

    def process(self, fn: Any) -> Any:
        """Not for columnar windows (use the aggregations or ``to_rows()``)."""
        return self._rows_only("process")

    def min_by(self, position: Any) -> Any:
        """Not for columnar windows (use ``min`` or ``to_rows()``)."""
        return self._rows_only("min_by")

    def max_by(self, position: Any) -> Any:
        """Not for columnar windows (use ``max`` or ``to_rows()``)."""
        return self._rows_only("max_by")

    def trigger(self, trigger: Any) -> Any:
        """Not for columnar windows: they fire by the watermark or the clock only."""
        return self._rows_only("trigger")

    def allowed_lateness(self, lateness: Any) -> Any:
        """Not for columnar windows: late rows are dropped and counted."""
        return self._rows_only("allowed_lateness")

    def side_output_late_data(self, tag: Any) -> Any:
        """Not for columnar windows: late rows are dropped and counted."""
        return self._rows_only("side_output_late_data")


def _operator_for(assigner: WindowAssigner) -> tuple[str, str, dict[str, int]]:
    """The operator kind, its name prefix and spec parameters for ``assigner``."""
    if isinstance(assigner, TumblingEventTimeWindows):
        return "columnar_window", "window", _fixed(assigner.size, assigner.size, assigner.offset)
    if isinstance(assigner, SlidingEventTimeWindows):
        return "columnar_window", "window", _fixed(assigner.size, assigner.slide, assigner.offset)
    if isinstance(assigner, TumblingProcessingTimeWindows):
        params = _fixed(assigner.size, assigner.size, assigner.offset)
        return "columnar_processing_window", "processing-time window", params
    if isinstance(assigner, SlidingProcessingTimeWindows):
        params = _fixed(assigner.size, assigner.slide, assigner.offset)
        return "columnar_processing_window", "processing-time window", params
    if isinstance(assigner, EventTimeSessionWindows):
        if assigner.gap is None:
            raise ConfigurationError(
                "columnar session windows take a fixed gap (EventTimeSessionWindows.with_gap); "
                "for a dynamic gap call to_rows() before key_by()"
            )
        return "columnar_session_window", "session window", {"gap": assigner.gap}
    raise ConfigurationError(
        f"columnar windows are {_SUPPORTED}, got {type(assigner).__name__}: call to_rows() "
        "before key_by() for the others"
    )


def _fixed(size: int, slide: int, offset: int) -> dict[str, int]:
    return {"size": size, "slide": slide, "offset": offset}


def _table_window(assigner: WindowAssigner) -> WindowTvf:
    """The SQL window (TUMBLE, HOP, CUMULATE) of an event-time window assigner (what
    ``window_assign`` takes too: it has no processing time)."""
    if isinstance(assigner, TumblingEventTimeWindows):
        return WindowTvf.tumble(assigner.size, assigner.offset)
    if isinstance(assigner, SlidingEventTimeWindows):
        return WindowTvf.hop(assigner.size, assigner.slide, assigner.offset)
    if isinstance(assigner, CumulativeEventTimeWindows):
        return WindowTvf.cumulate(assigner.size, assigner.step, assigner.offset)
    raise ConfigurationError(
        "a SQL window aggregation takes tumbling, sliding or cumulative event-time windows "
        "(aggregate() tumbling or sliding processing-time windows too), got "
        f"{type(assigner).__name__}"
    )


def _processing_time_window(assigner: WindowAssigner) -> WindowTvf | None:
    """The TUMBLE or HOP of a processing-time window assigner (None: not one)."""
    if isinstance(assigner, TumblingProcessingTimeWindows):
        return WindowTvf.tumble(assigner.size, assigner.offset)
    if isinstance(assigner, SlidingProcessingTimeWindows):
        return WindowTvf.hop(assigner.size, assigner.slide, assigner.offset)
    return None
