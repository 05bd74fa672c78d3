"""DataStream and KeyedStream: the fluent API that builds the logical graph.

Example::

    (env.from_sequence(0, 100)
        .map(lambda i: (i % 2, i))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .print())
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from epochstream.connectors.base import Sink as SinkBase
from epochstream.connectors.simple import PrintSink
from epochstream.core.changelog import KindsFromColumn, KindsToColumn
from epochstream.core.functions import (
    FilterFunction,
    FlatMapFunction,
    KeyedProcessFunction,
    MapFunction,
    OutputTag,
    ProcessFunction,
    ReduceFunction,
)
from epochstream.core.state_ttl import TtlConfig
from epochstream.core.watermarks import WatermarkStrategy
from epochstream.exceptions import ConfigurationError
from epochstream.graph.evictors import CountEvictor
from epochstream.graph.specs import DedupSpec, WindowAssignSpec, WindowTvf
from epochstream.graph.transformations import (
    COLUMNAR_OUTPUT_KINDS,
    ColumnKey,
    ColumnKeys,
    Edge,
    Partitioning,
    Transformation,
)
from epochstream.graph.triggers import CountTrigger, PurgingTrigger
from epochstream.graph.windowing import CumulativeEventTimeWindows, GlobalWindows
from epochstream.state.bloom import BloomFilter

if TYPE_CHECKING:
    from epochstream.api.columnar_joins import ColumnarJoinedStreams
    from epochstream.api.environment import Environment
    from epochstream.api.joins import ConnectedStreams, IntervalJoin, JoinedStreams
    from epochstream.api.windowed import WindowedStream
    from epochstream.connectors.base import Sink
    from epochstream.graph.specs import AggCall
    from epochstream.graph.windowing import WindowAssigner

__all__ = ["DataStream", "DataStreamSink", "KeyedStream"]


def _is_expression(value: Any) -> bool:
    """Whether ``value`` is an Arrow compute expression (without importing pyarrow)."""
    cls = type(value)
    return cls.__name__ == "Expression" and cls.__module__.startswith("pyarrow")


def _check_sink_form(stream: Any, sink: Any) -> None:
    if stream.columnar and not getattr(sink, "accepts_batches", False):
        raise ConfigurationError(
            f"{type(sink).__name__} takes rows and {stream._t.name!r} is a columnar stream: "
            "call to_rows() before sink_to() (the built-in sinks take batches; a sink of "
            "your own does with accepts_batches = True on it and writers that take a "
            "pyarrow.RecordBatch)"
        )


def _check_sink_target(stream: Any, sink: Any) -> None:
    """Refuse a sink whose exclusive target (a FileSink's directory) another sink of the
    job already writes."""
    target = sink.exclusive_target()
    if target is None:
        return
    for t in stream._graph.transformations:
        claims = getattr(t.payload, "exclusive_target", None)  # a dead-letter sink too
        if t.kind == "sink" and claims is not None and claims() == target:
            raise ConfigurationError(
                f"sink_to({type(sink).__name__}): {target} is written by another sink of this "
                f"job ({t.name}, operator {t.id}); give each sink a target of its own"
            )


def _name_of(fn: Any, default: str) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return default if name == "<lambda>" else f"{default}({name})"


def _check_callable(fn: Any, base: type, method: str) -> None:
    if isinstance(fn, base):
        return
    if not callable(fn):
        raise ConfigurationError(
            f"expected a callable or a {base.__name__} with {method}(), got {type(fn).__name__}"
        )


class _Named:
    _env: Environment
    _t: Transformation

    def _bind(self, env: Environment, transformation: Transformation) -> None:
        self._env = env
        self._t = transformation
        # The pipeline this stream belongs to; execute() starts a new one (as Flink does).
        self._graph = env._graph

    def _add(self, kind: str, name: str, payload: Any, inputs: list[Edge]) -> Transformation:
        """Append an operator to this stream's pipeline, unless it was executed already."""
        if self._graph is not self._env._graph:
            raise ConfigurationError(
                f"{self._t.name!r} belongs to a pipeline that execute() already ran; each "
                "execute() runs what was built since the last one, so build the stream again"
            )
        t = self._graph.add(kind, name, payload=payload, inputs=inputs)
        t.columnar = kind in COLUMNAR_OUTPUT_KINDS
        return t

    def uid(self, uid: str) -> Any:
        """Give the last operator a stable identity, used to match its state across job versions.

        Example: ``ds.map(parse).uid("parser")``
        """
        if not uid or "/" in uid:
            raise ConfigurationError(f"invalid uid {uid!r}: non-empty, no '/'")
        self._t.uid = uid
        return self

    def name(self, name: str) -> Any:
        """Set the display name of the last operator. Example: ``ds.map(f).name("parse")``."""
        self._t.name = name
        return self


class _Transforms:
    """map / flat_map / filter, shared by DataStream and KeyedStream.

    On a KeyedStream the record's key is current while the function runs, so a rich
    function may use keyed state (``ctx.get_state``), as in Flink.
    """

    # Provided by DataStream (its own partitioning) and KeyedStream (hash by key).
    _then: Callable[[str, str, Any], DataStream]
    _t: Transformation
    _env: Environment

    @property
    def columnar(self) -> bool:
        """Whether the stream carries Arrow record batches (else rows).

        Example: ``env.from_sequence(0, 10, batch_size=4).columnar is True``
        """
        # Side outputs (dead letters, late records) are rows whatever the main output is.
        return self._t.columnar and getattr(self, "_tag", "main") == "main"

    def _rows_only(self, method: str) -> None:
        if self.columnar:
            raise ConfigurationError(
                f"{method}() works on rows, and {self._t.name!r} is a columnar stream of "
                "Arrow record batches: use map_batches()/filter(expression), or call "
                "to_rows() first"
            )

    def sink_to(self, sink: Sink) -> DataStreamSink:
        """Write the stream to ``sink`` (a KeyedStream's records go partitioned by key).

        Example: ``ds.sink_to(es.sinks.FileSink("out/"))``
        """

        if not isinstance(sink, SinkBase):
            raise ConfigurationError(
                f"sink_to needs an epochstream Sink, got {type(sink).__name__}"
            )
        _check_sink_form(self, sink)
        _check_sink_target(self, sink)
        return DataStreamSink(self._env, self._then("sink", type(sink).__name__, sink)._t)

    def print(self, prefix: str | None = None) -> DataStreamSink:
        """Print every record to stdout (at-least-once). Example: ``ds.print()``."""

        return self.sink_to(PrintSink(prefix=prefix))

    def map(self, fn: Callable[[Any], Any] | MapFunction) -> DataStream:
        """Apply ``fn`` to every record. Example: ``ds.map(lambda w: (w, 1))``."""
        self._rows_only("map")
        _check_callable(fn, MapFunction, "map")
        return self._then("map", _name_of(fn, "map"), fn)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]] | FlatMapFunction) -> DataStream:
        """Apply ``fn`` and emit every element of the iterable it returns. Example: ``ds.flat_map(str.split)``."""
        self._rows_only("flat_map")
        _check_callable(fn, FlatMapFunction, "flat_map")
        return self._then("flat_map", _name_of(fn, "flat_map"), fn)

    def filter(self, fn: Callable[[Any], bool] | FilterFunction | Any) -> DataStream:
        """Keep the records for which ``fn`` is true; on a columnar stream ``fn`` is an
        Arrow compute expression evaluated on whole batches.

        Example: ``ds.filter(lambda n: n % 2 == 0)`` or ``batches.filter(pc.field("x") > 3)``
        """
        if _is_expression(fn):
            if not self.columnar:
                raise ConfigurationError(
                    f"filter({fn}) takes an Arrow expression, which needs a columnar stream; "
                    f"{self._t.name!r} carries rows: call to_batches(schema) first"
                )
            return self._then("filter_batches", f"filter({fn})", fn)
        self._rows_only("filter")
        _check_callable(fn, FilterFunction, "filter")
        return self._then("filter", _name_of(fn, "filter"), fn)

    def map_batches(self, fn: Callable[[Any], Any]) -> DataStream:
        """Apply ``fn(pyarrow.RecordBatch) -> pyarrow.RecordBatch`` to every batch of a
        columnar stream (vectorized; the ``_ts`` event-time column is carried over when
        ``fn`` keeps rows one to one and drops it).

        Example: ``ds.map_batches(lambda b: b.append_column("y", pc.multiply(b["x"], 2)))``
        """
        if not self.columnar:
            raise ConfigurationError(
                f"map_batches() needs a columnar stream; {self._t.name!r} carries rows: "
                "call to_batches(schema) first, or use map()"
            )
        if not callable(fn):
            raise ConfigurationError(f"map_batches needs a callable, got {type(fn).__name__}")
        return self._then("map_batches", _name_of(fn, "map_batches"), fn)

    def to_rows(self) -> DataStream:
        """Convert a columnar stream to rows: one dict per row (``_ts`` becomes each
        row's event timestamp). Example: ``batches.to_rows().map(lambda r: r["k"])``
        """
        if not self.columnar:
            raise ConfigurationError(f"to_rows(): {self._t.name!r} carries rows already")
        return self._then("to_rows", "to_rows", None)

    def to_changelog(self, column: str = "op") -> DataStream:
        """A columnar changelog (an updating SQL result) as plain data: its row kinds
        (``_op``) as a string column ``column`` (``+I``, ``-U``, ``+U``, ``-D``) first;
        an append-only stream's rows are all ``+I``. Then ``to_rows()`` gives dicts
        with the kind, or any sink writes it as a column.

        Example: ``env.sql_query("SELECT k, COUNT(*) FROM t GROUP BY k").to_changelog()``
        """
        if not self.columnar:
            raise ConfigurationError("to_changelog(): the stream is rows; call to_batches() first")
        return self.map_batches(KindsToColumn(column)).name("to_changelog")

    def from_changelog(self, column: str = "op") -> DataStream:
        """A columnar stream whose string column ``column`` holds row kinds (``+I``,
        ``-U``, ``+U``, ``-D``) as a changelog: the kinds become ``_op`` (the column is
        dropped), so the stream updates as an updating SQL result does.

        Example: ``batches.from_changelog("op")``
        """
        if not self.columnar:
            raise ConfigurationError(
                "from_changelog(): the stream is rows; call to_batches() first"
            )
        return self.map_batches(KindsFromColumn(column)).name("from_changelog")

    def to_batches(self, schema: Any) -> DataStream:
        """Convert rows (dicts by field name, or tuples in field order) to Arrow record
        batches of ``schema`` (a ``pyarrow.Schema``); event timestamps become ``_ts``.

        Example: ``rows.to_batches(pa.schema([("k", pa.int64()), ("v", pa.int64())]))``
        """
        import pyarrow as pa

        if self.columnar:
            raise ConfigurationError(f"to_batches(): {self._t.name!r} is columnar already")
        if not isinstance(schema, pa.Schema):
            raise ConfigurationError(
                f"to_batches needs a pyarrow.Schema, got {type(schema).__name__}"
            )
        return self._then("to_batches", "to_batches", schema)


class DataStream(_Named, _Transforms):
    """A stream of records produced by one operator.

    Example::

        ds = env.from_collection(["a b", "c"]).flat_map(str.split)
    """

    def __init__(self, env: Environment, transformation: Transformation, tag: str = "main") -> None:
        self._bind(env, transformation)
        self._partitioning = Partitioning()
        #: Which output of the operator this stream is ("main", or a side output's name).
        self._tag = tag

    def _edge(self) -> Edge:
        return Edge(self._t.id, self._partitioning, self._tag)

    def _then(self, kind: str, name: str, payload: Any) -> DataStream:
        t = self._add(kind, name, payload, [self._edge()])
        return DataStream(self._env, t)

    def process(self, fn: ProcessFunction) -> DataStream:
        """Run a :class:`ProcessFunction` on every record (timestamps and side outputs;
        timers need ``key_by``). Example: ``ds.process(Split())``
        """
        self._rows_only("process")
        if not isinstance(fn, ProcessFunction):
            raise ConfigurationError(
                "DataStream.process() needs an es.ProcessFunction (a KeyedProcessFunction "
                "needs key_by() first)"
            )
        return self._then("process", _name_of(fn, "process"), fn)

    def assign_timestamps_and_watermarks(self, strategy: WatermarkStrategy) -> DataStream:
        """Give records timestamps and generate watermarks from here on.

        Example::

            ds.assign_timestamps_and_watermarks(
                es.WatermarkStrategy.bounded_out_of_orderness(timedelta(seconds=3))
                  .with_timestamp_assigner(lambda e, ts: e["ts"]))
        """
        self._rows_only("assign_timestamps_and_watermarks")
        if not isinstance(strategy, WatermarkStrategy):
            raise ConfigurationError(
                f"assign_timestamps_and_watermarks needs an es.WatermarkStrategy, got "
                f"{type(strategy).__name__}"
            )
        return self._then("timestamps", "timestamps", strategy)

    def get_side_output(self, tag: OutputTag) -> DataStream:
        """The records this operator sent to side output ``tag``.

        Example: ``late = counts.get_side_output(es.OutputTag("late"))``
        """
        if not isinstance(tag, OutputTag):
            raise ConfigurationError(
                f"get_side_output needs an es.OutputTag, got {type(tag).__name__}"
            )
        side = DataStream(self._env, self._t, tag.name)
        side._graph = self._graph
        return side

    def connect(self, other: DataStream | KeyedStream) -> ConnectedStreams:
        """Two streams into one operator with two inputs (``map``, ``flat_map`` or
        ``process`` of a Co* function). Example: ``clicks.connect(rules).process(Match())``
        """
        from epochstream.api.joins import ConnectedStreams

        self._rows_only("connect")
        return ConnectedStreams(self, other)

    def join(self, other: DataStream) -> JoinedStreams | ColumnarJoinedStreams:
        """A window join: ``a.join(b).where(k1).equal_to(k2).window(w).apply(fn)``. On
        columnar streams the keys are column names, ``apply()`` takes an optional batch
        function, and without ``window()`` it is a regular (unbounded) join (see
        :class:`~epochstream.api.columnar_joins.ColumnarJoinedStreams`).

        Example: ``orders.join(payments).where(oid).equal_to(oid).window(w).apply(pair)``
        or ``auctions.join(persons).where("seller").equal_to("id").apply()``
        """
        from epochstream.api.columnar_joins import ColumnarJoinedStreams
        from epochstream.api.joins import JoinedStreams

        if self.columnar:
            return ColumnarJoinedStreams(self, other)
        if getattr(other, "columnar", False):
            raise ConfigurationError(
                f"join(): {self._t.name!r} carries rows and {other._t.name!r} is columnar; "
                "join two row streams (to_rows()) or two columnar streams (to_batches(schema))"
            )
        return JoinedStreams(self, other)

    def union(self, *others: DataStream) -> DataStream:
        """Merge streams of the same kind into one (no order between them).

        Example: ``evens.union(odds).map(str)``
        """
        if not others:
            raise ConfigurationError("union needs at least one other stream")
        for other in others:
            if not isinstance(other, DataStream) or other._env is not self._env:
                raise ConfigurationError("union takes DataStreams of the same Environment")
            if other._graph is not self._graph:
                raise ConfigurationError("union takes streams of the same (unexecuted) pipeline")
            if other.columnar != self.columnar:
                raise ConfigurationError(
                    "union takes streams of one form: convert with to_rows() or "
                    "to_batches(schema) so all are rows or all are columnar"
                )
        kind = "map_batches" if self.columnar else "map"
        t = self._add(kind, "union", _identity, [s._edge() for s in (self, *others)])
        return DataStream(self._env, t)

    def deduplicate(
        self,
        id_fn: Callable[[Any], Any],
        ttl: _dt.timedelta | float,
        *,
        bloom_capacity: int = 100_000,
        bloom_fp_rate: float = 0.01,
    ) -> DataStream:
        """Exactly-once processing over at-least-once input: each id once within ``ttl``.

        Records are keyed by ``id_fn(record)`` (a stable key: str, int, tuple...); a
        record whose id was seen less than ``ttl`` ago (processing time) is dropped. A
        Bloom filter sized for ``bloom_capacity`` ids per ``ttl`` per subtask at
        ``bloom_fp_rate`` spares the state lookup of new ids; the exact catalog of seen
        ids is keyed state with TTL. Both are checkpointed. Give it a ``.uid()``.

        Example: ``events.deduplicate(lambda e: e["event_id"], ttl=timedelta(hours=1))``
        """

        TtlConfig.of(ttl, "on_write")  # fail here, not in the slots
        BloomFilter.sized(bloom_capacity, bloom_fp_rate)
        spec = DedupSpec(ttl, bloom_capacity, bloom_fp_rate)
        return self.key_by(id_fn)._then("deduplicate", "deduplicate", spec)

    def key_by(self, key_selector: Callable[[Any], Any] | str | list[str]) -> KeyedStream:
        """Partition by key: records with equal keys go to the same subtask (by key group).

        Keys must have a stable encoding (str, int, float, bytes, bool, None, tuples of
        these...): routing never uses Python's per-process salted built-in hash.

        A column name keys a columnar stream by that column (key groups computed for
        the whole column at once, equal to the row path's for the same values), or a
        stream of dict rows by that field. A list of column names keys by the tuple of
        their values (``key_by(["a"])`` is ``key_by("a")``; ``key_by([])`` gives every
        row one key, for a global window aggregation).

        Example: ``ds.key_by(lambda t: t[0])``, ``batches.key_by("user")`` or
        ``batches.key_by(["auction", "bidder"])``
        """
        if isinstance(key_selector, list | tuple):
            if not all(isinstance(c, str) for c in key_selector):
                raise ConfigurationError(f"key_by takes column names, got {key_selector!r}")
            if len(key_selector) == 1:
                key_selector = ColumnKey(key_selector[0])
            else:
                key_selector = ColumnKeys(tuple(key_selector))
        if isinstance(key_selector, str):
            key_selector = ColumnKey(key_selector)
        elif not callable(key_selector):
            raise ConfigurationError("key_by needs a callable key selector or a column name")
        if self.columnar:
            from epochstream.api.columnar_keyed import ColumnarKeyedStream

            if not isinstance(key_selector, ColumnKey | ColumnKeys):
                raise ConfigurationError(
                    f"{self._t.name!r} is a columnar stream: key it by a column name "
                    "(key_by('column')), or call to_rows() first to key rows by a function"
                )
            keyed: KeyedStream = ColumnarKeyedStream(self._env, self._t, key_selector, self._tag)
        else:
            keyed = KeyedStream(self._env, self._t, key_selector, self._tag)
        keyed._graph = self._graph
        return keyed

    def window_aggregate(self, assigner: WindowAssigner, *aggs: AggCall) -> DataStream:
        """A global SQL window aggregation of a columnar stream (no ``GROUP BY`` keys):
        ``key_by([]).window(assigner).aggregate(*aggs)``, one row per window, all rows
        on one subtask.

        Example::

            batches.window_aggregate(es.TumblingEventTimeWindows.of(10_000),
                                     es.agg.count_star("bids"), es.agg.max("price", "top"))
        """
        if not self.columnar:
            raise ConfigurationError(
                "window_aggregate() aggregates a columnar stream (Arrow batches); call "
                "to_batches() first"
            )
        keyed: Any = self.key_by([])  # every row one key: one subtask
        return keyed.window(assigner).aggregate(*aggs)

    def window_assign(self, window: WindowTvf | WindowAssigner) -> DataStream:
        """Flink SQL's window table function without aggregation (``SELECT * FROM
        TABLE(TUMBLE|HOP|CUMULATE(TABLE t, DESCRIPTOR(ts), ...))``) on a columnar
        stream: every row once per window it belongs to, with ``window_start``,
        ``window_end`` and ``window_time`` (``timestamp[ms]``, ``window_end - 1``) added;
        ``_ts`` stays the row's own. ``window``: an :class:`~epochstream.graph.specs.WindowTvf`
        or a tumbling, sliding or cumulative event-time window assigner. Stateless.

        Example::

            bids.window_assign(es.SlidingEventTimeWindows.of(10_000, 5_000))   # HOP
            bids.window_assign(WindowTvf.cumulate(60_000, 10_000))
        """
        from epochstream.api.columnar_windows import _table_window

        if not self.columnar:
            raise ConfigurationError(
                "window_assign() works on a columnar stream (Arrow batches); call "
                "to_batches() first"
            )
        tvf = window if isinstance(window, WindowTvf) else _table_window(window)
        return self._then(
            "columnar_window_assign", f"{tvf.kind} window assign", WindowAssignSpec(tvf)
        )

    def rebalance(self) -> DataStream:
        """Distribute records round-robin over the next operator's subtasks. Example: ``ds.rebalance().map(f)``."""
        return self._repartitioned("rebalance")

    def broadcast(self) -> DataStream:
        """Send every record to every subtask of the next operator. Example: ``ds.broadcast().map(f)``."""
        return self._repartitioned("broadcast")

    def _repartitioned(self, kind: str) -> DataStream:
        out = DataStream(self._env, self._t, self._tag)
        out._graph = self._graph
        out._partitioning = Partitioning(kind)
        return out


class KeyedStream(_Named, _Transforms):
    """A stream partitioned by key; stateful operators on it keep state per key.

    Example::

        counts = words.key_by(lambda w: w).reduce(lambda a, b: a + b)
    """

    def __init__(
        self,
        env: Environment,
        upstream: Transformation,
        key_selector: Callable[[Any], Any],
        tag: str = "main",
    ) -> None:
        self._bind(env, upstream)
        self._key_selector = key_selector
        self._tag = tag

    def _edge(self) -> Edge:
        return Edge(self._t.id, Partitioning("hash", self._key_selector), self._tag)

    def _then(self, kind: str, name: str, payload: Any) -> DataStream:
        t = self._add(kind, name, payload, [self._edge()])
        return DataStream(self._env, t)

    def window(self, assigner: WindowAssigner) -> WindowedStream:
        """Cut each key's records into windows.

        Example: ``keyed.window(es.TumblingEventTimeWindows.of(timedelta(seconds=5))).sum(1)``
        """
        from epochstream.api.windowed import WindowedStream

        if isinstance(assigner, CumulativeEventTimeWindows):
            raise ConfigurationError(
                "CumulativeEventTimeWindows are for the columnar SQL window aggregation "
                "(batches.key_by(...).window(...).aggregate(es.agg...)); windows of rows do "
                "not take them"
            )
        return WindowedStream(self, assigner)

    def count_window(self, size: int, slide: int | None = None) -> WindowedStream:
        """Windows of ``size`` records per key. Without ``slide``: a global window fired
        and purged every ``size`` records. With ``slide`` (Flink's sliding count window):
        every ``slide`` records, the last ``size`` records of the key (a global window
        with ``CountTrigger.of(slide)`` and ``CountEvictor.of(size)``).

        Example: ``keyed.count_window(100).sum(1)``; ``keyed.count_window(5, 2).sum(1)``
        """
        from epochstream.api.windowed import WindowedStream

        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigurationError(f"count_window needs a size >= 1, got {size!r}")
        windowed = WindowedStream(self, GlobalWindows.create())
        if slide is None:
            return windowed.trigger(PurgingTrigger.of(CountTrigger.of(size)))
        return windowed.evictor(CountEvictor.of(size)).trigger(CountTrigger.of(slide))

    def connect(self, other: KeyedStream) -> ConnectedStreams:
        """Two keyed streams into one operator whose state and timers both inputs share.

        Example: ``clicks.key_by(uid).connect(profiles.key_by(uid)).process(Enrich())``
        """
        from epochstream.api.joins import ConnectedStreams

        return ConnectedStreams(self, other)

    def interval_join(self, other: KeyedStream) -> IntervalJoin:
        """Join with ``other`` (same keys) on time: ``.between(lower, upper).process(fn)``.

        Example: ``orders.key_by(oid).interval_join(ships.key_by(oid)).between(0, 3_600_000)``
        """
        from epochstream.api.joins import IntervalJoin

        return IntervalJoin(self, other)

    def reduce(self, fn: Callable[[Any, Any], Any] | ReduceFunction) -> DataStream:
        """Rolling reduce: keep one value per key and emit the updated value for every record.

        Example: ``.key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1]))``
        """
        _check_callable(fn, ReduceFunction, "reduce")
        return self._then("reduce", _name_of(fn, "reduce"), fn)

    def process(self, fn: KeyedProcessFunction) -> DataStream:
        """Run a :class:`KeyedProcessFunction` with keyed state and timers.

        Example: ``keyed.process(CountPerKey())``
        """
        if not isinstance(fn, KeyedProcessFunction):
            raise ConfigurationError("KeyedStream.process() needs a KeyedProcessFunction instance")
        return self._then("process", _name_of(fn, "process"), fn)

    def sum(self, position: int | None = None) -> DataStream:
        """Rolling sum per key: of the record itself, or of field ``position`` of tuple records.

        Example: ``pairs.key_by(lambda t: t[0]).sum(1)``
        """
        if position is None:
            return self.reduce(_add)
        return self.reduce(_SumAt(position))


def _identity(value: Any) -> Any:
    return value


def _add(a: Any, b: Any) -> Any:
    return a + b


class _SumAt:
    """Picklable reducer summing one tuple field and keeping the others from the first record."""

    def __init__(self, position: int) -> None:
        self.position = position

    def __call__(self, a: Any, b: Any) -> Any:
        p = self.position
        return (*a[:p], a[p] + b[p], *a[p + 1 :])


class DataStreamSink(_Named):
    """The end of a pipeline; returned by ``sink_to`` and ``print`` so it can get a uid/name.

    Example: ``ds.sink_to(sink).uid("file-sink")``
    """

    def __init__(self, env: Environment, transformation: Transformation) -> None:
        self._env = env
        self._t = transformation
