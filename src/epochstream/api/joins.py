"""Two inputs: connected streams, window joins and interval joins (Flink's API).

- ``a.connect(b)``: one operator reads both streams; ``map``/``flat_map``/``process``
  take a Co* function with a method per input. When both sides are keyed (``a.key_by(k1)
  .connect(b.key_by(k2))``, or ``a.connect(b).key_by(k1, k2)``) records with equal keys
  meet in one subtask, and a :class:`KeyedCoProcessFunction` shares keyed state and
  timers between the inputs.
- ``a.join(b).where(k1).equal_to(k2).window(w).apply(fn)``: every pair of records with
  equal keys in the same window, ``fn(left, right)`` per pair, emitted when the window
  fires (Flink builds it the same way: both inputs tagged, unioned, windowed).
- ``a.key_by(k).interval_join(b.key_by(k)).between(lower, upper).process(fn)``: every
  pair with ``left.ts + lower <= right.ts <= left.ts + upper`` (``<`` with
  ``.lower_bound_exclusive()`` / ``.upper_bound_exclusive()``).

Example::

    pairs = (orders.join(payments)
               .where(lambda o: o["id"]).equal_to(lambda p: p["order"])
               .window(es.TumblingEventTimeWindows.of(timedelta(minutes=1)))
               .apply(lambda o, p: (o["id"], p["amount"])))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epochstream.core.functions import (
    CoFlatMapFunction,
    Collector,
    CoMapFunction,
    CoProcessFunction,
    Function,
    KeyedCoProcessFunction,
    ProcessJoinFunction,
)
from epochstream.core.time import to_signed_millis
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import IntervalJoinSpec
from epochstream.graph.windowing import ProcessWindowFunction, WindowAssigner

if TYPE_CHECKING:
    from epochstream.api.datastream import DataStream, KeyedStream

__all__ = ["ConnectedStreams", "IntervalJoin", "JoinFunction", "JoinedStreams"]


def _check_same_pipeline(a: Any, b: Any, what: str) -> None:
    from epochstream.api.datastream import DataStream, KeyedStream

    if not isinstance(b, DataStream | KeyedStream) or b._env is not a._env:
        raise ConfigurationError(f"{what} takes a stream of the same Environment")
    if b._graph is not a._graph:
        raise ConfigurationError(f"{what} takes streams of the same (unexecuted) pipeline")


class ConnectedStreams:
    """Two streams read by one operator (see the module docstring).

    Example: ``a.connect(b).map(Tag())``
    """

    def __init__(self, first: Any, second: Any) -> None:
        _check_same_pipeline(first, second, "connect")
        self._first = first
        self._second = second

    @property
    def _keyed(self) -> bool:
        from epochstream.api.datastream import KeyedStream

        return isinstance(self._first, KeyedStream) and isinstance(self._second, KeyedStream)

    def key_by(
        self, first_key: Callable[[Any], Any], second_key: Callable[[Any], Any]
    ) -> ConnectedStreams:
        """Key both inputs (records with equal keys meet in one subtask).

        Example: ``a.connect(b).key_by(lambda x: x.id, lambda y: y.id)``
        """
        if not callable(first_key) or not callable(second_key):
            raise ConfigurationError("ConnectedStreams.key_by needs two key selectors")
        return ConnectedStreams(self._first.key_by(first_key), self._second.key_by(second_key))

    def _add(self, kind: str, name: str, payload: Any) -> DataStream:
        from epochstream.api.datastream import DataStream, KeyedStream

        first, second = self._first, self._second
        if isinstance(first, KeyedStream) != isinstance(second, KeyedStream):
            raise ConfigurationError(
                "connect() needs both streams keyed (key_by on each) or neither"
            )
        t = first._add(kind, name, payload, [first._edge(), second._edge()])
        return DataStream(first._env, t)

    def map(
        self, fn: CoMapFunction | tuple[Callable[[Any], Any], Callable[[Any], Any]]
    ) -> DataStream:
        """``fn.map1`` per record of the first stream, ``fn.map2`` of the second.

        Example: ``a.connect(b).map(Tag())``
        """
        if not isinstance(fn, CoMapFunction) and not _pair_of_callables(fn):
            raise ConfigurationError("ConnectedStreams.map needs an es.CoMapFunction")
        return self._add("co_map", "co-map", fn)

    def flat_map(
        self, fn: CoFlatMapFunction | tuple[Callable[[Any], Any], Callable[[Any], Any]]
    ) -> DataStream:
        """``fn.flat_map1`` / ``fn.flat_map2``: any number of outputs per record."""
        if not isinstance(fn, CoFlatMapFunction) and not _pair_of_callables(fn):
            raise ConfigurationError("ConnectedStreams.flat_map needs an es.CoFlatMapFunction")
        return self._add("co_flat_map", "co-flat-map", fn)

    def process(self, fn: CoProcessFunction | KeyedCoProcessFunction) -> DataStream:
        """A CoProcessFunction, or a KeyedCoProcessFunction when both sides are keyed.

        Example: ``a.key_by(k).connect(b.key_by(k)).process(Enrich())``
        """
        if isinstance(fn, KeyedCoProcessFunction):
            if not self._keyed:
                raise ConfigurationError(
                    "a KeyedCoProcessFunction needs both connected streams keyed"
                )
        elif not isinstance(fn, CoProcessFunction):
            raise ConfigurationError(
                "ConnectedStreams.process needs an es.CoProcessFunction or es.KeyedCoProcessFunction"
            )
        return self._add("co_process", f"co-process({type(fn).__name__})", fn)


def _pair_of_callables(fn: Any) -> bool:
    return isinstance(fn, tuple) and len(fn) == 2 and all(callable(f) for f in fn)


class JoinFunction(Function):
    """``join(left, right)`` for one pair of a window join (a plain callable works too).

    Example::

        class Pair(es.JoinFunction):
            def join(self, left, right):
                return (left, right)
    """

    def join(self, left: Any, right: Any) -> Any:
        """The output for one pair."""
        raise NotImplementedError


class JoinedStreams:
    """``a.join(b)``: continue with ``where``, ``equal_to``, ``window``, ``apply``.

    Example: ``a.join(b).where(k1).equal_to(k2).window(es.TumblingEventTimeWindows.of(5_000)).apply(fn)``"""

    def __init__(self, left: DataStream, right: DataStream) -> None:
        _check_same_pipeline(left, right, "join")
        self._left = left
        self._right = right
        self._left_key: Callable[[Any], Any] | None = None
        self._right_key: Callable[[Any], Any] | None = None
        self._assigner: WindowAssigner | None = None

    def where(self, key: Callable[[Any], Any]) -> JoinedStreams:
        """The left stream's key. Example: ``.where(lambda o: o["id"])``"""
        if not callable(key):
            raise ConfigurationError("where() needs a key selector")
        self._left_key = key
        return self

    def equal_to(self, key: Callable[[Any], Any]) -> JoinedStreams:
        """The right stream's key. Example: ``.equal_to(lambda p: p["order"])``"""
        if not callable(key):
            raise ConfigurationError("equal_to() needs a key selector")
        self._right_key = key
        return self

    def window(self, assigner: WindowAssigner) -> JoinedStreams:
        """The windows pairs must share. Example: ``.window(es.TumblingEventTimeWindows.of(60_000))``"""
        if not isinstance(assigner, WindowAssigner):
            raise ConfigurationError("window() needs a window assigner")
        self._assigner = assigner
        return self

    def apply(self, fn: Callable[[Any, Any], Any] | JoinFunction) -> DataStream:
        """``fn(left, right)`` for every pair with equal keys in the same window.

        Example: ``.apply(lambda o, p: (o["id"], p["amount"]))``
        """
        if self._left_key is None or self._right_key is None or self._assigner is None:
            raise ConfigurationError(
                "a window join needs where(), equal_to() and window() before apply()"
            )
        if not callable(fn) and not isinstance(fn, JoinFunction):
            raise ConfigurationError("apply() needs a callable or an es.JoinFunction")
        left_key, right_key = self._left_key, self._right_key
        tagged_left = self._left.map(_Tag(0)).name("join-left")
        tagged_right = self._right.map(_Tag(1)).name("join-right")
        return (
            tagged_left.union(tagged_right)
            .key_by(_TaggedKey(left_key, right_key))
            .window(self._assigner)
            .process(_JoinWindow(fn))
        )


class _Tag:
    """Marks a record with its side of the join."""

    def __init__(self, side: int) -> None:
        self.side = side

    def __call__(self, record: Any) -> tuple[int, Any]:
        return (self.side, record)


class _TaggedKey:
    """The join key of a tagged record: its side's key selector."""

    def __init__(self, left: Callable[[Any], Any], right: Callable[[Any], Any]) -> None:
        self.selectors = (left, right)

    def __call__(self, tagged: tuple[int, Any]) -> Any:
        return self.selectors[tagged[0]](tagged[1])


class _JoinWindow(ProcessWindowFunction):
    """Every left-right pair of a window (nested loop), in arrival order."""

    def __init__(self, fn: Any) -> None:
        self.function = fn

    def open(self, ctx: Any) -> None:
        if isinstance(self.function, Function):
            self.function.open(ctx)

    def close(self) -> None:
        if isinstance(self.function, Function):
            self.function.close()

    def process(self, key: Any, ctx: Any, elements: Any, out: Collector) -> None:
        left = [r for side, r in elements if side == 0]
        right = [r for side, r in elements if side == 1]
        fn = self.function.join if isinstance(self.function, JoinFunction) else self.function
        for a in left:
            for b in right:
                out.collect(fn(a, b))


class IntervalJoin:
    """``left.interval_join(right)``: continue with ``between(lower, upper)`` and ``process``.

    Example: ``a.key_by(k).interval_join(b.key_by(k)).between(-2_000, 1_000).process(fn)``"""

    def __init__(self, left: KeyedStream, right: KeyedStream) -> None:
        from epochstream.api.datastream import KeyedStream

        if not isinstance(right, KeyedStream):
            raise ConfigurationError(
                "interval_join needs a KeyedStream (key_by the other side too)"
            )
        _check_same_pipeline(left, right, "interval_join")
        self._left = left
        self._right = right
        self._bounds: tuple[int, int] | None = None
        self._lower_exclusive = False
        self._upper_exclusive = False

    def between(self, lower: Any, upper: Any) -> IntervalJoin:
        """Right records with ``left.ts + lower <= right.ts <= left.ts + upper`` (ms or
        timedelta; ``lower`` may be negative). Example: ``.between(-5_000, 5_000)``
        """
        lo = to_signed_millis(lower, "lower bound")
        hi = to_signed_millis(upper, "upper bound")
        if lo > hi:
            raise ConfigurationError(
                f"interval join lower bound {lo} is above the upper bound {hi}"
            )
        self._bounds = (lo, hi)
        return self

    def lower_bound_exclusive(self) -> IntervalJoin:
        """Leave out right records exactly ``lower`` from a left one (``<`` instead of ``<=``).

        Example: ``.between(-5_000, 5_000).lower_bound_exclusive().process(fn)``
        """
        self._lower_exclusive = True
        return self

    def upper_bound_exclusive(self) -> IntervalJoin:
        """Leave out right records exactly ``upper`` from a left one (``<`` instead of ``<=``).

        Example: ``.between(0, 60_000).upper_bound_exclusive().process(fn)``
        """
        self._upper_exclusive = True
        return self

    def process(self, fn: ProcessJoinFunction) -> DataStream:
        """Call ``fn.process_element(left, right, ctx, out)`` for every pair."""
        from epochstream.api.datastream import DataStream

        if self._bounds is None:
            raise ConfigurationError(
                "an interval join needs between(lower, upper) before process()"
            )
        if not isinstance(fn, ProcessJoinFunction):
            raise ConfigurationError("interval join process() needs an es.ProcessJoinFunction")
        # Timestamps are int ms, so an exclusive bound is the inclusive one a ms inside it
        # (what Flink's IntervalJoinOperator does; between(0, 0) with one exclusive bound
        # then joins nothing).
        lower = self._bounds[0] + (1 if self._lower_exclusive else 0)
        upper = self._bounds[1] - (1 if self._upper_exclusive else 0)
        spec = IntervalJoinSpec(lower, upper, fn)
        left = self._left
        t = left._add(
            "interval_join",
            f"interval-join({type(fn).__name__})",
            spec,
            [left._edge(), self._right._edge()],
        )
        return DataStream(left._env, t)
