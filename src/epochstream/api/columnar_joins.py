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
from epochstream.graph.specs import JoinSpec, join_key_type, reserved_join_columns
from epochstream.graph.windowing import (
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)

if TYPE_CHECKING:
    from epochstream.api.datastream import DataStream

__all__ = ["ColumnarJoinedStreams"]


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
        self._left_key: str | None = None
        self._right_key: str | None = None
        self._window: tuple[int, int, int] | None = None

    @staticmethod
    def _column(method: str, column: Any) -> str:
        if not isinstance(column, str) or not column:
            raise ConfigurationError(
                f"{method}() of a columnar join takes a column name, got {column!r}; call "
                "to_rows() on both streams to join rows by key functions"
            )
        return column

    def where(self, column: str) -> ColumnarJoinedStreams:
        """The left stream's key column. Example: ``.where("seller")``"""
        self._left_key = self._column("where", column)
        return self

    def equal_to(self, column: str) -> ColumnarJoinedStreams:
        """The right stream's key column. Example: ``.equal_to("id")``"""
        self._right_key = self._column("equal_to", column)
        return self

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

        if self._left_key is None or self._right_key is None:
            raise ConfigurationError(
                "a columnar join needs where(column) and equal_to(column) before apply()"
            )
        if fn is not None and not callable(fn):
            raise ConfigurationError(
                f"apply() takes a batch function or nothing, got {type(fn).__name__}"
            )
        left_key, right_key = self._left_key, self._right_key
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
