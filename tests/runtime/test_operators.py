"""Stream operators driven directly: a fake emit, real keyed-state backends, no task."""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import epochstream as es
from epochstream.checkpoint.filesystems import storage_fs
from epochstream.exceptions import ConfigurationError, UserFunctionError
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.runtime.clock import ManualClock
from epochstream.runtime.operators import (
    KeyedProcessOperator,
    Operator,
    OperatorContext,
    ReduceOperator,
    create_operator,
)
from epochstream.runtime.timers import TIMERS_STATE
from epochstream.state.backends.base import (
    KeyedBackendContext,
    KeyedStateBackend,
    SnapshotTarget,
)
from epochstream.state.backends.heap import HeapKeyedStateBackend, HeapStateBackend
from epochstream.state.backends.rocksdb import RocksDBStateBackend
from epochstream.state.descriptors import ValueStateDescriptor
from epochstream.state.handles import KeyedStateHandle, OperatorRestore
from epochstream.state.operator import OperatorStateStore

MAX_P = 128


class Emitted:
    """Fake ``emit``: records every batch an operator hands on."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.timestamps: list[list[Any] | None] = []

    def __call__(self, batch: list[Any], timestamps: list[Any] | None = None) -> None:
        self.batches.append(list(batch))
        self.timestamps.append(None if timestamps is None else list(timestamps))

    @property
    def records(self) -> list[Any]:
        return [r for b in self.batches for r in b]


class Backends:
    """Creates keyed backends of one kind (heap or RocksDB) under ``root``."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.clock = ManualClock(start=1_000.0)
        self.fs = storage_fs(str(root))
        self._made = 0

    def create(self, uid: str = "op") -> KeyedStateBackend:
        self._made += 1
        config = (
            HeapStateBackend()
            if self.kind == "heap"
            else RocksDBStateBackend(block_cache_mb=8, write_buffer_mb=4)
        )
        return config.create(
            KeyedBackendContext(
                operator_uid=uid,
                subtask=0,
                max_parallelism=MAX_P,
                key_group_range=range(0, MAX_P),
                clock=self.clock,
                local_dir=str(self.root / "local" / f"{uid}-{self._made}"),
            )
        )

    def target(self, checkpoint_id: int, base: int | None = None) -> SnapshotTarget:
        return SnapshotTarget(
            fs=self.fs,
            checkpoint_id=checkpoint_id,
            directory=str(self.root / "job" / f"chk-{checkpoint_id}"),
            shared_dir=str(self.root / "job" / "shared"),
            name="op-0",
            base_checkpoint_id=base,
        )


@pytest.fixture(params=["heap", "rocksdb"])
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Backends:
    return Backends(request.param, tmp_path)


def make(
    kind: str,
    payload: Any,
    *,
    key: Callable[[Any], Any] | None = None,
    backend: KeyedStateBackend | None = None,
    open_now: bool = True,
) -> tuple[Operator, Emitted]:
    """An operator of ``kind`` with a recording emit, opened unless ``open_now`` is False."""
    spec = OperatorSpec(uid=f"{kind}-1", name=kind, kind=kind, payload=payload, key_selector=key)
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=MAX_P,
        attempt=0,
        job_id="job",
        task_name=f"{kind} (1/1)",
        operator_state=OperatorStateStore(),
        keyed_backend=backend,
        checkpointing=True,
    )
    op = create_operator(spec, ctx)
    out = Emitted()
    op.emit = out
    if open_now:
        op.open()
    return op, out


def _explode_on_13(value: int) -> Any:
    if value == 13:
        raise ValueError("thirteen is unlucky")
    return value


# ---------------------------------------------------------------- map / flat_map / filter


class Lifecycle(es.MapFunction):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.ctx: Any = None

    def open(self, ctx: Any) -> None:
        self.calls.append("open")
        self.ctx = ctx

    def map(self, value: Any) -> Any:
        return value * 10

    def close(self) -> None:
        self.calls.append("close")


class Words(es.FlatMapFunction):
    def flat_map(self, value: str) -> Iterable[str]:
        return value.split()


class Even(es.FilterFunction):
    def filter(self, value: int) -> bool:
        return value % 2 == 0


def test_map_plain_function_emits_one_result_per_record() -> None:
    op, out = make("map", lambda i: i + 1)
    op.process_batch([1, 2, 3], None)
    op.process_batch([], None)
    assert out.batches == [[2, 3, 4], []]


def test_map_rich_function_is_opened_with_the_context_and_closed() -> None:
    fn = Lifecycle()
    op, out = make("map", fn)
    op.process_batch([1, 2], None)
    op.close()
    assert out.records == [10, 20]
    assert fn.calls == ["open", "close"]
    assert fn.ctx.task_name == "map (1/1)" and fn.ctx.subtask_index == 0
    assert fn.ctx.checkpointing is True


def test_flat_map_emits_every_element_and_skips_empty_results() -> None:
    op, out = make("flat_map", str.split)
    op.process_batch(["a b", "", "c"], None)
    op.process_batch(["", "  "], None)
    assert out.batches == [["a", "b", "c"]], "an all-empty result is not emitted"
    rich, rich_out = make("flat_map", Words())
    rich.process_batch(["x y"], None)
    assert rich_out.records == ["x", "y"]


def test_filter_keeps_matching_records_with_plain_and_rich_functions() -> None:
    op, out = make("filter", lambda i: i > 2)
    op.process_batch([1, 2, 3, 4], None)
    op.process_batch([0, 1], None)
    assert out.batches == [[3, 4]], "a batch with nothing kept is not emitted"
    rich, rich_out = make("filter", Even())
    rich.process_batch([1, 2, 3, 4], None)
    assert rich_out.records == [2, 4]


class RichExploding(es.MapFunction, es.FlatMapFunction, es.FilterFunction):
    def map(self, value: int) -> Any:
        return _explode_on_13(value)

    def flat_map(self, value: int) -> Iterable[Any]:
        return [_explode_on_13(value)]

    def filter(self, value: int) -> bool:
        return bool(_explode_on_13(value))


@pytest.mark.parametrize("kind", ["map", "flat_map", "filter"])
@pytest.mark.parametrize("rich", [False, True], ids=["plain", "rich"])
def test_user_error_names_operator_and_record(kind: str, rich: bool) -> None:
    plain: dict[str, Callable[[int], Any]] = {
        "map": _explode_on_13,
        "flat_map": lambda i: [_explode_on_13(i)],
        "filter": lambda i: bool(_explode_on_13(i)),
    }
    op, out = make(kind, RichExploding() if rich else plain[kind])
    with pytest.raises(UserFunctionError) as info:
        op.process_batch([11, 12, 13, 14], None)
    err = info.value
    assert err.operator == f"{kind} (1/1)"
    assert err.record_repr == "13"
    assert f"{kind} (1/1) failed on record 13" in str(err)
    assert "ValueError: thirteen is unlucky" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert not err.suppress_restarts
    assert out.batches == [], "a failing batch emits nothing"


def test_data_error_from_a_user_function_suppresses_restarts() -> None:
    def reject(i: int) -> int:
        raise es.DataError(f"bad row {i}")

    op, _ = make("map", reject)
    with pytest.raises(UserFunctionError) as info:
        op.process_batch([7], None)
    assert info.value.suppress_restarts
    assert "bad row 7" in str(info.value)


def test_map_on_a_keyed_stream_sets_the_current_key(backends: Backends) -> None:
    class CountPerKey(es.MapFunction):
        def open(self, ctx: Any) -> None:
            self.ctx = ctx
            self.count = ctx.get_state(ValueStateDescriptor("n", default=0))

        def map(self, value: tuple[str, int]) -> Any:
            self.count.update(self.count.value() + 1)
            return (self.ctx.current_key, self.count.value())

    backend = backends.create()
    op, out = make("map", CountPerKey(), key=lambda t: t[0], backend=backend)
    op.process_batch([("a", 1), ("b", 1), ("a", 2)], None)
    assert out.records == [("a", 1), ("b", 1), ("a", 2)]
    assert sorted(backend.keys("n")) == ["a", "b"]
    op.close()


def test_keyed_state_without_key_by_is_a_configuration_error() -> None:
    seen: list[Exception] = []

    class NeedsState(es.MapFunction):
        def open(self, ctx: Any) -> None:
            for access in (
                lambda: ctx.get_state(ValueStateDescriptor("n")),
                lambda: ctx.timer_service(),
            ):
                try:
                    access()
                except ConfigurationError as err:
                    seen.append(err)

        def map(self, value: Any) -> Any:
            return value

    make("map", NeedsState())
    assert len(seen) == 2
    assert "only available after key_by" in str(seen[0])
    assert "timers exist only in keyed process functions" in str(seen[1])


def test_unknown_operator_kind_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no operator for kind 'teleport'"):
        make("teleport", None, open_now=False)


# ---------------------------------------------------------------- reduce


def _add_pairs(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return (a[0], a[1] + b[1])


def _first(t: tuple[str, int]) -> str:
    return t[0]


def _restored(backends: Backends, handle: KeyedStateHandle | None, uid: str) -> Any:
    fresh = backends.create(uid)
    assert handle is not None
    fresh.restore([handle], checkpoint_id=1, owned=False)
    return fresh


def test_reduce_emits_running_values_and_keeps_them_in_the_backend(backends: Backends) -> None:
    backend = backends.create()
    op, out = make("reduce", _add_pairs, key=_first, backend=backend)
    op.process_batch([("a", 1), ("b", 2), ("a", 3)], None)
    op.process_batch([("a", 10)], None)
    assert out.batches == [[("a", 1), ("b", 2), ("a", 4)], [("a", 14)]]
    table = backend.value_table(ReduceOperator.STATE)
    assert table.get("a") == ("a", 14) and table.get("b") == ("b", 2)
    assert sorted(backend.keys(ReduceOperator.STATE.name)) == ["a", "b"]


def test_reduce_snapshot_contains_the_keys_of_every_batch(backends: Backends) -> None:
    backend = backends.create()
    op, _ = make("reduce", _add_pairs, key=_first, backend=backend)
    op.process_batch([("a", 1), ("b", 2)], None)
    op.process_batch([("a", 3), ("c", 5)], None)
    parts = op.snapshot(backends.target(1))
    assert parts.keyed is not None
    handle = parts.keyed.run()
    restored = _restored(backends, handle, "restored")
    table = restored.value_table(ReduceOperator.STATE)
    assert dict(table.items()) == {"a": ("a", 4), "b": ("b", 2), "c": ("c", 5)}


def test_reduce_rich_function_and_values_continue_after_a_restore(backends: Backends) -> None:
    class Sum(es.ReduceFunction):
        def reduce(self, a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
            return (a[0], a[1] + b[1])

    first, _ = make("reduce", Sum(), key=_first, backend=backends.create())
    first.process_batch([("k", 1), ("k", 2)], None)
    parts = first.snapshot(backends.target(1))
    assert parts.keyed is not None
    handle = parts.keyed.run()
    assert handle is not None
    second_backend = backends.create("second")
    second, out = make("reduce", Sum(), key=_first, backend=second_backend, open_now=False)
    second.initialize_state(OperatorRestore(keyed=[handle]), checkpoint_id=1)
    second.open()
    second.process_batch([("k", 4)], None)
    assert out.records == [("k", 7)]


class SpyTable:
    """Wraps a value table and records every ``touched`` call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.get = inner.get
        self.touched_calls: list[list[Any]] = []

    def __setitem__(self, key: Any, value: Any) -> None:
        self.inner[key] = value

    def touched(self, keys: Iterable[Any]) -> None:
        keys = list(keys)
        self.touched_calls.append(keys)
        self.inner.touched(keys)


def test_reduce_declares_the_written_keys_once_per_batch_even_when_it_fails() -> None:
    backend = HeapStateBackend().create(
        KeyedBackendContext("op", 0, MAX_P, range(0, MAX_P), ManualClock(), "")
    )

    def boom_on_x(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
        if b[0] == "x":
            raise ValueError("no x")
        return _add_pairs(a, b)

    op, _ = make("reduce", boom_on_x, key=_first, backend=backend)
    assert isinstance(op, ReduceOperator)
    spy = SpyTable(op._table)
    op._table = spy
    op.process_batch([("a", 1), ("b", 1), ("a", 1)], None)
    with pytest.raises(UserFunctionError, match=r"failed on record \('x', 2\)"):
        op.process_batch([("x", 1), ("y", 1), ("x", 2)], None)
    assert spy.touched_calls == [["a", "b", "a"], ["x", "y", "x"]]


class ListeningReduce(es.ReduceFunction, es.CheckpointListener):
    def __init__(self) -> None:
        self.completed: list[int] = []
        self.aborted: list[int] = []

    def reduce(self, a: Any, b: Any) -> Any:
        return a + b

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.aborted.append(checkpoint_id)


def test_checkpoint_notifications_reach_listener_functions_and_the_backend() -> None:
    notified: list[int] = []

    class SpyBackend(HeapKeyedStateBackend):
        def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
            notified.append(checkpoint_id)
            super().notify_checkpoint_complete(checkpoint_id)

    backend = SpyBackend(KeyedBackendContext("op", 0, MAX_P, range(0, MAX_P), ManualClock(), ""))
    fn = ListeningReduce()
    op, _ = make("reduce", fn, key=lambda i: i % 2, backend=backend)
    op.notify_checkpoint_complete(3)
    op.notify_checkpoint_aborted(4)
    assert fn.completed == [3] and fn.aborted == [4]
    assert notified == [3]
    plain, _ = make("map", lambda i: i)
    plain.notify_checkpoint_complete(3)  # a plain function is no listener: nothing to call


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
    op, out = make("process", TimedCount(), key=_first, backend=backend)
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
    first, _ = make("process", TimedCount(), key=_first, backend=backends.create())
    first.process_batch([("a", 200), ("b", 300)], None)
    parts = first.snapshot(backends.target(1))
    assert parts.keyed is not None
    handle = parts.keyed.run()
    assert handle is not None
    assert TIMERS_STATE in handle.states  # type: ignore[attr-defined]
    second, out = make(
        "process", TimedCount(), key=_first, backend=backends.create("second"), open_now=False
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


# ---------------------------------------------------------------- close


def test_close_closes_the_function_and_disposes_the_keyed_backend() -> None:
    disposed: list[str] = []

    class SpyBackend(HeapKeyedStateBackend):
        def dispose(self) -> None:
            disposed.append("disposed")

    class FailingClose(es.ReduceFunction):
        def reduce(self, a: Any, b: Any) -> Any:
            return a + b

        def close(self) -> None:
            raise RuntimeError("close failed")

    backend = SpyBackend(KeyedBackendContext("op", 0, MAX_P, range(0, MAX_P), ManualClock(), ""))
    op, _ = make("reduce", FailingClose(), key=lambda i: i, backend=backend)
    with pytest.raises(RuntimeError, match="close failed"):
        op.close()
    assert disposed == ["disposed"], "the backend is disposed even when the function's close fails"


def test_close_of_a_rocksdb_keyed_operator_removes_its_local_database(tmp_path: Path) -> None:
    backends = Backends("rocksdb", tmp_path)
    backend = backends.create()
    op, _ = make("reduce", _add_pairs, key=_first, backend=backend)
    op.process_batch([("a", 1)], None)
    local_dir = str(tmp_path / "local" / "op-1")
    assert os.path.isdir(local_dir)
    op.close()
    assert not os.path.exists(local_dir)


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
    op.side_emits[NEGATIVE.name] = side
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
    op, out = make("process", Expire(), key=_first, backend=backends.create())
    forwarded: list[int] = []
    op.emit_watermark = forwarded.append
    op.process_batch([("a", 0), ("b", 0), ("a", 0)], [1_000, 1_050, 1_200])
    op.process_watermark(1_099)
    assert out.records == [] and forwarded == [1_099]
    op.process_watermark(1_150)
    assert out.records == [("a", 1_000, 1_100), ("b", 1_050, 1_150)]
    assert out.timestamps[-1] == [1_100, 1_150], "timer outputs carry the timer's time"
    assert forwarded == [1_099, 1_150], "the watermark goes on after the timers it fired"


def test_reader_snapshot_takes_the_checkpoint_id_or_not() -> None:
    """Readers may define ``snapshot(self, checkpoint_id)`` or the older ``snapshot(self)``."""
    from epochstream.runtime.operators.connectors import _reader_snapshot

    class WithId:
        def snapshot(self, checkpoint_id: int) -> list[Any]:
            return [("with", checkpoint_id)]

    class WithoutId:
        def snapshot(self) -> list[Any]:
            return ["without"]

    assert _reader_snapshot(WithId())(7) == [("with", 7)]  # type: ignore[arg-type]
    assert _reader_snapshot(WithoutId())(7) == ["without"]  # type: ignore[arg-type]


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
