"""Joins of two columnar streams, with Arrow's hash join on whole batches.

``left.join(right)`` on columnar streams returns a :class:`ColumnarJoinedStreams`; the
keys are column names. Both inputs are hash-partitioned by their key column, so equal
keys meet in one subtask (the key columns must have one type, any integer widths
counting as one: int64).

- With ``window(assigner)`` (tumbling or sliding event time): a **window join**. Each
  side's rows are kept per window; when the watermark (the minimum of both inputs')
  passes a window's end, the window's pairs come out as one batch per window and
  subtask, before the watermark moves on. Rows arriving after all their windows fired
  are dropped (late).
- Without ``window()``: a **regular join** (Flink SQL's unbounded inner equi-join):
  each arriving batch is joined with all rows the other side has sent so far, then
  kept. Its state grows without bound.

Output batches: the left columns, then the right ones (a right column whose name a left
column has already gets the suffix ``_right``), then ``window_start``/``window_end``
(window joins) and ``_ts`` (window joins: ``window_end - 1``; regular joins: the
arriving row's ``_ts``, when the inputs have event time). Null keys never join.

**The SQL joins** (:class:`~epochstream.graph.specs.EquiJoinSpec`, operator
``columnar_equi_join``): keys may be several columns (``where(["a", "b"])``), the
caller names the output columns with ``select(left_output, right_output,
condition=...)``, and the state is kept forever (regular join), within an interval
(``between(lower, upper)``: ``lower <= left._ts - right._ts <= upper``; the output
watermark is held back by ``max(-lower, upper)``) or until the watermark passes each
row's window end (``within_windows("window_end", "window_end")``, for two window
aggregations' outputs). :func:`equi_join` builds it from a spec directly (the SQL
planner's entry).

Example::

    pairs = (auctions.join(persons)
               .where("seller").equal_to("id")
               .window(es.TumblingEventTimeWindows.of(10_000))
               .apply())       # columns id, seller, ..., id_right, name, ..., window_start, window_end, _ts
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epochstream.api.joins import _check_same_pipeline
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import (
    EquiJoinSpec,
    IntervalBounds,
    JoinSpec,
    OutputColumns,
    WindowEnd,
    join_key_type,
    reserved_join_columns,
)
from epochstream.graph.windowing import (
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)

if TYPE_CHECKING:
    from epochstream.api.datastream import DataStream

__all__ = ["ColumnarJoinedStreams", "equi_join"]


class ColumnarJoinedStreams:
    """``left.join(right)`` of two columnar streams: ``where(column)``,
    ``equal_to(column)``, optionally ``window(assigner)``, then ``apply(fn=None)``
    (see the module docstring for semantics and output columns).

    Example::

        # Regular join: every category-10 auction with its seller, as batches.
        auctions.join(persons).where("seller").equal_to("id").apply()
        # Window join, each window's pairs mapped by a batch function.
        persons.join(auctions).where("id").equal_to("seller") \\
            .window(es.TumblingEventTimeWindows.of(10_000)) \\
            .apply(lambda b: b.select(["id", "name", "window_start", "_ts"]))
    """

    def __init__(self, left: DataStream, right: DataStream) -> None:
        _check_same_pipeline(left, right, "join")
        if not right.columnar:
            raise ConfigurationError(
                f"join(): {left._t.name!r} is columnar and {right._t.name!r} carries rows; "
                "join two columnar streams (to_batches(schema)) or two row streams (to_rows())"
            )
        self._left = left
        self._right = right
        self._left_keys: tuple[str, ...] | None = None
        self._right_keys: tuple[str, ...] | None = None
        self._window: tuple[int, int, int] | None = None
        self._retention: IntervalBounds | WindowEnd | None = None

    @staticmethod
    def _columns(method: str, columns: Any) -> tuple[str, ...]:
        names = tuple(columns) if isinstance(columns, list | tuple) else (columns,)
        if not names or not all(isinstance(c, str) and c for c in names):
            raise ConfigurationError(
                f"{method}() of a columnar join takes a column name or a list of them, got "
                f"{columns!r}; call to_rows() on both streams to join rows by key functions"
            )
        return names

    def where(self, columns: str | list[str]) -> ColumnarJoinedStreams:
        """The left stream's key column, or columns (a composite key).

        Example: ``.where("seller")``, ``.where(["auction", "window_end"])``
        """
        self._left_keys = self._columns("where", columns)
        return self

    def equal_to(self, columns: str | list[str]) -> ColumnarJoinedStreams:
        """The right stream's key column(s), as many as ``where``'s.

        Example: ``.equal_to("id")``
        """
        self._right_keys = self._columns("equal_to", columns)
        return self

    def between(
        self, lower: int, upper: int, *, lower_inclusive: bool = True, upper_inclusive: bool = True
    ) -> ColumnarJoinedStreams:
        """An interval join: pairs with ``lower <= left._ts - right._ts <= upper`` (ms),
        each side's rows kept only while they may still pair; build it with
        :meth:`select`.

        Example: ``.between(-10_000, 0)`` (the left row at most 10 s before the right one)
        """
        self._retention = IntervalBounds.of(
            lower, upper, lower_inclusive=lower_inclusive, upper_inclusive=upper_inclusive
        )
        return self

    def within_windows(
        self, left_column: str = "window_end", right_column: str = "window_end"
    ) -> ColumnarJoinedStreams:
        """A window join of two window aggregations' outputs: each row is kept until
        the watermark reaches its window's end (column ``left_column``/``right_column``)
        minus 1; pairs get ``_ts = window_end - 1``. Put the window in the keys; build
        it with :meth:`select`.

        Example: ``.where(["window_end", "auction"]).equal_to(["window_end", "id"]).within_windows()``
        """
        self._retention = WindowEnd(left_column, right_column)
        return self

    def select(
        self,
        left_output: Any,
        right_output: Any,
        *,
        condition: Callable[[Any], Any] | None = None,
        name: str | None = None,
        join_type: str = "inner",
        updating_input: bool = False,
        state_ttl_ms: int = 0,
        output_schema: Any = None,
    ) -> DataStream:
        """The joined pairs with the columns the caller names: ``left_output`` and
        ``right_output`` are lists of input column names or ``(input, output)`` pairs,
        emitted in that order, then ``_ts``. ``condition(batch) -> BooleanArray``
        (picklable) keeps the candidate pairs where it is TRUE. A regular join unless
        :meth:`between` or :meth:`within_windows` was called; a regular join may be an
        outer one (``join_type="left"``, ``"right"``, ``"full"``; ``output_schema``, the
        output columns' Arrow types, pads the unmatched rows), take changelog inputs
        (``updating_input=True``) and expire its rows (``state_ttl_ms``); see
        :class:`~epochstream.graph.specs.EquiJoinSpec`.

        Example::

            bids.join(auctions).where("auction").equal_to("id").between(-60_000, 0) \
                .select(["auction", ("price", "bid_price")], [("seller", "seller")])
        """
        if self._window is not None:
            raise ConfigurationError(
                "select() builds the SQL joins (regular, between(), within_windows()); a "
                "join with window(assigner) takes apply()"
            )
        left_keys, right_keys = self._keys()
        spec = EquiJoinSpec(
            left_keys,
            right_keys,
            _output_columns("left", left_output),
            _output_columns("right", right_output),
            condition=condition,
            retention=self._retention,
            join_type=join_type,
            updating_input=updating_input,
            state_ttl_ms=state_ttl_ms,
            output_schema=output_schema,
        )
        return equi_join(self._left, self._right, spec, name=name)

    def _keys(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if self._left_keys is None or self._right_keys is None:
            raise ConfigurationError(
                "a columnar join needs where(column) and equal_to(column) before apply() "
                "or select()"
            )
        return self._left_keys, self._right_keys

    def window(self, assigner: WindowAssigner) -> ColumnarJoinedStreams:
        """Pairs must share a tumbling or sliding event-time window.

        Example: ``.window(es.SlidingEventTimeWindows.of(10_000, 5_000))``
        """
        if isinstance(assigner, TumblingEventTimeWindows):
            self._window = (assigner.size, assigner.size, assigner.offset)
        elif isinstance(assigner, SlidingEventTimeWindows):
            self._window = (assigner.size, assigner.slide, assigner.offset)
        else:
            raise ConfigurationError(
                f"columnar window joins take tumbling or sliding event-time windows, got "
                f"{type(assigner).__name__}: call to_rows() on both streams for the others"
            )
        return self

    def apply(self, fn: Callable[[Any], Any] | None = None) -> DataStream:
        """The joined pairs as batches; ``fn(RecordBatch) -> RecordBatch``, when given,
        maps each joined batch (as ``map_batches`` does: ``_ts`` is kept when ``fn``
        drops it and keeps the rows). A window join hands ``fn`` all pairs of one window
        of one subtask in one batch, so ``fn`` may aggregate per window.

        Example: ``.apply(lambda b: b.select(["name", "id", "_ts"]))``
        """
        from epochstream.api.datastream import DataStream

        left_keys, right_keys = self._keys()
        if len(left_keys) > 1 or self._retention is not None:
            raise ConfigurationError(
                "a join on several columns, between() or within_windows() names its output "
                "columns: finish it with select(left_output, right_output)"
            )
        if fn is not None and not callable(fn):
            raise ConfigurationError(
                f"apply() takes a batch function or nothing, got {type(fn).__name__}"
            )
        left_key, right_key = left_keys[0], right_keys[0]
        if self._window is None:
            spec = JoinSpec(left_key, right_key, fn)
            kind, name = "columnar_join", f"join({left_key}={right_key})"
        else:
            size, slide, offset = self._window
            spec = JoinSpec(left_key, right_key, fn, size=size, slide=slide, offset=offset)
            kind, name = "columnar_window_join", f"window-join({left_key}={right_key})"
        _check_declared_schemas(
            self._left, left_key, self._right, right_key, windowed=self._window is not None
        )
        left, right = self._left.key_by(left_key), self._right.key_by(right_key)
        t = self._left._add(kind, name, spec, [left._edge(), right._edge()])
        return DataStream(self._left._env, t)


def _declared_schema(stream: DataStream) -> Any:
    """The schema of ``stream``'s batches when the job declares it (``to_batches(schema)``,
    possibly followed by filters), else None (known only at the first batch)."""
    t = stream._t
    while t.kind == "filter_batches":
        t = stream._graph.get(t.inputs[0].source_id)
    return t.payload if t.kind == "to_batches" else None


def _check_declared_schemas(
    left: DataStream, left_key: str, right: DataStream, right_key: str, *, windowed: bool
) -> None:
    """Fail at build time when the declared schemas already show a missing key column, a
    column name the join reserves, or key types that cannot match (the operator checks
    the others at the first batch)."""
    types = []
    reserved = reserved_join_columns(windowed)
    for side, stream, key in (("left", left, left_key), ("right", right, right_key)):
        schema = _declared_schema(stream)
        if schema is None:
            return
        clash = next((n for n in schema.names if n in reserved), None)
        if clash is not None:
            raise ConfigurationError(
                f"join(): the {side} stream {stream._t.name!r} has a column named {clash!r}, "
                f"{reserved[clash]}; rename it"
            )
        if key not in schema.names:
            raise ConfigurationError(
                f"join(): the {side} stream {stream._t.name!r} has no column {key!r} "
                f"(columns: {', '.join(schema.names)})"
            )
        types.append(schema.field(key).type)
    if join_key_type(types[0]) != join_key_type(types[1]):
        raise ConfigurationError(
            f"join(): the keys have incompatible types: left {left_key!r} is {types[0]}, right "
            f"{right_key!r} is {types[1]}; equal keys must have one type on both sides "
            "(cast one in map_batches)"
        )


def _output_columns(side: str, columns: Any) -> OutputColumns:
    """``select()``'s columns of one side as (input, output) pairs."""
    if isinstance(columns, str) or not isinstance(columns, list | tuple):
        raise ConfigurationError(
            f"select(): the {side} columns are a list of names or (input, output) pairs, "
            f"got {columns!r}"
        )
    pairs = []
    for column in columns:
        pair = (column, column) if isinstance(column, str) else tuple(column)
        if len(pair) != 2 or not all(isinstance(c, str) and c for c in pair):
            raise ConfigurationError(
                f"select(): a {side} column is a name or an (input, output) pair, got {column!r}"
            )
        pairs.append((pair[0], pair[1]))
    return tuple(pairs)


def equi_join(
    left: DataStream, right: DataStream, spec: EquiJoinSpec, *, name: str | None = None
) -> DataStream:
    """The equi-join ``spec`` of two columnar streams (operator ``spec.operator_kind``:
    ``columnar_regular_join`` for a regular join, inner or outer, else
    ``columnar_equi_join``): both inputs keyed by their key columns (``key_by``, the
    tuple when there are several), pairs as batches of ``spec.output_names`` (a
    changelog, ``_op`` in place of ``_ts``, when ``spec.changelog``).

    Example::

        spec = EquiJoinSpec(("auction",), ("id",), (("price", "price"),),
                            (("seller", "seller"),), retention=IntervalBounds(-60_000, 0))
        pairs = equi_join(bids, auctions, spec)
    """
    from epochstream.api.datastream import DataStream

    _check_same_pipeline(left, right, "join")
    if not (left.columnar and right.columnar):
        raise ConfigurationError(
            f"equi_join(): {left._t.name!r} and {right._t.name!r} must both be columnar "
            "(to_batches(schema))"
        )
    if not isinstance(spec, EquiJoinSpec):
        raise ConfigurationError(f"equi_join() takes an EquiJoinSpec, got {type(spec).__name__}")
    _check_equi_join_schemas(left, right, spec)
    keyed = [
        stream.key_by(list(keys))
        for stream, keys in ((left, spec.left_keys), (right, spec.right_keys))
    ]
    shown = ",".join(f"{a}={b}" for a, b in zip(spec.left_keys, spec.right_keys, strict=True))
    kind = (
        "interval-join"
        if isinstance(spec.retention, IntervalBounds)
        else "window-join"
        if isinstance(spec.retention, WindowEnd)
        else "join"
    )
    if spec.join_type != "inner":
        kind = f"{spec.join_type}-{kind}"
    t = left._add(
        spec.operator_kind,
        name or f"{kind}({shown})",
        spec,
        [keyed[0]._edge(), keyed[1]._edge()],
    )
    return DataStream(left._env, t)


def _check_equi_join_schemas(left: DataStream, right: DataStream, spec: EquiJoinSpec) -> None:
    """Fail at build time when a declared schema lacks a key or output column, or the
    keys' types cannot match (the operator checks the others at the first batch)."""
    types = []
    for side, stream, keys in (("left", left, spec.left_keys), ("right", right, spec.right_keys)):
        schema = _declared_schema(stream)
        if schema is None:
            return
        outputs = spec.left_output if side == "left" else spec.right_output
        missing = next(
            (c for c in (*keys, *(i for i, _ in outputs)) if c not in schema.names), None
        )
        if missing is not None:
            raise ConfigurationError(
                f"join(): the {side} stream {stream._t.name!r} has no column {missing!r} "
                f"(columns: {', '.join(schema.names)})"
            )
        types.append([schema.field(k).type for k in keys])
    for position, (kind, other) in enumerate(zip(*types, strict=True)):
        if join_key_type(kind) != join_key_type(other):
            raise ConfigurationError(
                f"join(): the keys have incompatible types: left {spec.left_keys[position]!r} is "
                f"{kind}, right {spec.right_keys[position]!r} is {other}; equal keys must have "
                "one type on both sides (cast one in map_batches)"
            )
