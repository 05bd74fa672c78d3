"""Stream operators driven directly: a fake emit, real keyed-state backends, no task.

The operator builder and the backends are in ``operator_support``. This module: map,
flat_map and filter, user errors, keyed state without key_by, close, readers' snapshots.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from operator_support import MAX_P, Backends, add_pairs, first_field, make

import epochstream as es
from epochstream.core.clock import ManualClock
from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.exceptions import ConfigurationError, UserFunctionError
from epochstream.state.backends.base import KeyedBackendContext
from epochstream.state.backends.heap.backend import HeapKeyedStateBackend


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
    op, _ = make("reduce", add_pairs, key=first_field, backend=backend)
    op.process_batch([("a", 1)], None)
    local_dir = str(tmp_path / "local" / "op-1")
    assert os.path.isdir(local_dir)
    op.close()
    assert not os.path.exists(local_dir)


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
