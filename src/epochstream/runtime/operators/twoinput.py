"""Two-input operators: connected streams (co-map, co-flat-map, co-process, keyed
co-process) and the interval join.

The task hands each batch to ``process_input(index, records, timestamps)`` with the
input it came from (0: the first stream, 1: the second). Barriers align and
watermarks combine over the channels of both inputs exactly as for a union: the
operator's watermark is the minimum of both inputs'.

Example::

    op = CoMapOperator(spec, ctx)        # spec.payload is a CoMapFunction
    op.open()
    op.process_input(1, ["b"], None)     # map2("b")
"""

from __future__ import annotations

from typing import Any

from epochstream.core.functions import CoFlatMapFunction, CoMapFunction
from epochstream.core.state_descriptors import MapStateDescriptor
from epochstream.core.time import TimeDomain
from epochstream.exceptions import UserFunctionError
from epochstream.runtime.operators.base import Operator
from epochstream.runtime.operators.collect import OutputBuffer, SideOutputs
from epochstream.runtime.operators.process import UserTimersOperator

__all__ = [
    "CoFlatMapOperator",
    "CoMapOperator",
    "CoProcessOperator",
    "IntervalJoinOperator",
    "KeyedCoProcessOperator",
    "TwoInputOperator",
]


class TwoInputOperator(Operator):
    """Base of operators with two inputs."""

    def process_input(self, index: int, records: list[Any], timestamps: list[Any] | None) -> None:
        """A batch of input ``index`` (0 or 1)."""
        raise NotImplementedError

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        raise TypeError(f"{type(self).__name__} takes batches through process_input")


class CoMapOperator(TwoInputOperator):
    """``map1`` / ``map2`` per record; outputs keep their input's timestamp."""

    def open(self) -> None:
        super().open()
        fn = self.function
        if isinstance(fn, CoMapFunction):
            self._fns = (self._keyed_fn(0, fn.map1), self._keyed_fn(1, fn.map2))
        else:
            self._fns = (self._keyed_fn(0, fn[0]), self._keyed_fn(1, fn[1]))

    def _keyed_fn(self, index: int, fn: Any) -> Any:
        selectors = self.spec.input_key_selectors
        if self.keyed is None or not selectors:
            return fn
        key_of, set_key = selectors[index], self.keyed.set_current_key

        def keyed(value: Any) -> Any:
            set_key(key_of(value))
            return fn(value)

        return keyed

    def process_input(self, index: int, records: list[Any], timestamps: list[Any] | None) -> None:
        fn = self._fns[index]
        out: list[Any] = []
        append = out.append
        x = None
        try:
            for x in records:
                append(fn(x))
        except Exception as exc:
            raise UserFunctionError(f"{self.ctx.task_name} input {index + 1}", x, exc) from exc
        self.output.collect(out, timestamps)


class CoFlatMapOperator(CoMapOperator):
    """``flat_map1`` / ``flat_map2`` per record; each output keeps its input's timestamp."""

    def open(self) -> None:
        Operator.open(self)
        fn = self.function
        if isinstance(fn, CoFlatMapFunction):
            self._fns = (self._keyed_fn(0, fn.flat_map1), self._keyed_fn(1, fn.flat_map2))
        else:
            self._fns = (self._keyed_fn(0, fn[0]), self._keyed_fn(1, fn[1]))

    def process_input(self, index: int, records: list[Any], timestamps: list[Any] | None) -> None:
        fn = self._fns[index]
        out: list[Any] = []
        out_ts: list[Any] = []
        x = None
        try:
            for i, x in enumerate(records):
                before = len(out)
                out.extend(fn(x))
                if timestamps is not None:
                    out_ts.extend([timestamps[i]] * (len(out) - before))
        except Exception as exc:
            raise UserFunctionError(f"{self.ctx.task_name} input {index + 1}", x, exc) from exc
        if out:
            self.output.collect(out, None if timestamps is None else out_ts)


class CoProcessOperator(UserTimersOperator, TwoInputOperator):
    """``process_element1`` / ``process_element2`` of a (Keyed)CoProcessFunction, with
    the record's key current and timers when keyed."""

    def open(self) -> None:
        self._open_outputs(timers=self.keyed is not None)
        super().open()
        fn = self.function
        self._process = (fn.process_element1, fn.process_element2)
        self._selectors = self.spec.input_key_selectors

    def process_input(self, index: int, records: list[Any], timestamps: list[Any] | None) -> None:
        out, side, ctx = self._out, self._side, self.ctx
        out.start(timed=timestamps is not None)
        collector = out.collector
        process = self._process[index]
        set_key = self.keyed.set_current_key if self.keyed is not None else None
        key_of = self._selectors[index] if set_key is not None and self._selectors else None
        x = None
        try:
            for i, x in enumerate(records):
                if key_of is not None:
                    set_key(key_of(x))  # type: ignore[misc]
                if timestamps is not None:
                    ctx._timestamp = out.ts = side.ts = timestamps[i]
                process(x, ctx, collector)
            ctx._timestamp = side.ts = None
        except Exception as exc:
            raise UserFunctionError(f"{ctx.task_name} input {index + 1}", x, exc) from exc
        out.flush(self.output)
        side.flush()


KeyedCoProcessOperator = CoProcessOperator


class _JoinContext:
    """What a ProcessJoinFunction sees for one pair."""

    __slots__ = ("_side", "left_ts", "right_ts")

    def __init__(self, side: SideOutputs) -> None:
        self._side = side
        self.left_ts = 0
        self.right_ts = 0

    def left_timestamp(self) -> int:
        """The left record's timestamp."""
        return self.left_ts

    def right_timestamp(self) -> int:
        """The right record's timestamp."""
        return self.right_ts

    def timestamp(self) -> int:
        """The output's timestamp: the larger of the two."""
        return max(self.left_ts, self.right_ts)

    def output(self, tag: Any, value: Any) -> None:
        """Emit ``value`` to a side output."""
        self._side.add(tag, value)


class IntervalJoinOperator(TwoInputOperator):
    """Joins each left record with the right records of the same key whose timestamp is
    within ``[left + lower, left + upper]`` (Flink's interval join).

    Each side keeps its records in keyed map state (timestamp -> records) until the
    watermark passes the last time a partner could still arrive; records at or below
    the watermark when they arrive are late and dropped. Outputs get the larger of the
    pair's timestamps.
    """

    def open(self) -> None:
        payload = self.function
        self._lower: int = payload.lower
        self._upper: int = payload.upper
        self._fn = payload.function
        assert self.keyed is not None
        self._buffers = (
            self.keyed.get_state(MapStateDescriptor("interval-join-left")),
            self.keyed.get_state(MapStateDescriptor("interval-join-right")),
        )
        self._out = OutputBuffer()
        self._side = SideOutputs(self.side_outputs)
        self._jctx = _JoinContext(self._side)
        self.create_timer_service(self._cleanup)
        if hasattr(self._fn, "open"):
            self._fn.open(self.ctx)
        selectors = self.spec.input_key_selectors
        assert selectors is not None, "an interval join reads two keyed streams"
        self._selectors = selectors

    def close(self) -> None:
        try:
            if hasattr(self._fn, "close"):
                self._fn.close()
        finally:
            super().close()

    def process_input(self, index: int, records: list[Any], timestamps: list[Any] | None) -> None:
        if timestamps is None:
            raise UserFunctionError(
                self.ctx.task_name,
                records[0] if records else None,
                ValueError("an interval join needs event timestamps on both inputs"),
            )
        out = self._out
        out.start(timed=True)
        assert self.keyed is not None and self.timers is not None
        set_key = self.keyed.set_current_key
        key_of = self._selectors[index]
        watermark = self.timers.current_watermark
        x = None
        try:
            for x, ts in zip(records, timestamps, strict=True):
                if ts is None:
                    raise ValueError("the record has no timestamp")
                if ts < watermark:
                    self.counters.late_records_dropped += 1  # a partner may already be gone
                    continue
                set_key(key_of(x))
                self._add(index, x, ts)
        except Exception as exc:
            raise UserFunctionError(f"{self.ctx.task_name} input {index + 1}", x, exc) from exc
        out.flush(self.output)
        self._side.flush()

    def _add(self, index: int, x: Any, ts: int) -> None:
        own, other = self._buffers[index], self._buffers[1 - index]
        stored = own.get(ts)
        own.put(ts, [x] if stored is None else [*stored, x])
        lower, upper = self._lower, self._upper
        if index == 0:  # right partners within [ts + lower, ts + upper]
            lo, hi = ts + lower, ts + upper
        else:  # left partners: left + lower <= ts <= left + upper
            lo, hi = ts - upper, ts - lower
        for other_ts, partners in other.items():
            if lo <= other_ts <= hi:
                for partner in partners:
                    if index == 0:
                        self._emit_pair(x, ts, partner, other_ts)
                    else:
                        self._emit_pair(partner, other_ts, x, ts)
        # Keep the record until no partner can arrive (the watermark passed that time).
        cleanup = ts + upper if index == 0 else ts - lower
        assert self.timers is not None
        self.timers.register_event_time_timer(index, max(cleanup, ts))

    def _emit_pair(self, left: Any, left_ts: int, right: Any, right_ts: int) -> None:
        jctx = self._jctx
        jctx.left_ts, jctx.right_ts = left_ts, right_ts
        self._out.ts = self._side.ts = max(left_ts, right_ts)
        self._fn.process_element(left, right, jctx, self._out.collector)

    def _cleanup(self, domain: TimeDomain, time: int, key: Any, side: Any) -> None:
        buffer = self._buffers[side]
        # Records of ``side`` whose cleanup time is ``time``: those stamped at it, or
        # ``upper``/``-lower`` before it.
        stamp = time - self._upper if side == 0 else time + self._lower
        for ts in (stamp, time):
            if buffer.contains(ts):
                cleanup = ts + self._upper if side == 0 else ts - self._lower
                if max(cleanup, ts) == time:
                    buffer.remove(ts)
