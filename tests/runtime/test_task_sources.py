"""Source tasks, driven as in ``test_task``: checkpointed positions, stop-with-savepoint,
restores, splits added at run time, split requests, checkpoint notices to the reader and
the final watermark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from task_support import (
    END_OF_TIME,
    Control,
    LogSink,
    add,
    chain_with,
    finish_when_done,
    make_task,
    mod2,
    times_ten,
)

import epochstream as es
from epochstream.connectors.base import SourceContext
from epochstream.connectors.generators import CollectionReader, CollectionSource, CollectionSplit
from epochstream.core.events import (
    END_OF_INPUT,
    CheckpointBarrier,
    CheckpointOptions,
    WatermarkStatus,
)
from epochstream.deploy.assignment import initial_splits
from epochstream.graph.jobgraph import JobGraph
from epochstream.runtime.channels import InputGate
from epochstream.runtime.messages import (
    AcknowledgeCheckpoint,
    AddSplits,
    DeclineCheckpoint,
    FinishSlot,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RequestSplit,
    SourceExhausted,
    TaskFinished,
    TriggerCheckpoint,
)
from epochstream.state.handles import OperatorRestore

# ---------------------------------------------------------------- scripted sources


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


# ---------------------------------------------------------------- source tasks


def _source_graph(source: CollectionSource, sink: LogSink) -> JobGraph:
    env = es.Environment(parallelism=2, runner="local", batch_size=3)
    env.from_source(source).map(times_ten).key_by(mod2).reduce(add).sink_to(sink)
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
        times_ten
    ).key_by(mod2).reduce(add).sink_to(LogSink())
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
    # The task's metrics show the source's own watermark: the last one it sent on.
    assert task.metrics.head.watermark == END_OF_TIME.timestamp
