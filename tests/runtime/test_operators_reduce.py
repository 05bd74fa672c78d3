"""The reduce operator driven directly: running values in the keyed backend, snapshots
and restores, the keys it declares written, checkpoint notifications."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from operator_support import MAX_P, Backends, add_pairs, first_field, make

import epochstream as es
from epochstream.core.clock import ManualClock
from epochstream.exceptions import UserFunctionError
from epochstream.runtime.operators import ReduceOperator
from epochstream.state.backends.base import KeyedBackendContext
from epochstream.state.backends.heap.backend import HeapKeyedStateBackend, HeapStateBackend
from epochstream.state.handles import KeyedStateHandle, OperatorRestore

# ---------------------------------------------------------------- reduce


def _restored(backends: Backends, handle: KeyedStateHandle | None, uid: str) -> Any:
    fresh = backends.create(uid)
    assert handle is not None
    fresh.restore([handle], checkpoint_id=1, owned=False)
    return fresh


def test_reduce_emits_running_values_and_keeps_them_in_the_backend(backends: Backends) -> None:
    backend = backends.create()
    op, out = make("reduce", add_pairs, key=first_field, backend=backend)
    op.process_batch([("a", 1), ("b", 2), ("a", 3)], None)
    op.process_batch([("a", 10)], None)
    assert out.batches == [[("a", 1), ("b", 2), ("a", 4)], [("a", 14)]]
    table = backend.value_table(ReduceOperator.STATE)
    assert table.get("a") == ("a", 14) and table.get("b") == ("b", 2)
    assert sorted(backend.keys(ReduceOperator.STATE.name)) == ["a", "b"]


def test_reduce_snapshot_contains_the_keys_of_every_batch(backends: Backends) -> None:
    backend = backends.create()
    op, _ = make("reduce", add_pairs, key=first_field, backend=backend)
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

    first, _ = make("reduce", Sum(), key=first_field, backend=backends.create())
    first.process_batch([("k", 1), ("k", 2)], None)
    parts = first.snapshot(backends.target(1))
    assert parts.keyed is not None
    handle = parts.keyed.run()
    assert handle is not None
    second_backend = backends.create("second")
    second, out = make("reduce", Sum(), key=first_field, backend=second_backend, open_now=False)
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
        return add_pairs(a, b)

    op, _ = make("reduce", boom_on_x, key=first_field, backend=backend)
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
