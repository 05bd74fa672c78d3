"""A stream task's keyed state, driven as in ``test_task``: snapshots at barriers (full,
incremental, canonical savepoints, on a real snapshot thread), restores, the keys that
travel with batches, and processing-time timers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from task_support import (
    MAX_P,
    Control,
    ListChannel,
    LogSink,
    Mark,
    add_pairs,
    barrier,
    chain_with,
    feed,
    finish_when_done,
    first_field,
    make_task,
    reduce_graph,
)

import epochstream as es
from epochstream.core.clock import ManualClock
from epochstream.core.events import END_OF_INPUT
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.messages import (
    AcknowledgeCheckpoint,
    FinishSlot,
    NotifyCheckpointComplete,
    TaskFinished,
)
from epochstream.runtime.operators import ReduceOperator
from epochstream.runtime.outputs import RecordWriter
from epochstream.runtime.snapshots import SnapshotExecutor
from epochstream.state.backends.base import KeyedBackendContext
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.handles import CanonicalSnapshotHandle, HeapSnapshotHandle, OperatorRestore

# ---------------------------------------------------------------- stream tasks: keyed state


def _restore_heap(handle: Any) -> dict[Any, Any]:
    backend = HeapStateBackend().create(
        KeyedBackendContext("reduce", 0, MAX_P, range(0, MAX_P), ManualClock(), "")
    )
    backend.restore([handle], checkpoint_id=1, owned=False)
    return dict(backend.value_table(ReduceOperator.STATE).items())


def test_keyed_snapshot_holds_the_state_at_the_barrier_and_restores_it(tmp_path: Path) -> None:
    sink = LogSink()
    graph = reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    reduce_uid, sink_uid = (op.uid for op in chain.operators)
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    feed(task, 0, [("a", 1), ("b", 2)], [("a", 3)], barrier(1), [("a", 10)], END_OF_INPUT)
    finish_when_done(control, task)
    task.run()

    assert sink.log == [
        ("a", 1),
        ("b", 2),
        ("a", 4),
        Mark("snapshot", 1),
        ("a", 14),
        Mark("end"),
    ]
    (ack,) = control.of(AcknowledgeCheckpoint)
    assert set(ack.states) == {reduce_uid, sink_uid}
    handle = ack.states[reduce_uid].keyed
    assert isinstance(handle, HeapSnapshotHandle)
    assert all(f.path.startswith(str(tmp_path / "ckpt" / "job")) for f in handle.chain)
    assert ack.states[sink_uid].union_lists == {"txns": []}
    assert ack.stats.state_size > handle.size > 0
    assert ack.stats.bytes_written == ack.stats.state_size, "a first snapshot writes it all"
    assert _restore_heap(handle) == {"a": ("a", 4), "b": ("b", 2)}

    # A new task restored from the acknowledged state goes on from the snapshot.
    sink2 = LogSink()
    graph2 = reduce_graph(sink2)
    control2 = Control()
    restored, _ = make_task(
        graph2,
        chain_with(graph2, "reduce"),
        tmp_path,
        control2,
        restore={reduce_uid: OperatorRestore(keyed=[handle], owned=True)},
        restored_checkpoint=1,
    )
    feed(restored, 0, [("a", 100), ("c", 1)], END_OF_INPUT)
    finish_when_done(control2, restored)
    restored.run()
    assert sink2.records == [("a", 104), ("c", 1)]


def test_a_keyed_head_takes_the_keys_that_travelled_with_the_batch(tmp_path: Path) -> None:
    sink = LogSink()
    graph = reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    # Keys that differ from what the selector (first_field) gives: the reduce groups by the
    # travelled ones, so it never ran the selector itself.
    feed(
        task,
        0,
        RowBatch([("a", 1), ("a", 2)], None, ["x", "y"]),
        RowBatch([("a", 10)], [7], ["x"]),
        END_OF_INPUT,
    )
    finish_when_done(control, task)
    task.run()
    assert task._keys_usable == [True]
    assert sink.records == [("a", 1), ("a", 2), ("a", 11)]


class _CountingKey:
    """A key selector that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, record: tuple[str, int]) -> str:
        self.calls += 1
        return record[0]


def test_the_key_selector_runs_once_per_record_from_writer_to_keyed_state(tmp_path: Path) -> None:
    selector = _CountingKey()
    sink = LogSink()
    env = es.Environment(parallelism=2, runner="local", batch_size=100)
    env.from_collection([]).key_by(selector).reduce(add_pairs).sink_to(sink)
    graph = env.job_graph("keyed-once")
    (edge,) = graph.edges
    channels = [ListChannel(), ListChannel()]
    writer = RecordWriter(
        list(channels), partitioning=edge.partitioning, max_parallelism=MAX_P, batch_size=100
    )
    records = [(f"k{i % 7}", i) for i in range(50)]
    writer.write(records)
    writer.broadcast_event(END_OF_INPUT)
    assert selector.calls == 50
    for subtask, channel in enumerate(channels):
        control = Control()
        task, _ = make_task(graph, chain_with(graph, "reduce"), tmp_path, control, subtask=subtask)
        # Upstream subtask 1 sent nothing but its end of input.
        feed(task, 0, *channel.items)
        feed(task, 1, END_OF_INPUT)
        finish_when_done(control, task)
        task.run()
    results = sink.records
    assert selector.calls == 50, "the reduce tasks used the keys that came with the records"
    expected: dict[str, int] = {}
    for key, value in records:
        expected[key] = expected.get(key, 0) + value
    final = {key: total for key, total in results}
    assert final == expected and len(results) == 50


def test_incremental_snapshot_writes_only_what_changed(tmp_path: Path) -> None:
    sink = LogSink()
    graph = reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    reduce_uid = chain.head.uid
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)

    def react(msg: Any) -> None:
        if isinstance(msg, AcknowledgeCheckpoint):  # the coordinator completes it at once
            task.gate.put_mail(NotifyCheckpointComplete(msg.checkpoint_id))
        elif isinstance(msg, TaskFinished):
            task.gate.put_mail(FinishSlot())

    control.react = react
    feed(task, 0, [("a", 1), ("b", 2)], barrier(1), barrier(2, base_checkpoint_id=1), END_OF_INPUT)
    task.run()

    first, second = control.of(AcknowledgeCheckpoint)
    assert Mark("complete", 1) in sink.log and Mark("complete", 2) in sink.log
    assert sink.log.index(Mark("complete", 1)) < sink.log.index(Mark("snapshot", 2))
    h1, h2 = first.states[reduce_uid].keyed, second.states[reduce_uid].keyed
    assert isinstance(h1, HeapSnapshotHandle) and isinstance(h2, HeapSnapshotHandle)
    assert h2.chain == h1.chain, "nothing changed: checkpoint 2 reuses checkpoint 1's file"
    assert second.stats.state_size == first.stats.state_size
    assert 0 < second.stats.bytes_written < second.stats.state_size


def test_savepoint_barrier_writes_keyed_state_in_the_canonical_format(tmp_path: Path) -> None:
    sink = LogSink()
    graph = reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    sp = str(tmp_path / "savepoints" / "savepoint-1")
    feed(task, 0, [("a", 1), ("a", 2)], barrier(3, savepoint_dir=sp), END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    (ack,) = control.of(AcknowledgeCheckpoint)
    handle = ack.states[chain.head.uid].keyed
    assert isinstance(handle, CanonicalSnapshotHandle)
    assert handle.path.startswith(sp) and os.path.exists(handle.path)
    assert _restore_heap(handle) == {"a": ("a", 3)}


def test_snapshot_thread_acknowledges_with_a_real_executor(tmp_path: Path) -> None:
    sink = LogSink()
    graph = reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    executor = SnapshotExecutor(name="test-task-snapshots")
    executor.start()
    task, _ = make_task(graph, chain, tmp_path, control, snapshots=executor)
    feed(task, 0, [("k", 1)], barrier(1), [("k", 1)], barrier(2), END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    executor.stop()
    acks = control.of(AcknowledgeCheckpoint)
    assert [a.checkpoint_id for a in acks] == [1, 2], "acknowledged in order, off the task thread"
    assert _restore_heap(acks[0].states[chain.head.uid].keyed) == {"k": ("k", 1)}
    assert _restore_heap(acks[1].states[chain.head.uid].keyed) == {"k": ("k", 2)}


def test_due_processing_time_timers_fire_between_input_items(tmp_path: Path) -> None:
    class RemindAtOnce(es.KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any, out: Any) -> None:
            ctx.timer_service().register_processing_time_timer(1)  # long past

        def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
            out.collect(("fired", ctx.current_key, timestamp))

    sink = LogSink()
    env = es.Environment(parallelism=1, runner="local")
    env.from_collection([]).key_by(first_field).process(RemindAtOnce()).sink_to(sink)
    graph = env.job_graph("timers")
    chain = chain_with(graph, "process")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    feed(task, 0, [("a", 0), ("b", 0)], END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    assert sink.log == [("fired", "a", 1), ("fired", "b", 1), Mark("end")]
