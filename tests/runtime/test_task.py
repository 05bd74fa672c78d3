"""A Task driven directly: a fake control sender, list channels, scripted mail, no slot.

Most tests run ``Task.run`` on the test's own thread. The fake job master (``Control``)
answers messages with mail (``TaskFinished`` -> ``FinishSlot``...), the synchronous
snapshot executor acknowledges inside the barrier, and sources pause at a chosen
record, so every interleaving is fixed by the script rather than by timing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

import epochstream as es
from epochstream.connectors.base import AtLeastOnceSinkWriter, Sink, SinkContext, SourceContext
from epochstream.connectors.generators import CollectionReader, CollectionSource, CollectionSplit
from epochstream.deploy.assignment import initial_splits
from epochstream.exceptions import CorruptStateError, UserFunctionError
from epochstream.graph.jobgraph import ChainSpec, JobGraph
from epochstream.runtime.batches import KeyedBatch, TimedBatch, split_item
from epochstream.runtime.channels import InputGate
from epochstream.runtime.clock import ManualClock
from epochstream.runtime.events import (
    END_OF_INPUT,
    MAX_WATERMARK,
    CheckpointBarrier,
    CheckpointOptions,
    EndOfInput,
    Watermark,
    WatermarkStatus,
)
from epochstream.runtime.messages import (
    AcknowledgeCheckpoint,
    AddSplits,
    DeclineCheckpoint,
    FinishSlot,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RequestSplit,
    SourceExhausted,
    TaskDeployment,
    TaskFailed,
    TaskFinished,
    TriggerCheckpoint,
)
from epochstream.runtime.operators import ReduceOperator
from epochstream.runtime.outputs import Channel, RecordWriter
from epochstream.runtime.snapshots import SnapshotExecutor
from epochstream.runtime.task import Task, TaskEnvironment
from epochstream.state.backends.base import KeyedBackendContext
from epochstream.state.backends.heap import HeapStateBackend
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    HeapSnapshotHandle,
    HeapStateFile,
    OperatorRestore,
)
from epochstream.state.keygroups import key_group_for_key

T = TypeVar("T")
MAX_P = 128

#: The watermark a task sends when its input ends: event time is complete.
END_OF_TIME = Watermark(MAX_WATERMARK)


# ---------------------------------------------------------------- fakes


class InlineSnapshots(SnapshotExecutor):
    """Synchronous snapshot executor: runs each job at once on the submitting thread."""

    def submit(self, job: Callable[[], None]) -> None:
        job()


class Control:
    """Fake ``TaskEnvironment.send``: records messages; ``react`` may answer with mail."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.react: Callable[[Any], None] | None = None

    def __call__(self, msg: Any) -> None:
        self.sent.append(msg)
        if self.react is not None:
            self.react(msg)

    def of(self, kind: type[T]) -> list[T]:
        return [m for m in self.sent if isinstance(m, kind)]

    def kinds(self) -> list[str]:
        return [type(m).__name__ for m in self.sent]


class ListChannel(Channel):
    """An output channel that keeps every batch and event it is sent."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def send(self, item: Any) -> None:
        self.items.append(item)

    @property
    def records(self) -> list[Any]:
        return [r for item in self.items if _is_batch(item) for r in split_item(item)[0]]

    @property
    def events(self) -> list[Any]:
        return [item for item in self.items if not _is_batch(item)]

    def records_between(self, after: int | None, before: int | None) -> list[Any]:
        """Records after barrier ``after`` (None: from the start) and before barrier ``before``."""
        out: list[Any] = []
        inside = after is None
        for item in self.items:
            if isinstance(item, CheckpointBarrier):
                if item.checkpoint_id == after:
                    inside = True
                elif item.checkpoint_id == before:
                    return out
            elif _is_batch(item) and inside:
                out.extend(split_item(item)[0])
        return out


def _is_batch(item: Any) -> bool:
    return isinstance(item, (list, TimedBatch, KeyedBatch))


@dataclass(frozen=True)
class Mark:
    """A sink-writer event in the log, between the records it wrote."""

    what: str
    checkpoint_id: int = 0


class LogSink(Sink):
    """Every writer appends its records and ``Mark``s (snapshot, complete, end) to ``log``."""

    def __init__(self, *, fail_snapshot: bool = False) -> None:
        self.log: list[Any] = []
        self.fail_snapshot = fail_snapshot

    def create_writer(self, ctx: SinkContext) -> LogWriter:
        return LogWriter(self)

    def records_before(self, what: str, checkpoint_id: int) -> list[Any]:
        return self.log[: self.log.index(Mark(what, checkpoint_id))]

    @property
    def records(self) -> list[Any]:
        return [r for r in self.log if not isinstance(r, Mark)]


class LogWriter(AtLeastOnceSinkWriter):
    def __init__(self, sink: LogSink) -> None:
        self.sink = sink

    def write_batch(self, records: list[Any]) -> None:
        self.sink.log.extend(records)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self.sink.fail_snapshot:
            raise RuntimeError("sink cannot pre-commit")
        self.sink.log.append(Mark("snapshot", checkpoint_id))
        return []

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.sink.log.append(Mark("complete", checkpoint_id))

    def end_input(self) -> None:
        self.sink.log.append(Mark("end"))


class PausingSource(CollectionSource):
    """A collection whose readers stop after ``pause_after`` records and call ``on_pause``
    (once) until ``resume()``; ``reads`` counts the records read after the pause."""

    def __init__(self, items: list[Any], pause_after: int) -> None:
        super().__init__(items)
        self.pause_after = pause_after
        self.resumed = False
        self.on_pause: Callable[[], None] = lambda: None
        self.read = 0

    def resume(self) -> None:
        self.resumed = True

    def create_reader(self, ctx: SourceContext) -> CollectionReader:
        return _PausingReader(self, ctx)


class _PausingReader(CollectionReader):
    def __init__(self, source: PausingSource, ctx: SourceContext) -> None:
        super().__init__(source.items, ctx.clock)
        self.source = source
        self._paused = False

    def poll(self, max_records: int) -> list[Any]:
        src = self.source
        if not src.resumed:
            left = src.pause_after - src.read
            if left <= 0:
                if not self._paused:
                    self._paused = True
                    src.on_pause()
                return []
            max_records = min(max_records, left)
        records = super().poll(max_records)
        src.read += len(records)
        return records


class MailWhenIdle(InputGate):
    """An input gate that, each time its task waits for mail only (``take(None)``), first
    hands it the next of ``mails``: the script's next step."""

    def __init__(self, num_channels: int, *mails: Any) -> None:
        super().__init__(num_channels, capacity=1_000)
        self.mails = list(mails)
        self.idle_waits = 0

    def take(self, timeout: float | None) -> tuple[int, Any] | None:
        if timeout is None:
            self.idle_waits += 1
            if self.mails:
                self.put_mail(self.mails.pop(0))
        return super().take(timeout)


# ---------------------------------------------------------------- building tasks


def chain_with(graph: JobGraph, kind: str) -> ChainSpec:
    """The chain whose head operator is of ``kind``."""
    return next(c for c in graph.chains if c.head.kind == kind)


def make_task(
    graph: JobGraph,
    chain: ChainSpec,
    tmp_path: Path,
    control: Control,
    *,
    subtask: int = 0,
    snapshots: SnapshotExecutor | None = None,
    exactly_once: bool = True,
    checkpointing: bool = True,
    restore: dict[str, OperatorRestore] | None = None,
    splits: list[Any] | None = None,
    restored_checkpoint: int | None = None,
    checkpoint_dir: str | None = None,
) -> tuple[Task, dict[int, list[ListChannel]]]:
    """A task of ``chain`` with list channels on every outgoing edge (by edge id)."""
    env = TaskEnvironment(
        job_id="job",
        attempt=0,
        checkpoint_dir=checkpoint_dir or str(tmp_path / "ckpt" / "job"),
        checkpointing=checkpointing,
        exactly_once=exactly_once,
        send=control,
        snapshots=snapshots or InlineSnapshots(),
        state_backend=HeapStateBackend(),
        local_dir=str(tmp_path / "local"),
    )
    deployment = TaskDeployment(
        chain_id=chain.chain_id,
        subtask=subtask,
        restore=restore or {},
        splits=splits,
        restored_checkpoint=restored_checkpoint,
    )
    task = Task(env, graph, chain, deployment)
    task.gate.capacity = 1_000  # a test queues all input up front
    outputs: dict[int, list[ListChannel]] = {}
    for edge in graph.outgoing(chain.chain_id):
        channels = [ListChannel() for _ in range(graph.parallelism)]
        task.writers[edge.edge_id] = RecordWriter(
            list(channels),
            partitioning=edge.partitioning,
            max_parallelism=graph.max_parallelism,
            batch_size=graph.batch_size,
            subtask_index=subtask,
        )
        outputs[edge.edge_id] = channels
    return task, outputs


def feed(task: Task, upstream: int, *items: Any) -> None:
    """Queue ``items`` on the channel from upstream subtask ``upstream`` of the first input."""
    edge = task.chain.inputs[0]
    channel = task.channel_index(edge.edge_id, upstream)
    for item in items:
        task.gate.put(channel, item)


def finish_when_done(control: Control, task: Task) -> None:
    """The fake job master's answer to ``TaskFinished``: ``FinishSlot``."""

    def react(msg: Any) -> None:
        if isinstance(msg, TaskFinished):
            task.gate.put_mail(FinishSlot())

    control.react = react


def barrier(n: int, **options: Any) -> CheckpointBarrier:
    return CheckpointBarrier(n, 1_000.0 + n, CheckpointOptions(**options))


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def _times_ten(i: int) -> int:
    return i * 10


def _mod2(i: int) -> int:
    return i % 2


def _first(t: tuple[Any, ...]) -> Any:
    return t[0]


def _add(a: Any, b: Any) -> Any:
    return a + b


def _add_pairs(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return (a[0], a[1] + b[1])


def _explode_on_13(i: int) -> int:
    if i == 13:
        raise ValueError("thirteen is unlucky")
    return i


# ---------------------------------------------------------------- source tasks


def _source_graph(source: CollectionSource, sink: LogSink) -> JobGraph:
    env = es.Environment(parallelism=2, runner="local", batch_size=3)
    env.from_source(source).map(_times_ten).key_by(_mod2).reduce(_add).sink_to(sink)
    return env.job_graph("source-test")


def test_source_task_checkpoints_its_position_and_forwards_the_barrier_after_its_records(
    tmp_path: Path,
) -> None:
    source = PausingSource(list(range(20)), pause_after=6)
    graph = _source_graph(source, LogSink())
    chain = chain_with(graph, "source")
    control = Control()
    splits = initial_splits(graph)[chain.chain_id][0]
    assert splits == [CollectionSplit("col-0", 0, 10, 0)]
    task, outputs = make_task(graph, chain, tmp_path, control, splits=splits)
    (channels,) = outputs.values()

    def pause() -> None:  # reached record 6: checkpoint 1 now, then read on
        task.gate.put_mail(TriggerCheckpoint(1, 1_001.0))
        source.resume()

    def react(msg: Any) -> None:  # the job master's side of a bounded source's end
        if isinstance(msg, SourceExhausted):
            task.gate.put_mail(TriggerCheckpoint(2, 1_002.0, final=True))
        elif isinstance(msg, TaskFinished):
            task.gate.put_mail(FinishSlot())

    source.on_pause = pause
    control.react = react
    task.run()

    assert control.kinds() == [
        "AcknowledgeCheckpoint",
        "SourceExhausted",
        "AcknowledgeCheckpoint",
        "TaskFinished",
    ]
    key = (chain.chain_id, 0)
    first, final = control.of(AcknowledgeCheckpoint)
    src_uid = chain.head.uid
    assert first.checkpoint_id == 1 and first.task == key
    assert set(first.states) == {src_uid}, "the chained map has no state to acknowledge"
    assert first.states[src_uid].operator_lists == {"splits": [CollectionSplit("col-0", 0, 10, 6)]}
    assert first.states[src_uid].keyed is None
    assert first.stats.bytes_written > 0
    assert first.stats.bytes_written == first.stats.state_size, "inline state is all written"
    assert final.checkpoint_id == 2
    assert final.states[src_uid].operator_lists == {"splits": []}, "every split is read"
    assert control.of(SourceExhausted) == [SourceExhausted(key)]

    for channel in channels:
        assert channel.events == [
            CheckpointBarrier(1, 1_001.0),
            END_OF_TIME,
            CheckpointBarrier(2, 1_002.0),
            END_OF_INPUT,
        ], "each barrier, the end of event time and of input go to every channel, in order"
    before = sorted(r for c in channels for r in c.records_between(None, 1))
    between = sorted(r for c in channels for r in c.records_between(1, 2))
    assert before == [i * 10 for i in range(6)], "records read before the trigger precede it"
    assert between == [i * 10 for i in range(6, 10)]
    assert [r for c in channels for r in c.records_between(2, None)] == []


def test_stop_with_savepoint_trigger_makes_the_source_read_nothing_more(tmp_path: Path) -> None:
    source = PausingSource(list(range(20)), pause_after=4)
    graph = _source_graph(source, LogSink())
    chain = chain_with(graph, "source")
    control = Control()
    task, outputs = make_task(
        graph, chain, tmp_path, control, splits=initial_splits(graph)[chain.chain_id][0]
    )
    # Once the task waits for mail only, the job master says: finish (stopped).
    gate = MailWhenIdle(0, FinishSlot(stopped=True))
    task.gate = gate
    options = CheckpointOptions(savepoint_dir=str(tmp_path / "sp"), terminate=True)

    def pause() -> None:
        task.gate.put_mail(TriggerCheckpoint(1, 1_001.0, options=options))
        source.resume()  # the reader has records again: only the suspension stops it

    source.on_pause = pause
    task.run()

    assert control.kinds() == ["AcknowledgeCheckpoint"], "no exhaustion, no end of input"
    (ack,) = control.of(AcknowledgeCheckpoint)
    assert ack.states[chain.head.uid].operator_lists == {
        "splits": [CollectionSplit("col-0", 0, 10, 4)]
    }
    assert source.read == 4, "nothing is read after the stop-with-savepoint barrier"
    assert gate.idle_waits >= 1
    (channels,) = outputs.values()
    for channel in channels:
        assert channel.events == [CheckpointBarrier(1, 1_001.0, options)]
    assert sorted(r for c in channels for r in c.records) == [0, 10, 20, 30]


def test_an_aborted_stop_with_savepoint_lets_the_source_read_on(tmp_path: Path) -> None:
    source = PausingSource(list(range(20)), pause_after=4)
    graph = _source_graph(source, LogSink())
    chain = chain_with(graph, "source")
    control = Control()
    task, outputs = make_task(
        graph, chain, tmp_path, control, splits=initial_splits(graph)[chain.chain_id][0]
    )
    # Idle after the trigger: the savepoint failed elsewhere. Idle again: the job ends.
    task.gate = MailWhenIdle(0, NotifyCheckpointAborted(1, "declined by a task"), FinishSlot())
    options = CheckpointOptions(savepoint_dir=str(tmp_path / "sp"), terminate=True)

    def pause() -> None:
        task.gate.put_mail(TriggerCheckpoint(1, 1_001.0, options=options))
        source.resume()

    source.on_pause = pause
    task.run()
    assert source.read == 10, "the job keeps running after a failed stop-with-savepoint"
    assert SourceExhausted((chain.chain_id, 0)) in control.sent
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [i * 10 for i in range(10)]


def test_source_without_checkpointing_ends_its_input_when_exhausted(tmp_path: Path) -> None:
    graph = _source_graph(CollectionSource(list(range(7))), LogSink())
    chain = chain_with(graph, "source")
    control = Control()
    task, outputs = make_task(
        graph,
        chain,
        tmp_path,
        control,
        checkpointing=False,
        splits=initial_splits(graph)[chain.chain_id][1],
        subtask=1,
    )

    def react(msg: Any) -> None:
        if isinstance(msg, TaskFinished):  # a late trigger is declined, then the slot ends
            task.gate.put_mail(TriggerCheckpoint(5, 0.0))
            task.gate.put_mail(FinishSlot())

    control.react = react
    task.run()
    key = (chain.chain_id, 1)
    assert control.sent == [
        SourceExhausted(key),
        TaskFinished(key),
        DeclineCheckpoint(5, key, "task already finished"),
    ]
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [30, 40, 50, 60]
    assert all(c.events == [END_OF_TIME, END_OF_INPUT] for c in channels)


def test_restored_source_reads_from_its_checkpointed_position(tmp_path: Path) -> None:
    graph = _source_graph(CollectionSource(list(range(20))), LogSink())
    chain = chain_with(graph, "source")
    control = Control()
    restore = {
        chain.head.uid: OperatorRestore(
            operator_lists={"splits": [CollectionSplit("col-1", 10, 20, 17)]}
        )
    }
    task, outputs = make_task(
        graph, chain, tmp_path, control, checkpointing=False, restore=restore, splits=None
    )
    finish_when_done(control, task)
    task.run()
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [170, 180, 190]


# ---------------------------------------------------------------- stream tasks: alignment


def _map_graph(fn: Callable[[int], Any] = _times_ten) -> JobGraph:
    """source -(rebalance)-> map -(hash)-> reduce -> sink, at parallelism 2."""
    env = es.Environment(parallelism=2, runner="local", batch_size=100)
    env.from_collection([]).rebalance().map(fn).key_by(_mod2).reduce(_add).sink_to(LogSink())
    return env.job_graph("map-test")


def _queue_unaligned_barriers(task: Task) -> None:
    # Channel 0 delivers barrier 1 early; records 2 and 5 come after it on their channels.
    feed(task, 0, [1], barrier(1), [2], END_OF_INPUT)
    feed(task, 1, [3], [4], barrier(1), [5], END_OF_INPUT)


def test_exactly_once_aligns_barriers_before_snapshotting(tmp_path: Path) -> None:
    graph = _map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control)
    _queue_unaligned_barriers(task)
    finish_when_done(control, task)
    task.run()

    (channels,) = outputs.values()
    before = sorted(r for c in channels for r in c.records_between(None, 1))
    after = sorted(r for c in channels for r in c.records_between(1, None))
    assert before == [10, 30, 40], "record 2 waited behind channel 0's barrier"
    assert after == [20, 50]
    for channel in channels:
        assert channel.events == [barrier(1), END_OF_TIME, END_OF_INPUT]
    assert control.kinds() == ["AcknowledgeCheckpoint", "TaskFinished"]
    assert control.of(AcknowledgeCheckpoint)[0].checkpoint_id == 1


def test_at_least_once_does_not_block_a_channel_that_delivered_its_barrier(
    tmp_path: Path,
) -> None:
    graph = _map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, exactly_once=False)
    _queue_unaligned_barriers(task)
    finish_when_done(control, task)
    task.run()
    (channels,) = outputs.values()
    before = sorted(r for c in channels for r in c.records_between(None, 1))
    assert 20 in before, "at-least-once reads on past the first barrier"
    assert sorted(r for c in channels for r in c.records) == [10, 20, 30, 40, 50]
    assert [m.checkpoint_id for m in control.of(AcknowledgeCheckpoint)] == [1]


def test_end_of_input_on_every_channel_is_forwarded_and_reported(tmp_path: Path) -> None:
    graph = _map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, subtask=1)
    feed(task, 0, [1, 2], END_OF_INPUT)
    feed(task, 1, END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    assert control.sent == [TaskFinished((chain.chain_id, 1))]
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [10, 20]
    for channel in channels:
        assert channel.items[-1] == END_OF_INPUT
        assert channel.events == [END_OF_TIME, END_OF_INPUT]


def test_an_aborted_alignment_unblocks_the_channel(tmp_path: Path) -> None:
    graph = _map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control)
    finish_when_done(control, task)
    thread = threading.Thread(target=task.run, name="task-under-test", daemon=True)
    thread.start()
    try:
        feed(task, 0, [1], barrier(1), [2])
        wait_for(lambda: task.barriers.blocked[0] and task.barriers.pending_checkpoint == 1)
        assert task.gate.has_input() is False, "record 2 waits behind the barrier"
        task.gate.put_mail(NotifyCheckpointAborted(1, "declined elsewhere"))
        wait_for(lambda: not task.barriers.blocked[0])
        feed(task, 1, [3], barrier(1), END_OF_INPUT)  # a stale barrier of the aborted one
        feed(task, 0, END_OF_INPUT)
        thread.join(10)
        assert not thread.is_alive()
    finally:
        task.gate.cancel()
        thread.join(10)
    assert control.kinds() == ["TaskFinished"], "the aborted checkpoint is never snapshotted"
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [10, 20, 30]
    assert all(barrier(1) not in c.items for c in channels)


# ---------------------------------------------------------------- stream tasks: keyed state


def _reduce_graph(sink: LogSink, parallelism: int = 1) -> JobGraph:
    """source -(hash)-> reduce -> sink."""
    env = es.Environment(parallelism=parallelism, runner="local", batch_size=100)
    env.from_collection([]).key_by(_first).reduce(_add_pairs).sink_to(sink)
    return env.job_graph("reduce-test")


def _restore_heap(handle: Any) -> dict[Any, Any]:
    backend = HeapStateBackend().create(
        KeyedBackendContext("reduce", 0, MAX_P, range(0, MAX_P), ManualClock(), "")
    )
    backend.restore([handle], checkpoint_id=1, owned=False)
    return dict(backend.value_table(ReduceOperator.STATE).items())


def test_keyed_snapshot_holds_the_state_at_the_barrier_and_restores_it(tmp_path: Path) -> None:
    sink = LogSink()
    graph = _reduce_graph(sink)
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
    graph2 = _reduce_graph(sink2)
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
    graph = _reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    # Keys that differ from what the selector (_first) gives: the reduce groups by the
    # travelled ones, so it never ran the selector itself.
    feed(
        task,
        0,
        KeyedBatch([("a", 1), ("a", 2)], ["x", "y"], None),
        KeyedBatch([("a", 10)], ["x"], [7]),
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
    env.from_collection([]).key_by(selector).reduce(_add_pairs).sink_to(sink)
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
    graph = _reduce_graph(sink)
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
    graph = _reduce_graph(sink)
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
    graph = _reduce_graph(sink)
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
    env.from_collection([]).key_by(_first).process(RemindAtOnce()).sink_to(sink)
    graph = env.job_graph("timers")
    chain = chain_with(graph, "process")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    feed(task, 0, [("a", 0), ("b", 0)], END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    assert sink.log == [("fired", "a", 1), ("fired", "b", 1), Mark("end")]


# ---------------------------------------------------------------- stream tasks: failures


def test_a_failing_synchronous_snapshot_declines_and_fails_the_task(tmp_path: Path) -> None:
    sink = LogSink(fail_snapshot=True)
    graph = _reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    feed(task, 0, [("a", 1)], barrier(4), END_OF_INPUT)
    task.run()
    key = (chain.chain_id, 0)
    assert control.kinds() == ["DeclineCheckpoint", "TaskFailed"]
    decline, failed = control.sent
    assert decline.checkpoint_id == 4 and decline.task == key
    assert "snapshot failed" in decline.reason and "sink cannot pre-commit" in decline.reason
    assert failed.task == key and "sink cannot pre-commit" in failed.description


def test_a_failing_asynchronous_snapshot_declines_and_the_task_goes_on(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "occupied"
    not_a_dir.write_text("a file where the checkpoint directory should be")
    sink = LogSink()
    graph = _reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control, checkpoint_dir=str(not_a_dir / "job"))
    feed(task, 0, [("a", 1)], barrier(1), [("a", 2)], END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    assert control.kinds() == ["DeclineCheckpoint", "TaskFinished"]
    decline = control.of(DeclineCheckpoint)[0]
    assert decline.checkpoint_id == 1 and "async snapshot failed" in decline.reason
    assert sink.records == [("a", 1), ("a", 3)]


def test_user_error_is_reported_naming_the_operator_and_record(tmp_path: Path) -> None:
    graph = _map_graph(_explode_on_13)
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, subtask=1)
    feed(task, 0, [11, 12], [13, 14], END_OF_INPUT)
    feed(task, 1, END_OF_INPUT)
    task.run()
    (failed,) = control.of(TaskFailed)
    assert control.sent == [failed]
    assert failed.task == (chain.chain_id, 1)
    assert failed.description.startswith("map(_explode_on_13) (2/2): UserFunctionError: ")
    assert "map(_explode_on_13) (2/2) failed on record 13" in failed.description
    assert "ValueError: thirteen is unlucky" in failed.description
    assert isinstance(failed.error, UserFunctionError)
    assert not failed.suppress_restarts and not failed.secondary
    assert "ValueError" in failed.traceback
    (channels,) = outputs.values()
    assert all(END_OF_INPUT not in c.items for c in channels)


def test_data_error_in_a_task_asks_for_no_restarts(tmp_path: Path) -> None:
    def reject(i: int) -> int:
        raise es.DataError(f"row {i} is malformed")

    graph = _map_graph(reject)
    control = Control()
    task, _ = make_task(graph, chain_with(graph, "map"), tmp_path, control)
    feed(task, 0, [7])
    task.run()
    (failed,) = control.of(TaskFailed)
    assert failed.suppress_restarts and "row 7 is malformed" in failed.description


def test_corrupt_state_on_restore_is_reported_with_the_restored_checkpoint(
    tmp_path: Path,
) -> None:
    graph = _reduce_graph(LogSink())
    chain = chain_with(graph, "reduce")
    reduce_uid = chain.head.uid
    missing = str(tmp_path / "ckpt" / "job" / "shared" / "7-gone.kst")
    kg = key_group_for_key("a", MAX_P)
    handle = HeapSnapshotHandle(
        range(0, MAX_P), (HeapStateFile(missing, True, {kg: (0, 64)}, 64),), {"_reduce": "value"}
    )
    control = Control()
    task, _ = make_task(
        graph,
        chain,
        tmp_path,
        control,
        restore={reduce_uid: OperatorRestore(keyed=[handle], owned=True)},
        restored_checkpoint=7,
    )
    task.run()  # fails while restoring: no input, no mail needed
    (failed,) = control.sent
    assert isinstance(failed, TaskFailed)
    assert isinstance(failed.error, CorruptStateError)
    assert failed.error.checkpoint_id == 7 and failed.error.path == missing
    assert f"restoring checkpoint 7 of operator {reduce_uid}" in failed.description


def test_unexpected_input_item_fails_the_task(tmp_path: Path) -> None:
    graph = _map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    feed(task, 0, "not a batch")
    task.run()
    (failed,) = control.of(TaskFailed)
    assert "unexpected item str on channel 0" in failed.description


def test_cancel_mail_stops_a_task_without_reporting(tmp_path: Path) -> None:
    from epochstream.runtime.messages import CancelSlot

    graph = _map_graph()
    control = Control()
    task, outputs = make_task(graph, chain_with(graph, "map"), tmp_path, control)
    feed(task, 0, [1])
    task.gate.put_mail(CancelSlot("failover"))
    task.run()
    assert control.sent == []
    (channels,) = outputs.values()
    assert all(not any(isinstance(i, EndOfInput) for i in c.items) for c in channels)


@pytest.mark.parametrize("stopped", [False, True])
def test_finish_before_the_input_ended_stops_the_task(
    tmp_path: Path, stopped: bool, caplog: pytest.LogCaptureFixture
) -> None:
    graph = _map_graph()
    control = Control()
    task, _ = make_task(graph, chain_with(graph, "map"), tmp_path, control)
    task.gate.put_mail(FinishSlot(stopped=stopped))
    task.run()
    assert control.sent == []
    warned = "asked to finish before its input ended" in caplog.text
    assert warned is not stopped


# ---------------------------------------------------------------- split discovery and notifications


class _NotedReader(CollectionReader):
    """A collection reader that records the checkpoint completions it hears."""

    def __init__(self, items: list[Any], ctx: SourceContext, completed: list[int]) -> None:
        super().__init__(items, ctx.clock)
        self.completed = completed

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)


class NotedSource(CollectionSource):
    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.completed: list[int] = []

    def create_reader(self, ctx: SourceContext) -> CollectionReader:
        return _NotedReader(self.items, ctx, self.completed)


def test_source_task_reads_added_splits_stores_enumerator_state_and_tells_the_reader(
    tmp_path: Path,
) -> None:
    source = NotedSource(list(range(6)))
    graph = _source_graph(source, LogSink())
    chain = chain_with(graph, "source")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, splits=[])
    (channels,) = outputs.values()
    # Mail in the order the job master sends it: a discovered split, then a trigger that
    # carries the enumerator's state as of that split, then the completion.
    task.gate.put_mail(AddSplits(chain.chain_id, 0, [CollectionSplit("late", 0, 6, 0)]))

    def react(msg: Any) -> None:
        if isinstance(msg, SourceExhausted):
            task.gate.put_mail(
                TriggerCheckpoint(1, 1_001.0, final=True, enumerators={chain.chain_id: ["late"]})
            )
        elif isinstance(msg, AcknowledgeCheckpoint):
            task.gate.put_mail(NotifyCheckpointComplete(1))
            task.gate.put_mail(FinishSlot())

    control.react = react
    task.run()

    (ack,) = control.of(AcknowledgeCheckpoint)
    assert ack.states[chain.head.uid].union_lists == {"enumerator": [["late"]]}
    assert sorted(r for c in channels for r in c.records) == [i * 10 for i in range(6)]
    assert source.completed == [1], "the reader hears the completed checkpoint"


class _HungryReader(CollectionReader):
    """An unbounded collection reader: when its splits are read it waits for more."""

    def __init__(self, source: HungrySource, ctx: SourceContext) -> None:
        super().__init__(source.items, ctx.clock)
        self.source = source

    @property
    def exhausted(self) -> bool:
        return False

    @property
    def needs_splits(self) -> bool:
        return not self._cursors

    def poll(self, max_records: int) -> list[Any]:
        records = super().poll(max_records)
        if not records:
            self.source.empty_polls += 1
            self.source.on_empty(self.source.empty_polls)
        return records


class HungrySource(CollectionSource):
    """Items read only through splits the test adds; ``on_empty`` hears each empty poll."""

    bounded = False

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.empty_polls = 0
        self.on_empty: Callable[[int], None] = lambda polls: None

    def create_reader(self, ctx: SourceContext) -> CollectionReader:
        return _HungryReader(self, ctx)


def test_a_source_without_splits_asks_once_each_time_its_reader_runs_out(tmp_path: Path) -> None:
    source = HungrySource(list(range(6)))
    graph = _source_graph(source, LogSink())
    chain = chain_with(graph, "source")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, splits=[])
    asked_before_the_split: list[int] = []

    def on_empty(polls: int) -> None:
        # Several empty polls pass before each step: a request is not repeated per poll.
        if polls == 5:
            asked_before_the_split.append(len(control.of(RequestSplit)))
            task.gate.put_mail(AddSplits(chain.chain_id, 0, [CollectionSplit("late", 0, 6, 0)]))
        elif polls == 10:
            task.gate.put_mail(FinishSlot(stopped=True))

    source.on_empty = on_empty
    task.run()

    key = (chain.chain_id, 0)
    assert asked_before_the_split == [1]
    assert control.of(RequestSplit) == [RequestSplit(*key)] * 2, "once more when the split was read"
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [i * 10 for i in range(6)]


def _event_time(record: int, previous: Any) -> int:
    return record * 1_000


def test_an_exhausted_source_sends_its_final_watermark_without_going_idle_first(
    tmp_path: Path,
) -> None:
    # Idleness just before the final watermark let a two-stage window job drop the
    # results of the slower upstream task (the stage passed ahead of them).
    env = es.Environment(parallelism=2, runner="local", batch_size=3)
    strategy = es.WatermarkStrategy.monotonous_timestamps().with_timestamp_assigner(_event_time)
    env.from_source(CollectionSource(list(range(7))), watermark_strategy=strategy).map(
        _times_ten
    ).key_by(_mod2).reduce(_add).sink_to(LogSink())
    graph = env.job_graph("idle-test")
    chain = chain_with(graph, "source")
    control = Control()
    task, outputs = make_task(
        graph,
        chain,
        tmp_path,
        control,
        checkpointing=False,
        splits=initial_splits(graph)[chain.chain_id][1],
        subtask=1,
    )
    finish_when_done(control, task)
    task.run()
    (channels,) = outputs.values()
    for channel in channels:
        assert not [e for e in channel.events if isinstance(e, WatermarkStatus)], channel.events
        assert channel.events[-2:] == [END_OF_TIME, END_OF_INPUT]
