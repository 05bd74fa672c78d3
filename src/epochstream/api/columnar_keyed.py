"""The columnar keyed stream: vectorized keyed aggregations on Arrow record batches.

``batches.key_by("k")`` on a columnar stream returns a :class:`ColumnarKeyedStream`.
Its aggregations are rolling, as on the row path: for every input batch, one output
row per key the batch touched, holding the key's new running value. The state lives
in NumPy arrays (one slot per key), is checkpointed with the barriers like any keyed
state, and restores at another parallelism by key group.

Example::

    (env.from_sequence(0, 10_000_000, batch_size=65_536)
        .map_batches(to_kv)
        .key_by("k")
        .sum("v")                  # columns k, v (running sum)
        .sink_to(sink))
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from epochstream.api.datastream import DataStream, KeyedStream
from epochstream.core.arrow import TS
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import (
    AggCall,
    AggregateSpec,
    GroupAggregateSpec,
    MiniBatch,
    OverAggregateSpec,
    TopNSpec,
    WindowTopNSpec,
)
from epochstream.graph.transformations import ColumnKey, ColumnKeys

if TYPE_CHECKING:
    from epochstream.graph.windowing import WindowAssigner

__all__ = ["ColumnarAggregations", "ColumnarKeyedStream"]


class ColumnarAggregations(ABC):
    """The aggregations of the columnar path, on a keyed stream (rolling) or on its
    windows (one result per key and window).

    Example: ``keyed.sum("v")``, ``keyed.window(w).max("price")``, ``keyed.count()``
    """

    @abstractmethod
    def _aggregate(self, kind: str, column: str | None) -> DataStream:
        """The stream of aggregation ``kind`` of ``column`` (None for counts)."""

    @staticmethod
    def _column(kind: str, column: Any) -> str:
        if not isinstance(column, str):
            raise ConfigurationError(
                f"{kind}() on a columnar stream takes a column name, got {column!r}"
            )
        return column

    @staticmethod
    def _spec_columns(kind: str, key: str, column: str | None, *, window: bool = False) -> None:
        """Refuse an aggregation whose output would have two columns of one name (and
        ``to_rows()`` would keep only one of them): of the key column itself, a count
        keyed by a column named ``count``, a window aggregation of or keyed by
        ``window_start``/``window_end``, and any aggregation of or keyed by ``_ts`` (the
        event time, which every result carries as a column of its own)."""
        if TS in (key, column):
            raise ConfigurationError(
                f"{kind}({column or ''}) keyed by {key!r}: {TS!r} is the event-time column, "
                f"which the result carries under that name itself; copy {TS!r} under another "
                "name in map_batches first"
            )
        if column == key:
            raise ConfigurationError(
                f"{kind}({column!r}) aggregates the key column; the result has the key and the "
                f"value under one name: copy the column under another name in map_batches first"
            )
        out = "count" if kind == "count" else column
        names = [key, out] + (["window_start", "window_end"] if window else [])
        clash = next((n for n in names if names.count(n) > 1), None)
        if clash is not None:
            raise ConfigurationError(
                f"{kind}({column or ''}) keyed by {key!r}: the result would have two columns "
                f"named {clash!r} (its columns: {', '.join(str(n) for n in names)}); rename "
                "the key or the value column in map_batches first"
            )

    def sum(self, column: Any = None) -> DataStream:
        """Sum of ``column`` per key. Example: ``keyed.sum("v")``"""
        return self._aggregate("sum", self._column("sum", column))

    def min(self, column: str) -> DataStream:
        """Minimum of ``column`` per key. Example: ``keyed.min("price")``"""
        return self._aggregate("min", self._column("min", column))

    def max(self, column: str) -> DataStream:
        """Maximum of ``column`` per key. Example: ``keyed.max("price")``"""
        return self._aggregate("max", self._column("max", column))

    def mean(self, column: str) -> DataStream:
        """Mean (float64) of ``column`` per key. Example: ``keyed.mean("price")``"""
        return self._aggregate("mean", self._column("mean", column))

    def count(self) -> DataStream:
        """Rows per key (column ``count``). Example: ``keyed.count()``"""
        return self._aggregate("count", None)


class ColumnarKeyedStream(ColumnarAggregations, KeyedStream):
    """A columnar stream keyed by a column (returned by ``key_by("column")``).

    ``sum``/``min``/``max``/``mean`` of a column and ``count()``: rolling aggregations
    whose output batches have the key column and the value column (``count`` for
    counts), plus ``_ts`` (the latest event time of the key's rows) with event time.

    Example::

        batches.key_by("user").count()          # columns user, count
    """

    _key_selector: ColumnKey | ColumnKeys

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The columns the stream is keyed by.
        Example: ``batches.key_by(["a", "b"]).key_columns == ("a", "b")``"""
        key = self._key_selector
        return (key.column,) if isinstance(key, ColumnKey) else key.columns

    @property
    def key_column(self) -> str:
        """The column the stream is keyed by. Example: ``batches.key_by("k").key_column == "k"``"""
        key = self._key_selector
        if not isinstance(key, ColumnKey):
            raise ConfigurationError(
                f"this stream is keyed by the columns {list(key.columns)}: sum/count/min/max/"
                "mean take one key column; use .window(...).aggregate(es.agg...) for several"
            )
        return key.column

    def _aggregate(self, kind: str, column: str | None) -> DataStream:

        self._spec_columns(kind, self.key_column, column)
        spec = AggregateSpec(kind, key=self.key_column, value=column)
        return self._then("columnar_aggregate", f"{kind}({column or ''})", spec)

    def aggregate(
        self,
        *aggs: AggCall,
        updating_input: bool = False,
        mini_batch: MiniBatch | None = None,
        state_ttl_ms: int = 0,
    ) -> DataStream:
        """Flink SQL's ``GROUP BY`` without a window: ``aggs`` (:mod:`epochstream.agg`
        calls) per key over the whole stream, an *updating* result. The output is a
        changelog: the key columns, one column per aggregate and ``_op``
        (:class:`~epochstream.core.changelog.RowKind`): ``+I`` when a key first comes,
        ``-U`` (its old result) then ``+U`` (the new) when a batch changes it, nothing when
        its result stays the same; one change per key per batch. ``key_by([])``
        aggregates the whole stream as one group. ``updating_input=True``: the input is
        itself a changelog (``from_changelog()``, an updating SQL result), whose ``-U``
        and ``-D`` rows retract what they name (MIN, MAX and COUNT(DISTINCT) keep each
        group's values with their counts for it), and a group whose rows are all
        retracted is deleted (``-D``). ``mini_batch``: buffer the input up to
        ``mini_batch.size`` rows or ``mini_batch.latency_ms`` (processing time) before
        folding it, so a key's changes come out once per buffer (Flink's
        ``table.exec.mini-batch``); the buffer is folded before every checkpoint
        barrier and watermark and at the end of the input. ``state_ttl_ms`` (Flink's
        ``table.exec.state.ttl``; 0: forever): a group expires that long (processing
        time) after it was last written; its key's next row starts a new group (``+I``),
        and retractions of expired state are ignored (counted in
        ``late_records_dropped``).

        Example::

            (bids.key_by("bidder")
                .aggregate(es.agg.count_star("bids"), es.agg.max("price", "top")))
        """
        if not aggs or not all(isinstance(a, AggCall) for a in aggs):
            raise ConfigurationError(
                "aggregate() of a columnar keyed stream takes es.agg calls "
                f"(es.agg.sum('price', 'total')...), not {aggs!r}"
            )
        spec = GroupAggregateSpec(
            keys=self.key_columns,
            aggs=tuple(aggs),
            updating_input=updating_input,
            mini_batch=mini_batch,
            state_ttl_ms=state_ttl_ms,
        )
        described = ", ".join(f"{a.kind}({a.column or '*'})" for a in aggs)
        return self._then("columnar_group_aggregate", f"group aggregate {described}", spec)

    def window_top_n(
        self,
        n: int,
        *,
        order_by: Sequence[tuple[str, str] | str],
        rank_column: str | None = None,
    ) -> DataStream:
        """Flink SQL's window Top-N: per window (``window_start``, ``window_end``
        columns of the input: a window aggregation's or ``window_assign``'s output) and
        key (the ``key_by`` columns; ``key_by([])``: one partition per window), the first
        ``n`` rows by ``order_by``, emitted when the watermark passes the window's end.

        ``order_by``: ``(column, "asc" | "desc")`` pairs (a bare column name is
        ascending); NULLs sort first ascending and last descending (Flink's default),
        ties get distinct row numbers by arrival order (``ROW_NUMBER``). ``rank_column``
        names an int64 column of the row numbers (1 to ``n``); without it the rows come
        without. SQL's ``rownum <= N`` is ``n=N``, ``rownum < N`` is ``n=N - 1``,
        ``rownum = 1`` is ``n=1``. Output: the input's columns, the rank column, and
        ``_ts = window_end - 1``. Rows of windows that fired are late (dropped, counted).

        Example::

            (bids.key_by("auction")
                .window(es.TumblingEventTimeWindows.of(10_000))
                .aggregate(es.agg.sum("price", "volume"), es.agg.count_star("bids"))
                .key_by([])                                   # the top 3 auctions per window
                .window_top_n(3, order_by=[("volume", "desc")], rank_column="rownum"))
        """
        keys = _order_keys("window_top_n", order_by)
        spec = WindowTopNSpec(self.key_columns, keys, n, rank_column)
        shown = ", ".join(f"{c} {d}" for c, d in keys)
        return self._then("columnar_window_top_n", f"window top-{n} by {shown}", spec)

    def top_n(
        self,
        n: int,
        *,
        order_by: Sequence[tuple[str, str] | str],
        rank_column: str | None = None,
        state_ttl_ms: int = 0,
    ) -> DataStream:
        """Flink SQL's Top-N without a window (``ROW_NUMBER() OVER (PARTITION BY keys
        ORDER BY ...) <= n``; ``n=1`` is a deduplication): per key (the ``key_by``
        columns) the first ``n`` rows so far by ``order_by`` (as :meth:`window_top_n`:
        NULLs first ascending, last descending; ties by arrival), an *updating* result.
        The output is a changelog (``_op``): with ``rank_column``, per key and row number
        ``+I`` when it is first filled and ``-U``/``+U`` when its row changes; without it,
        ``-U``/``+U`` of the key's row for ``n=1``, and for ``n > 1`` ``-D`` for a row
        pushed out and ``+I`` for a row let in. The input must be append-only.
        ``state_ttl_ms`` (Flink's ``table.exec.state.ttl``; 0: forever): a key's rows
        expire that long (processing time) after the key was last written; its next
        rows start afresh (``+I``).

        Example::

            bids.key_by("auction").top_n(1, order_by=[("price", "desc")])   # the best bid
        """
        keys = _order_keys("top_n", order_by)
        spec = TopNSpec(self.key_columns, keys, n, rank_column, state_ttl_ms=state_ttl_ms)
        shown = ", ".join(f"{c} {d}" for c, d in keys)
        return self._then("columnar_top_n", f"top-{n} by {shown}", spec)

    def keep_first(self, *, state_ttl_ms: int = 0) -> DataStream:
        """The first row of each key by arrival, once: Flink SQL's processing-time
        deduplication (``ROW_NUMBER() OVER (PARTITION BY keys ORDER BY proctime ASC)
        = 1``), an insert-only result (a kept row is never displaced). Later rows of a
        key are dropped; with ``state_ttl_ms`` a key is forgotten that long
        (processing time) after it was last written, and its next row comes out again.

        Example: ``clicks.key_by("session").keep_first()``   # each session's first click
        """
        spec = TopNSpec(self.key_columns, (), 1, state_ttl_ms=state_ttl_ms)
        return self._then("columnar_top_n", "first row by arrival", spec)

    def over_aggregate(
        self,
        *aggs: AggCall,
        frame: str = "rows",
        preceding: int | None = None,
        proctime: bool = False,
    ) -> DataStream:
        """Flink SQL's OVER aggregation over event time (``agg(x) OVER (PARTITION BY
        keys ORDER BY rowtime ROWS|RANGE BETWEEN preceding PRECEDING AND CURRENT
        ROW)``): every input row once, when the watermark passes its time, with ``aggs``
        (:mod:`epochstream.agg` calls: COUNT, SUM, AVG, MIN, MAX) over its frame
        appended. ``frame="rows"``: the row and ``preceding`` rows before it (ties by
        arrival); ``frame="range"``: the rows at most ``preceding`` ms older, and its
        peers of equal time; ``preceding=None`` is UNBOUNDED. Append-only input; rows
        at or behind the watermark are late (dropped, counted). ``proctime=True``: ordered
        by processing time instead, each batch's rows taking the clock's time on arrival
        and emitted at once.

        Example::

            bids.key_by("bidder").over_aggregate(
                es.agg.sum("price", "recent"), frame="range", preceding=10_000)
        """
        if not aggs or not all(isinstance(a, AggCall) for a in aggs):
            raise ConfigurationError(
                "over_aggregate() takes es.agg calls (es.agg.sum('price', 'total')...), "
                f"not {aggs!r}"
            )
        spec = OverAggregateSpec(self.key_columns, tuple(aggs), frame, preceding, proctime)
        bound = "UNBOUNDED" if preceding is None else str(preceding)
        described = ", ".join(f"{a.kind}({a.column or '*'})" for a in aggs)
        label = f"over {described} ({frame.upper()} {bound} PRECEDING)"
        return self._then("columnar_over_aggregate", label, spec)

    # Row-only operations on a keyed stream, refused with the way out.
    def _rows_only_keyed(self, method: str) -> Any:
        raise ConfigurationError(
            f"{method}() works on rows; this keyed stream is columnar: use sum/count/min/"
            "max/mean, or call to_rows() before key_by()"
        )

    def reduce(self, fn: Any) -> DataStream:
        """Not for columnar streams (use the aggregations or ``to_rows()``)."""
        return self._rows_only_keyed("reduce")

    def process(self, fn: Any) -> DataStream:
        """Not for columnar streams (use the aggregations or ``to_rows()``)."""
        return self._rows_only_keyed("process")

    def connect(self, other: Any) -> Any:
        """Not for columnar streams (call ``to_rows()`` first)."""
        return self._rows_only_keyed("connect")

    def interval_join(self, other: Any) -> Any:
        """Not for columnar streams (call ``to_rows()`` first)."""
        return self._rows_only_keyed("interval_join")

    def count_window(self, size: int, slide: int | None = None) -> Any:
        """Not for columnar streams (call ``to_rows()`` first)."""
        return self._rows_only_keyed("count_window")

    def window(self, assigner: WindowAssigner) -> Any:
        """Windows of a columnar keyed stream (tumbling/sliding event-time, event-time
        sessions with a fixed gap, tumbling/sliding processing-time), with vectorized
        aggregations. Example: ``keyed.window(TumblingEventTimeWindows.of(10_000)).sum("v")``
        """
        from epochstream.api.columnar_windows import ColumnarWindowedStream

        return ColumnarWindowedStream(self, assigner)


def _order_keys(
    method: str, order_by: Sequence[tuple[str, str] | str]
) -> tuple[tuple[str, str], ...]:
    """``order_by`` as ``(column, "asc" | "desc")`` pairs (a bare name is ascending)."""
    if isinstance(order_by, str):
        raise ConfigurationError(
            f"{method}(order_by={order_by!r}): give a list, e.g. [({order_by!r}, 'desc')]"
        )
    keys: list[tuple[str, str]] = []
    for item in order_by:
        column, direction = (item, "asc") if isinstance(item, str) else item
        keys.append((column, str(direction).lower()))
    return tuple(keys)
