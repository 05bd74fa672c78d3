"""Process functions driven directly: keyed state and timers (processing and event time),
errors in them, side outputs and timestamps, and keyed operators taking the keys that
travelled with the batch."""

from __future__ import annotations

import operator
from typing import Any

import pytest
from operator_support import MAX_P, Backends, Emitted, first_field, make

import epochstream as es
from epochstream.core.clock import ManualClock
from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.exceptions import UserFunctionError
from epochstream.runtime.operators import KeyedProcessOperator
from epochstream.runtime.timers import TIMERS_STATE
from epochstream.state.backends.base import KeyedBackendContext
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.handles import OperatorRestore

# ---------------------------------------------------------------- keyed process + timers


class TimedCount(es.KeyedProcessFunction):
    """Counts records per key; each record sets a timer at ``value[1]`` that emits the count."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: tuple[str, int], ctx: Any, out: Any) -> None:
        self.count.update(self.count.value() + 1)
        ctx.timer_service().register_processing_time_timer(value[1])
        out.collect(("seen", ctx.current_key, self.count.value()))

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        out.collect(("timer", ctx.current_key, timestamp, self.count.value()))


def test_keyed_process_keeps_state_per_key_and_fires_due_timers(backends: Backends) -> None:
    backend = backends.create()
    op, out = make("process", TimedCount(), key=first_field, backend=backend)
    assert isinstance(op, KeyedProcessOperator)
    op.process_batch([("a", 105), ("b", 101), ("a", 105), ("a", 103)], None)
    assert out.batches == [[("seen", "a", 1), ("seen", "b", 1), ("seen", "a", 2), ("seen", "a", 3)]]
    assert op.next_processing_time() == 101
    op.on_processing_time(100)
    assert len(out.batches) == 1, "nothing is due yet"
    op.on_processing_time(104)
    assert out.batches[1] == [("timer", "b", 101, 1), ("timer", "a", 103, 3)]
    assert out.timestamps[1] is None, "processing-time timer output has no timestamp"
    op.on_processing_time(104)
    assert len(out.batches) == 2, "a fired timer does not fire again"
    op.on_processing_time(1_000)
    assert out.batches[2] == [("timer", "a", 105, 3)], "a duplicate registration fires once"
    assert op.next_processing_time() is None


def test_timers_are_keyed_state_and_fire_after_a_restore(backends: Backends) -> None:
    first, _ = make("process", TimedCount(), key=first_field, backend=backends.create())
    first.process_batch([("a", 200), ("b", 300)], None)
    parts = first.snapshot(backends.target(1))
    assert parts.keyed is not None
    handle = parts.keyed.run()
    assert handle is not None
    assert TIMERS_STATE in handle.states  # type: ignore[attr-defined]
    second, out = make(
        "process", TimedCount(), key=first_field, backend=backends.create("second"), open_now=False
    )
    second.initialize_state(OperatorRestore(keyed=[handle]), checkpoint_id=1)
    second.open()
    assert isinstance(second, KeyedProcessOperator)
    second.on_processing_time(250)
    assert out.records == [("timer", "a", 200, 1)]


def test_on_timer_error_names_the_operator_and_the_timestamp() -> None:
    class Fails(es.KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any, out: Any) -> None:
            ctx.timer_service().register_processing_time_timer(42)

        def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
            raise RuntimeError("timer broke")

    backend = HeapStateBackend().create(
        KeyedBackendContext("op", 0, MAX_P, range(0, MAX_P), ManualClock(), "")
    )
    op, out = make("process", Fails(), key=lambda v: v, backend=backend)
    assert isinstance(op, KeyedProcessOperator)
    op.process_batch(["k"], None)
    with pytest.raises(UserFunctionError) as info:
        op.on_processing_time(50)
    assert info.value.operator == "process (1/1) on_timer"
    assert info.value.record_repr == "42"
    assert out.batches == []


def test_process_element_error_names_the_record() -> None:
    class Fails(es.KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any, out: Any) -> None:
            out.collect(value)
            if value == "bad":
                raise KeyError(value)

    backend = HeapStateBackend().create(
        KeyedBackendContext("op", 0, MAX_P, range(0, MAX_P), ManualClock(), "")
    )
    op, out = make("process", Fails(), key=lambda v: v, backend=backend)
    with pytest.raises(UserFunctionError, match="process \\(1/1\\) failed on record 'bad'"):
        op.process_batch(["ok", "bad"], None)
    assert out.batches == []


# ---------------------------------------------------------------- event time in process functions

NEGATIVE = es.OutputTag("negative")


class Split(es.ProcessFunction):
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        if value < 0:
            ctx.output(NEGATIVE, (value, ctx.timestamp()))
        else:
            out.collect((value, ctx.timestamp()))


def test_process_function_side_outputs_and_timestamps() -> None:
    op, out = make("process", Split())
    side = Emitted()
    op.side_outputs[NEGATIVE.name] = side
    op.process_batch([1, -2, 3], [10, 20, 30])
    assert out.records == [(1, 10), (3, 30)] and out.timestamps == [[10, 30]]
    assert side.records == [(-2, 20)] and side.timestamps == [[20]]
    op.process_batch([-5], None)
    assert side.records[-1] == (-5, None) and side.timestamps[-1] is None
    unread = es.OutputTag("nobody-reads-this")

    class Elsewhere(es.ProcessFunction):
        def process_element(self, value: Any, ctx: Any, out: Any) -> None:
            ctx.output(unread, value)

    dropped, nothing = make("process", Elsewhere())
    dropped.process_batch([1], [1])
    assert nothing.records == [], "a side output nobody reads is dropped"


class Expire(es.KeyedProcessFunction):
    """An event-time timer 100 ms after each key's first record."""

    def open(self, ctx: Any) -> None:
        self.first = ctx.get_state(ValueStateDescriptor("first"))

    def process_element(self, value: tuple[str, int], ctx: Any, out: Any) -> None:
        if self.first.value() is None:
            self.first.update(ctx.timestamp())
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + 100)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        assert ctx.time_domain() is es.TimeDomain.EVENT_TIME
        assert ctx.timer_service().current_watermark() >= timestamp
        out.collect((ctx.current_key, self.first.value(), timestamp))


def test_event_time_timers_fire_as_the_watermark_passes_them(backends: Backends) -> None:
    op, out = make("process", Expire(), key=first_field, backend=backends.create())
    forwarded = out.watermarks
    op.process_batch([("a", 0), ("b", 0), ("a", 0)], [1_000, 1_050, 1_200])
    op.process_watermark(1_099)
    assert out.records == [] and forwarded == [1_099]
    op.process_watermark(1_150)
    assert out.records == [("a", 1_000, 1_100), ("b", 1_050, 1_150)]
    assert out.timestamps[-1] == [1_100, 1_150], "timer outputs carry the timer's time"
    assert forwarded == [1_099, 1_150], "the watermark goes on after the timers it fired"


# ---------------------------------------------------------------- keys that travelled with the batch


class KeyAndTime(es.KeyedProcessFunction):
    """Emits (current key, value, timestamp) per record."""

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect((ctx.current_key, value, ctx.timestamp()))


def _never_called(record: Any) -> Any:
    raise AssertionError("the operator ran its key selector on travelled keys")


@pytest.mark.parametrize("timed", [False, True])
def test_keyed_operators_take_the_travelled_keys_without_the_selector(
    backends: Backends, timed: bool
) -> None:
    timestamps = [5, 6, 7] if timed else None
    process, out = make("process", KeyAndTime(), key=_never_called, backend=backends.create("p"))
    process.process_keyed(["a", "b", "c"], ["k1", "k2", "k1"], timestamps)
    ts = timestamps or [None] * 3
    assert out.records == [("k1", "a", ts[0]), ("k2", "b", ts[1]), ("k1", "c", ts[2])]

    reduce, sums = make("reduce", operator.add, key=_never_called, backend=backends.create("r"))
    reduce.process_keyed([1, 2, 3], ["x", "y", "x"], timestamps)
    assert sums.records == [1, 2, 4] and sums.timestamps == [timestamps]
